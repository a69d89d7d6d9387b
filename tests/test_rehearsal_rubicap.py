"""Rehearsal of RubiCap's paper path on CPU (README "The papers' paths" and docs/paper-paths.md, steps 1-4):

``configs/rubicap-paper.yaml`` with its models replaced: the Policy is a tiny randomly initialised
Qwen2.5-VL (the paper's family: real processor, chat template, TRL collation); the committee teacher, the
rubric writer and the judge are the embedded SmolLM2 served over HTTP by llama.cpp (where the paper serves
its open models). The images are PNG files the test writes, listed in a JSONL manifest with two reference
captions and questions each. Steps: committee captions -> writer -> rubric store (``--build-rubrics``),
2 GRPO steps on the store, then captions of the trained and the initial Policy, compared pairwise by the
HTTP judge and scored by caption-based QA with the HTTP answerer.

Language-only teachers read each image's references in place of the image (``rubrics.image_text``), and
the writer's reply is constrained to the rubric schema by the server (``rubrics.structured_output``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from captionrl.config import load_config
from captionrl.records import read_jsonl
from presets import ON_CPU

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _write_images(folder: Path, n: int) -> tuple[Path, Path]:
    """PNG files, a manifest {id, image, references, qa} and a QA file {id, question, options, answer}."""
    from captionrl.domains.scenes import generate_scenes, second_reference

    folder.mkdir(parents=True)
    manifest, qa = folder / "manifest.jsonl", folder / "qa.jsonl"
    with manifest.open("w") as m, qa.open("w") as q:
        for s in generate_scenes(n, 0, size=96, max_groups=1):
            s.render().save(folder / f"{s.id}.png")
            m.write(json.dumps({"id": s.id, "image": f"{s.id}.png",
                                "references": [s.reference_caption, second_reference(s)]}) + "\n")
            for j, item in enumerate(s.qa[:2]):
                q.write(json.dumps({"id": s.id, "qid": str(j), **{k: item[k] for k in ("question", "options", "answer")}}) + "\n")
    return manifest, qa


def _captions(backend, manifest: Path, out: Path) -> Path:
    """One greedy caption per manifest image, as a caption file of the eval protocols."""
    from captionrl.backends.base import ChatRequest
    from captionrl.domains.captioning import image_caption_messages
    from captionrl.domains.images import load_manifest, with_image

    items = list(load_manifest(manifest))
    gens = backend.generate([ChatRequest(with_image(image_caption_messages(), it.load()), max_new_tokens=12)
                             for it in items])
    with out.open("w") as f:
        for it, g in zip(items, gens, strict=True):
            assert g.error is None, g.error
            f.write(json.dumps({"id": it.id, "caption": g.text or "", "reference": it.references[0]}) + "\n")
    return out


def test_rubicap_paper_path_committee_writer_store_grpo_eval(tmp_path, llama_server, monkeypatch):
    from captionrl.backends.hf import HFBackend
    from captionrl.eval import pairwise, qa
    from captionrl.train import rubicap
    from captionrl.train.rubicap import RubicapConfig
    from captionrl.train.run.curves import load_metrics

    monkeypatch.chdir(tmp_path)
    manifest, qa_file = _write_images(tmp_path / "images", 2)
    url, name = llama_server.base_url, llama_server.model  # llama.cpp serves the model under its file path
    server = {"kind": "openai", "model": name, "base_url": url, "timeout_s": 120}
    overrides = [
        "policy.model=tiny-qwen2.5-vl", "policy.dtype=float32", f"judge.base_url={url}", f"judge.model={name}",
        f"data.items={manifest}", f"rubrics.committee=[{json.dumps(server)}]", f"rubrics.writer={json.dumps(server)}",
        f"rubrics.student={json.dumps(server)}",  # the paper serves the student Policy; SmolLM2 stands in
        "rubrics.image_text=references", "rubrics.structured_output=json_object", "rubrics.max_attempts=2", "rubrics.min_items=2", "rubrics.max_items=3",
        "rubrics.caption_max_new_tokens=40", "rubrics.writer_max_new_tokens=250", "reward.rubric.max_new_tokens=160", "reward.rubric.structured_output=json_object",
        "train.num_generations=2", "train.per_device_train_batch_size=2", "train.gradient_accumulation_steps=1",
        "train.max_completion_length=8", "train.max_steps=2", "train.save_steps=2", "train.report_to=[]",
        "train.threads=1", *ON_CPU, "train.out_dir=run",
        "train.preflight_items=1",  # the reward preflight on one item (8 in the config)
        "train.force_preflight=true",  # SmolLM2 cannot judge well; the preflight says so and is overridden
    ]
    paper = load_config(RubicapConfig, ROOT / "configs" / "rubicap-paper.yaml")
    assert len(paper.rubrics.committee) == 5 and paper.reward.rubric.mode == "generate"

    # 1. committee -> writer -> store (the paper's one-process --build-rubrics step)
    cfg = load_config(RubicapConfig, ROOT / "configs" / "rubicap-paper.yaml", [*overrides, "build_rubrics=true"])
    assert rubicap.run_command(cfg) == 0
    committee = list(read_jsonl(Path("run/rubrics/committee.jsonl")))
    assert len(committee) == 2 and all(c["caption"] for c in committee)
    store = {r["item_id"]: r for r in read_jsonl(Path("run/rubrics/rubrics.jsonl"))}
    assert len(store) == 2, "every item has a store record: a rubric, or None with the writer's errors"
    assert all(r["rubric"] or r["error"] for r in store.values())
    assert any(r["rubric"] for r in store.values()), store

    # 2. two GRPO steps on the store (the training launch builds nothing)
    cfg = load_config(RubicapConfig, ROOT / "configs" / "rubicap-paper.yaml", [*overrides, "rubrics.missing=skip"])
    assert (cfg.train.loss_type, cfg.train.beta, cfg.reward.rubric.mode) == ("grpo", 0.04, "generate")
    result = rubicap.run(cfg)
    metrics = load_metrics(Path("run/metrics.jsonl"))
    assert [m["step"] for m in metrics[:2]] == [1, 2] and all("kl" in m for m in metrics[:2])
    # the schema-constrained generate-mode judge scores captions (a reply that still fails is None, never 0)
    assert any(m["rubric/unscored_frac"] < 1.0 for m in metrics[:2]), metrics
    assert len(list(read_jsonl(Path("run/rubrics/committee.jsonl")))) == 2, "the store was reused, not rebuilt"

    # 3. evaluation: trained vs initial captioner, pairwise (HTTP judge) and caption-QA (HTTP answerer)
    trained = _captions(HFBackend(result["model"], dtype="float32"), manifest, tmp_path / "trained.jsonl")
    initial = _captions(HFBackend("tiny-qwen2.5-vl", dtype="float32"), manifest, tmp_path / "initial.jsonl")
    systems = [f"trained={trained}", f"initial={initial}"]
    pw = pairwise.run(load_config(pairwise.CONFIG, None, [
        f"captions={json.dumps(systems)}", "baseline=initial", "mode=choose", f"judge=openai:{url}#{name}",
        f"out={tmp_path / 'pairwise'}"]))
    comps = list(read_jsonl(tmp_path / "pairwise" / "records.jsonl"))
    assert len(comps) == 2 * 2 and {c["order"] for c in comps} == {1, 2}  # both orders of both images
    assert (tmp_path / "pairwise" / "summary.json").is_file()
    valid = [c for c in comps if c["valid"]]
    assert valid, comps
    for c in valid:  # each verdict is the judge's likeliest letter, credited to the system shown in that slot
        top = max(c["probs"], key=c["probs"].get)
        assert c["decision"] == ("tie" if top == "C" else top), c
        assert c["winner"] == {"A": c["system_a"], "B": c["system_b"], "C": "tie"}[top], c
    row = next(r for r in pw.rows if r["system"] == "trained")
    wins, ties = sum(c["winner"] == "trained" for c in valid), sum(c["winner"] == "tie" for c in valid)
    assert (row["wins"], row["ties"], row["losses"]) == (wins, ties, len(valid) - wins - ties)
    qa.run(load_config(qa.CONFIG, None, [
        f"captions={json.dumps(systems)}", f"qa=[\"scenes={qa_file}\"]", f"answerer=openai:{url}#{name}",
        f"out={tmp_path / 'qa'}"]))
    answers = list(read_jsonl(tmp_path / "qa" / "records.jsonl"))
    n_questions = len(list(read_jsonl(qa_file)))
    assert len(answers) == 2 * n_questions and (tmp_path / "qa" / "table.md").is_file()
