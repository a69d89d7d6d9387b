"""Image items, loaders and validation, and the synthetic scenes (no model needed)."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
from PIL import Image

from captionrl.domains.images import (
    ImageItem,
    load_easy_vqa,
    load_folder,
    load_hf_dataset,
    load_images,
    load_manifest,
    with_image,
)
from captionrl.domains.scenes import (
    COLOURS,
    POSITIONS,
    generate_scenes,
    make_scene,
)
from captionrl.errors import ConfigError, DataError


def _png(colour=(255, 0, 0), size=(16, 12)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "a.png").write_bytes(_png())
    (tmp_path / "a.txt").write_text("A red rectangle.\n\nA small red box.\n")
    (tmp_path / "b.png").write_bytes(_png((0, 0, 255)))
    (tmp_path / "b.json").write_text(json.dumps({"caption": "Blue.", "qa": [{"question": "colour?", "answer": "blue"}]}))
    (tmp_path / "notes.csv").write_text("x,y\n")
    return tmp_path


def test_folder_loads_images_and_sidecars(folder):
    got = load_folder(folder)
    assert [it.id for it in got] == ["a", "b"]
    assert got[0].references == ("A red rectangle.", "A small red box.")
    assert got[1].references == ("Blue.",) and got[1].qa[0]["answer"] == "blue"
    assert got[0].load().getpixel((0, 0)) == (255, 0, 0)
    assert got.ignored == ["notes.csv"]


def test_truncated_and_fake_images_raise_or_are_skipped(folder):
    data = _png()
    (folder / "c.png").write_bytes(data[: len(data) // 2])  # truncated
    (folder / "d.jpg").write_text("not an image")
    with pytest.raises(DataError) as exc:
        load_folder(folder)
    assert "image[c]" in str(exc.value) and "Fix:" in str(exc.value)
    got = load_folder(folder, on_error="skip")
    assert [it.id for it in got] == ["a", "b"]
    assert {s["item"] for s in got.skipped} == {"c", "d"}
    assert any("not an image" in s["error"] for s in got.skipped)
    with pytest.raises(ConfigError):
        load_folder(folder, on_error="ignore")  # type: ignore[arg-type]


def test_manifest_paths_bytes_and_errors(tmp_path):
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "x.png").write_bytes(_png())
    lines = [
        {"id": "x", "image": "img/x.png", "captions": ["red"]},
        {"id": "y", "image_bytes": base64.b64encode(_png((0, 255, 0))).decode(), "caption": "green"},
    ]
    man = tmp_path / "m.jsonl"
    man.write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    got = load_manifest(man)
    assert [it.references for it in got] == [("red",), ("green",)]
    assert got[1].load().getpixel((0, 0)) == (0, 255, 0)
    man.write_text(man.read_text() + "{broken\n")
    with pytest.raises(DataError, match=r"m.jsonl:3"):
        load_manifest(man)
    man.write_text(json.dumps(lines[0]) + "\n" + json.dumps(lines[0]) + "\n")
    with pytest.raises(DataError, match="repeats"):
        load_manifest(man)
    man.write_text(json.dumps({"id": "z", "image": "missing.png"}) + "\n")
    with pytest.raises(DataError, match="file not found"):
        load_manifest(man)
    assert len(load_manifest(man, on_error="skip")) == 0


def test_hf_dataset_columns_decoded_and_raw():
    import datasets

    rows = {"image": [_png(), _png((0, 0, 255))], "caption": ["red", ["blue", "a blue box"]]}
    raw = datasets.Dataset.from_dict({"image": [{"bytes": b, "path": None} for b in rows["image"]],
                                      "caption": [["red"], ["blue", "a blue box"]]},
                                     features=datasets.Features({"image": datasets.Image(decode=False),
                                                                 "caption": datasets.Sequence(datasets.Value("string"))}))
    got = load_hf_dataset(raw)
    assert got[1].references == ("blue", "a blue box")
    assert got[1].load().getpixel((0, 0)) == (0, 0, 255)
    decoded = raw.cast_column("image", datasets.Image())
    assert load_hf_dataset(decoded)[0].load().getpixel((0, 0)) == (255, 0, 0)
    with pytest.raises(ConfigError, match="not in the dataset"):
        load_hf_dataset(raw, caption_column="text")


def test_easy_vqa_offline_with_facts_consistent_with_answers():
    got = load_easy_vqa("test", limit=20)
    assert len(got) == 20 and got[0].load().size == (64, 64)
    with_facts = [it for it in got if len(it.facts) == 2]
    assert with_facts, "some easy-vqa images must have colour and shape answers"
    for it in with_facts:
        shape, colour = it.facts[0]["value"], it.facts[1]["value"]
        assert shape in it.references[0] and colour in it.references[0]
        for q in it.qa:  # every yes/no question about the shape agrees with the derived fact
            if q["question"] in (f"is there a {shape}?", f"does the image contain a {shape}?"):
                assert q["answer"] == "yes"


def test_skimage_photographs_if_installed():
    pytest.importorskip("skimage")
    got = load_images("skimage")
    assert len(got) >= 15
    astro = next(it for it in got if it.id == "skimage-astronaut")
    assert "astronaut" in astro.references[0].lower()


def test_scenes_are_deterministic_and_draw_their_facts():
    a, b = make_scene(3, seed=7), make_scene(3, seed=7)
    assert a.facts == b.facts
    assert np.array_equal(np.asarray(a.render()), np.asarray(b.render()))
    assert [s.facts for s in generate_scenes(6, seed=1)] != [s.facts for s in generate_scenes(6, seed=2)]
    for scene in generate_scenes(6, seed=0):
        px = np.asarray(scene.render()).reshape(-1, 3)
        cell = scene.size // 3
        arr = np.asarray(scene.render())
        for g in scene.groups:  # each group's colour appears in its own cell, in about `count` blobs
            col, row = POSITIONS[g.position]
            region = arr[row * cell : (row + 1) * cell, col * cell : (col + 1) * cell].reshape(-1, 3)
            hits = np.all(region == COLOURS[g.colour], axis=1).sum()
            assert hits > 20 * g.count, (scene.id, g)
        drawn = {tuple(int(v) for v in c) for c in np.unique(px, axis=0)} & set(COLOURS.values())
        assert drawn == {COLOURS[g.colour] for g in scene.groups}  # no colour that is not a fact


def test_contradicting_caption_alters_every_fact_and_qa_is_exact():
    for scene in generate_scenes(8, seed=0):
        ref, bad = scene.reference_caption, scene.contradicting_caption
        for f in scene.facts:
            value = str(f["value"]) if f["kind"] != "count" else None
            if value:
                assert value in ref
        assert ref != bad
        for q in scene.qa:
            assert q["options"][ord(q["answer"]) - ord("A")] == str(q["fact"]["value"])
            assert len(set(q["options"])) == 4


def test_image_caption_prompt_takes_the_items_image():
    from captionrl.domains.captioning import image_caption_messages
    from captionrl.domains.scenes import rubric_from_facts

    item = load_images("scenes:2:0")[0]
    prompt = image_caption_messages()
    assert prompt[0]["content"][0] == {"type": "image"}
    image = item.load()
    filled = with_image(prompt, image)
    assert filled[0]["content"][0]["image"] is image
    rubric = rubric_from_facts(item.facts)
    assert len(rubric) == len(item.facts) and all(r.weight in (1, 2, 3) for r in rubric)


def test_load_images_specs(tmp_path):
    got = load_images("scenes:3:5")
    assert [it.id for it in got] == ["scene-5-0", "scene-5-1", "scene-5-2"]
    assert isinstance(got[0], ImageItem) and got[0].facts
    with pytest.raises(ConfigError):
        load_images(str(tmp_path / "nothing-here"))
