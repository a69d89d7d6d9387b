"""Image data for RubiCap and MoCo: every layout loads from a local copy written here
with real PNG/JPEG files; every bad input (missing image, corrupt image, missing references, wrong layout,
too few items) ends in a named error or a counted skip; one-step RubiCap and MoCo runs train on a manifest
of real image files and report the skipped image in result.json."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from PIL import Image

from captionrl.cli import main as cli_main
from captionrl.config import load_config
from captionrl.domains.image_data import ImageDataConfig, load_image_items
from captionrl.domains.image_layouts import url_key
from captionrl.errors import ConfigError, DataError
from captionrl.train.moco import MocoConfig, build_rows
from captionrl.train.rubicap import RubicapConfig

ROOT = Path(__file__).resolve().parents[1]
COLOURS = [(200, 30, 30), (30, 160, 40), (40, 60, 210), (230, 200, 20), (120, 40, 160)]


def picture(path: Path, i: int = 0, fmt: str | None = None) -> Path:
    """A small real image file (PNG or JPEG by suffix): a coloured square on white."""
    path.parent.mkdir(parents=True, exist_ok=True)
    im = Image.new("RGB", (32, 24), "white")
    im.paste(COLOURS[i % len(COLOURS)], (4 + i, 4, 20 + i, 20))
    im.save(path, format=fmt)
    return path


def close(a: tuple[int, ...], b: tuple[int, ...], tol: int = 8) -> bool:
    return all(abs(x - y) <= tol for x, y in zip(a, b, strict=True))


def jpeg_bytes(i: int = 0) -> bytes:
    buf = io.BytesIO()
    im = Image.new("RGB", (32, 24), COLOURS[i % len(COLOURS)])
    im.save(buf, format="JPEG")
    return buf.getvalue()


def truncated_jpeg(path: Path) -> Path:
    """A JPEG cut in half: it opens (the header is fine) but does not decode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = jpeg_bytes(3)
    path.write_bytes(data[: len(data) // 2])
    return path


def write_jsonl(path: Path, rows: list[object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def cfg(source: str, path: Path | str = "", **kw: object) -> ImageDataConfig:
    return ImageDataConfig(source=source, path=str(path), **kw)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- layouts
def test_pixmocap_parquet_with_url_named_images_and_embedded_bytes(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path / "pixmo-cap"
    urls = ["https://cdn.example.com/a/b/0001.jpg?x=1", "https://img.example.org/photo7.png"]
    picture(root / "images" / f"{url_key(urls[0])}.jpg", 0)  # saved under sha256(url), as documented
    picture(root / "images" / "photo7.png", 1)  # or under the URL's own file name
    (root / "data").mkdir(parents=True)
    pq.write_table(pa.table({
        "image_url": urls, "caption": ["A red square on white.", "A green square, slightly right."],
        "transcripts": [["um a red square", "red box in the corner"], ["green thing"]],
    }), root / "data" / "train-00000-of-00001.parquet")
    got = load_image_items(cfg("pixmocap", root))
    assert len(got.items) == 2 and got.skipped == []
    a, b = got.items
    assert a.references == ("A red square on white.", "um a red square", "red box in the corner")
    assert a.id == f"pixmocap-{url_key(urls[0])[:16]}" and a.meta["image_url"] == urls[0]
    assert close(a.load().getpixel((10, 10)), COLOURS[0]) and b.load().getpixel((11, 10)) == COLOURS[1]  # JPEG is lossy

    embedded = tmp_path / "pixmo-cap-images"  # image-carrying re-uploads: an HF Image struct {bytes, path}
    (embedded / "data").mkdir(parents=True)
    pq.write_table(pa.table({
        "image": [{"bytes": jpeg_bytes(2), "path": None}], "image_url": ["https://x.org/q.jpg"],
        "caption": ["A blue picture."], "transcripts": [["blue", "all blue"]],
    }), embedded / "data" / "train-00000-of-00001.parquet")
    item = load_image_items(cfg("pixmocap", embedded, min_references=2)).items[0]
    assert isinstance(item.image, bytes) and len(item.references) == 3


def test_densefusion_jsonl_with_images_beside_its_folder(tmp_path):
    root = tmp_path / "DenseFusion-1M"
    picture(root / "images" / "sa_0001" / "x1.jpg", 0)
    picture(root / "images" / "sa_0002" / "x2.png", 1)
    rows = write_jsonl(root / "DenseFusion-4V-100k" / "DenseFusion-4V-100k.jsonl", [
        {"image_id": "x1", "image_path": "sa_0001/x1.jpg", "url": "http://a/x1.jpg", "caption": "A dense caption one."},
        {"image_id": "x2", "image_path": "sa_0002/x2.png", "url": "http://a/x2.png", "caption": "A dense caption two."},
    ])
    got = load_image_items(cfg("densefusion", rows))
    assert [it.id for it in got.items] == ["x1", "x2"]
    assert [it.references for it in got.items] == [("A dense caption one.",), ("A dense caption two.",)]
    with pytest.raises(DataError, match="missing references: has 1") as err:  # MoCo needs two: named, with the fix
        load_image_items(cfg("densefusion", rows, min_references=2))
    assert "DenseFusion-4V-100k.jsonl:1" in str(err.value) and "on_bad_image: skip" in err.value.fix


def test_coco_captions_many_references_per_image(tmp_path):
    root = tmp_path / "coco"
    picture(root / "val2017" / "000000000139.jpg", 0)
    picture(root / "val2017" / "000000000285.jpg", 1)
    anns = [{"id": k, "image_id": 139, "caption": f"Caption {k} of image 139."} for k in range(5)]
    anns.append({"id": 9, "image_id": 285, "caption": "A green square."})
    (root / "annotations").mkdir()
    (root / "annotations" / "captions_val2017.json").write_text(json.dumps({
        "info": {}, "images": [{"id": 139, "file_name": "000000000139.jpg"}, {"id": 285, "file_name": "000000000285.jpg"}],
        "annotations": anns}))
    got = load_image_items(cfg("coco", root, split="val"))
    by_id = {it.id: it for it in got.items}
    assert len(by_id["139"].references) == 5 and by_id["285"].references == ("A green square.",)
    skip2 = load_image_items(cfg("coco", root, split="val", min_references=2, on_bad_image="skip"))
    assert [it.id for it in skip2.items] == ["139"] and skip2.counts() == {"missing references": 1}
    assert "image 285" in skip2.skipped[0]["where"]


def test_manifest_jsonl_csv_and_folder_take_any_number_of_references(tmp_path):
    picture(tmp_path / "imgs" / "a.png", 0)
    picture(tmp_path / "imgs" / "b.jpg", 1)
    j = write_jsonl(tmp_path / "m.jsonl", [
        {"id": "a", "image": "imgs/a.png", "captions": ["one", "two", "three"]},
        {"id": "b", "image": "imgs/b.jpg", "caption": "only one", "split": "train"},
        {"id": "c", "image": "imgs/missing.png", "caption": "held out", "split": "test"},  # other split: not read
    ])
    got = load_image_items(cfg("manifest", j))
    assert [(it.id, len(it.references)) for it in got.items] == [("a", 3), ("b", 1)] and got.read == 2
    c = tmp_path / "m.csv"
    c.write_text('image,caption,caption_2,reference3\nimgs/a.png,first,second,third\nimgs/b.jpg,"just, one",,\n')
    got = load_image_items(cfg("manifest", c))
    assert [it.references for it in got.items] == [("first", "second", "third"), ("just, one",)]
    (tmp_path / "imgs" / "a.txt").write_text("sidecar one\nsidecar two\n")
    (tmp_path / "imgs" / "b.json").write_text(json.dumps({"captions": ["json one"]}))
    got = load_image_items(cfg("manifest", tmp_path / "imgs"))
    assert {it.id: it.references for it in got.items} == {"a": ("sidecar one", "sidecar two"), "b": ("json one",)}

    import datasets  # a datasets.save_to_disk folder with an Image column: embedded bytes, decoded once here

    ds = datasets.Dataset.from_dict({"image": [str(tmp_path / "imgs" / "a.png")], "captions": [["x", "y"]]})
    ds.cast_column("image", datasets.Image()).save_to_disk(str(tmp_path / "saved"))
    got = load_image_items(cfg("manifest", tmp_path / "saved", min_references=2))
    assert got.items[0].references == ("x", "y") and got.items[0].load().getpixel((10, 10)) == COLOURS[0]


def test_scenes_and_seeded_sample(tmp_path):
    got = load_image_items(cfg("scenes", n=3, scene_count=10, image_size=96), seed=4)
    again = load_image_items(cfg("scenes", n=3, scene_count=10, image_size=96), seed=4)
    other = load_image_items(cfg("scenes", n=3, scene_count=10, image_size=96), seed=5)
    assert [it.id for it in got.items] == [it.id for it in again.items] != [it.id for it in other.items]
    assert all(len(it.references) == 2 and it.facts for it in got.items)


# ---------------------------------------------------------------------- the bad-input matrix
def _manifest_with(tmp_path: Path, bad_row: object) -> Path:
    for i in range(3):
        picture(tmp_path / f"ok{i}.png", i)
    rows = [{"id": f"ok{i}", "image": f"ok{i}.png", "captions": ["a caption", "another"]} for i in range(3)]
    return write_jsonl(tmp_path / "m.jsonl", [rows[0], bad_row, *rows[1:]])


BAD = {
    "missing image": ({"id": "x", "image": "gone.png", "captions": ["c", "d"]}, "missing image", "m.jsonl:2"),
    "corrupt image": ({"id": "x", "image": "half.jpg", "captions": ["c", "d"]}, "corrupt image", "m.jsonl:2"),
    "not an image": ({"id": "x", "image": "notes.png", "captions": ["c", "d"]}, "corrupt image", "m.jsonl:2"),
    "missing references": ({"id": "x", "image": "ok0.png", "captions": ["only one"]}, "missing references", "m.jsonl:2"),
    "row without image": ({"id": "x", "captions": ["c", "d"]}, "bad row", "m.jsonl:2"),
    "malformed line": ('{"id": "x", "image": ', "bad row", "m.jsonl:2"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_a_named_error_or_a_counted_skip(tmp_path, case):
    row, reason, where = BAD[case]
    truncated_jpeg(tmp_path / "half.jpg")
    (tmp_path / "notes.png").write_text("this is not a picture")
    m = _manifest_with(tmp_path, row)
    with pytest.raises(DataError) as err:
        load_image_items(cfg("manifest", m, min_references=2))
    assert err.value.field == where and reason in err.value.problem and err.value.fix
    got = load_image_items(cfg("manifest", m, min_references=2, on_bad_image="skip"))
    assert [it.id for it in got.items] == ["ok0", "ok1", "ok2"]
    assert got.counts() == {reason: 1} and got.summary()["skipped"] == 1 and got.skipped[0]["where"] == where


def test_wrong_layout_fails_even_when_skipping(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "p" / "data").mkdir(parents=True)
    pq.write_table(pa.table({"image_url": ["https://a/b.jpg"], "text": ["no caption column"]}),
                   tmp_path / "p" / "data" / "train-0.parquet")
    with pytest.raises(DataError, match=r"not a PixMo-Cap file.*caption") as err:
        load_image_items(cfg("pixmocap", tmp_path / "p", on_bad_image="skip"))
    assert "train-0.parquet" in err.value.field
    coco = tmp_path / "c.json"
    coco.write_text(json.dumps({"images": []}))
    with pytest.raises(DataError, match="not a COCO captions file"):
        load_image_items(cfg("coco", coco, on_bad_image="skip"))
    with pytest.raises(DataError, match="source: coco"):  # a COCO file given as DenseFusion rows
        load_image_items(cfg("densefusion", coco, on_bad_image="skip"))
    with pytest.raises(ConfigError) as cerr:
        load_image_items(cfg("densefusion", tmp_path / "nope.jsonl"))
    assert cerr.value.field == "data.path"
    with pytest.raises(ConfigError, match="needs its path"):
        cfg("pixmocap")


def test_more_items_than_usable_names_the_numbers(tmp_path):
    truncated_jpeg(tmp_path / "half.jpg")
    m = _manifest_with(tmp_path, {"id": "x", "image": "half.jpg", "captions": ["c", "d"]})
    with pytest.raises(DataError) as err:
        load_image_items(cfg("manifest", m, n=4, on_bad_image="skip"))
    assert err.value.field == "data.n" and "asks for 4 items but only 3 usable" in err.value.problem
    assert "1 skipped" in err.value.problem and "data.n: 3" in err.value.fix
    assert len(load_image_items(cfg("manifest", m, n=2, on_bad_image="skip")).items) == 2


# ---------------------------------------------------------------------- the recipes' config sections
def test_recipe_sections_share_the_loader(tmp_path):
    moco = load_config(MocoConfig, ROOT / "configs" / "moco-paper.yaml")
    assert (moco.data.source, moco.data.min_references) == ("pixmocap", 2)
    with pytest.raises(ConfigError) as err:
        load_config(MocoConfig, ROOT / "configs" / "moco-cpu.yaml", ["data.min_references=1"])
    assert err.value.field == "data.min_references"
    rub = load_config(RubicapConfig, ROOT / "configs" / "rubicap-paper.yaml")
    assert (rub.data.source, rub.data.n, rub.data.on_bad_image) == ("pixmocap", 50000, "skip")
    old = load_config(RubicapConfig, ROOT / "configs" / "rubicap-paper.yaml", ["data.items=scenes:3:1", "data.on_error=raise"])
    assert (old.data.source, old.data.scene_count, old.data.scene_seed, old.data.n, old.data.on_bad_image) == (
        "scenes", 3, 1, None, "error")
    picture(tmp_path / "a.png", 0)
    m = write_jsonl(tmp_path / "m.jsonl", [{"id": "a", "image": "a.png", "captions": ["one", "two", "three"]}])
    rows = build_rows(load_config(MocoConfig, ROOT / "configs" / "moco-cpu.yaml",
                                  ["data.source=manifest", f"data.path={m}", "data.n=null"]))
    assert rows[0]["references"] == ["one", "two"] and rows[0]["image"] == str(tmp_path / "a.png")


def test_moco_check_reports_skipped_images_without_models(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CAPTIONRL_FORBID_MODEL_CALLS", "1")
    truncated_jpeg(tmp_path / "half.jpg")
    m = _manifest_with(tmp_path, {"id": "x", "image": "half.jpg", "captions": ["c", "d"]})
    assert cli_main(["train", "moco", "--config", str(ROOT / "configs" / "moco-cpu.yaml"), "data.source=manifest",
                     f"data.path={m}", "data.n=null", "data.on_bad_image=skip", "--check"]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert got["train_items"] == 3 and got["images"]["skipped_by_reason"] == {"corrupt image": 1}


# ---------------------------------------------------------------------- one step of each recipe on real files
def scene_manifest(tmp_path: Path, n: int = 2) -> Path:
    """PNG files of synthetic scenes with their facts and two references, plus one corrupt JPEG row."""
    from captionrl.domains.scenes import generate_scenes, second_reference

    rows: list[object] = []
    for s in generate_scenes(n, seed=3, size=96):
        s.render().save(tmp_path / f"{s.id}.png")
        rows.append({"id": s.id, "image": f"{s.id}.png", "captions": [s.reference_caption, second_reference(s)],
                     "facts": s.facts})
    truncated_jpeg(tmp_path / "broken.jpg")
    rows.append({"id": "broken", "image": "broken.jpg", "captions": ["x", "y"]})
    return write_jsonl(tmp_path / "scenes.jsonl", rows)


ONE_STEP = ["train.num_generations=2", "train.per_device_train_batch_size=2", "train.max_completion_length=8",
            "train.max_steps=1", "train.save_steps=1", "train.report_to=[]", "train.threads=1"]


@pytest.mark.slow
def test_rubicap_one_step_on_a_manifest_of_image_files(tmp_path, embedded_backend):
    from captionrl.train import rubicap

    m = scene_manifest(tmp_path)
    out = tmp_path / "run"
    cfg = load_config(RubicapConfig, ROOT / "configs" / "rubicap-cpu.yaml", [
        "data.source=manifest", f"data.path={m}", "data.on_bad_image=skip", "rubrics.source=facts",
        *ONE_STEP, "train.preflight_items=0", f"train.out_dir={out}",
        "policy.model=tiny-qwen2.5-vl"])  # image loading, not captioning: the 2-layer random VLM policy
    res = rubicap.run(cfg, judge_backend=embedded_backend)
    assert res["steps"] == 1 and res["items"] == 2
    saved = json.loads((out / "result.json").read_text())
    assert saved["images"]["skipped_by_reason"] == {"corrupt image": 1} and saved["images"]["loaded"] == 2


@pytest.mark.long  # image manifests through a recipe: the RubiCap test above in the default tier
@pytest.mark.slow
def test_moco_one_step_on_a_manifest_of_image_files(tmp_path):
    from captionrl.records import read_jsonl
    from captionrl.train import moco

    m = scene_manifest(tmp_path)
    out = tmp_path / "run"
    cfg = load_config(MocoConfig, ROOT / "configs" / "moco-cpu.yaml", [
        "data.source=manifest", f"data.path={m}", "data.n=null", "data.on_bad_image=skip", *ONE_STEP,
        "rubric.max_new_tokens=16", "rubric.max_attempts=1", f"train.out_dir={out}"])
    res = moco.run(cfg)
    assert res["steps"] == 1 and res["images"]["skipped_by_reason"] == {"corrupt image": 1}
    groups = list(read_jsonl(out / "rubrics.rank0.jsonl"))
    ids = {json.loads(line)["id"] for line in m.read_text().splitlines()} - {"broken"}
    assert groups and {g["item_id"] for g in groups} <= ids, "groups are the manifest's readable images"
    assert json.loads((out / "result.json").read_text())["images"]["loaded"] == 2


# ---------------------------------------------------------------------- mixed sources
def test_mix_joins_sources_each_with_its_own_count():
    """MoCo §4.1's equal mix, shown with two scene families: each source its own n, ids kept apart."""
    cfg = ImageDataConfig(source="scenes", n=3, scene_count=3, mix=[{"source": "scenes", "scene_seed": 1, "n": 2, "scene_count": 2}])
    result = load_image_items(cfg)
    assert [it.id for it in result.items] == ["scene-0-0", "scene-0-1", "scene-0-2", "scene-1-0", "scene-1-1"]
    assert result.source == "scenes + scenes" and result.read == 5


def test_mix_entries_are_checked_on_load():
    with pytest.raises(ConfigError) as err:
        ImageDataConfig(source="scenes", mix=[{"source": "scenes", "min_references": 3}])
    assert err.value.field == "data.mix[0].min_references"
    with pytest.raises(ConfigError) as err:
        ImageDataConfig(source="scenes", mix=[{"source": "pixmocap"}])  # a local source needs its path
    assert err.value.field == "data.mix[0].path"
    with pytest.raises(DataError, match="both"):  # the same images twice
        load_image_items(ImageDataConfig(source="scenes", n=2, scene_count=2, mix=[{"source": "scenes", "n": 2, "scene_count": 2}]))
