"""Shared multi-role SFT (``train moco-sft``, ``train/moco_sft.py``) and SFT distillation (``train sft``,
``train/sft.py``): record linking, role prompts, and real training steps in which
every trainable parameter changes (full and LoRA), with resume. The steps train a tiny random SmolLM2-shaped
model (the embedded tokenizer and chat template, ``captionrl.testing.tiny_llama``): they check mechanics."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from captionrl.config import load_config
from captionrl.errors import ConfigError, DataError
from captionrl.judges.roles import GENERATOR_INSTRUCTION, JUDGE_INSTRUCTION, POLICY_INSTRUCTION
from captionrl.records import read_jsonl
from captionrl.train.moco_sft import MocoSFTConfig, RoleRecords, build_multirole_rows, demo_records
from captionrl.train.sft import SFTRunConfig, build_distill_rows


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_demo_records_are_true_to_easy_vqa() -> None:
    import easy_vqa

    recs = demo_records(4, seed=3)
    assert recs == demo_records(4, seed=3)  # seeded
    questions, answers, ids = easy_vqa.get_train_questions()
    for rub in recs.rubrics:
        iid = int(rub["image_id"].rsplit("-", 1)[1])
        truth = {a for q, a, i in zip(questions, answers, ids, strict=True) if i == iid and q.startswith("what")}
        good = next(c for c in recs.captions if c["caption_id"] == rub["image_id"] + "-a")
        assert all(word in good["caption"] for word in truth), (truth, good["caption"])
    # the faithful caption is judged yes/yes, the altered one has exactly one "no"
    for j in recs.judgments:
        nos = sum(d["decision"] == "no" for d in j["decisions"])
        assert nos == (0 if j["caption_id"].endswith("-a") else 1)


def test_multirole_rows_link_records_by_image_and_caption() -> None:
    recs = demo_records(2, seed=0)
    rows = build_multirole_rows(recs)
    by_role = {r: [x for x in rows if x["role"] == r] for r in ("policy", "generator", "judge")}
    assert [len(v) for v in by_role.values()] == [4, 2, 4]
    captions = {c["caption_id"]: c for c in recs.captions}
    for row in by_role["policy"]:
        text = row["prompt"][0]["content"]
        assert POLICY_INSTRUCTION in text and captions[row["caption_id"]]["image_text"] in text
        assert row["completion"][0]["content"] == captions[row["caption_id"]]["caption"]
    for row in by_role["generator"]:
        text = row["prompt"][0]["content"]
        assert text.count("Reference caption") == 2 and GENERATOR_INSTRUCTION in text
        for cid in row["candidate_ids"]:
            assert captions[cid]["image_id"] == row["image_id"] and captions[cid]["caption"] in text
        rubric = json.loads(row["completion"][0]["content"])
        assert [set(r) for r in rubric] == [{"criterion", "test", "weight"}] * 2
    for row in by_role["judge"]:
        text = row["prompt"][0]["content"]
        assert JUDGE_INSTRUCTION in text and "Image" not in text.split("Rubric:")[1]  # the Judge sees no image
        assert text.endswith(f"Caption: {captions[row['caption_id']]['caption']}")
        decisions = json.loads(row["completion"][0]["content"])
        assert [d["id"] for d in decisions] == [1, 2] and {d["decision"] for d in decisions} <= {"yes", "no"}


def test_candidates_are_drawn_with_the_seed_and_recorded() -> None:
    recs = demo_records(1, seed=0)
    extra = [{"image_id": recs.captions[0]["image_id"], "caption_id": f"x{i}", "caption": f"caption {i}"} for i in range(5)]
    recs.captions += extra
    del recs.rubrics[0]["candidate_ids"]
    a = next(r for r in build_multirole_rows(recs, n_candidates=4, seed=1) if r["role"] == "generator")
    b = next(r for r in build_multirole_rows(recs, n_candidates=4, seed=1) if r["role"] == "generator")
    c = next(r for r in build_multirole_rows(recs, n_candidates=4, seed=2) if r["role"] == "generator")
    assert len(a["candidate_ids"]) == 4 and a["candidate_ids"] == b["candidate_ids"] != c["candidate_ids"]


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda r: r.judgments[0].update(caption_id="nope"), "judgments[0].caption_id"),
        (lambda r: r.judgments[0]["decisions"].pop(), "judgments[0].decisions"),
        (lambda r: r.judgments[0]["decisions"][0].update(decision="maybe"), "judgments[0].decisions[0].decision"),
        (lambda r: r.judgments[0].update(image_id=r.rubrics[1]["image_id"]), "judgments[0].image_id"),
        (lambda r: r.rubrics[0].update(candidate_ids=[r.captions[-1]["caption_id"]]), "rubrics[0].candidate_ids"),
        (lambda r: r.rubrics[0].update(references=["only one"]), "rubrics[0].references"),
        (lambda r: r.rubrics[0]["rubric"][0].update(weight=0), "rubrics[0].rubric[0].weight"),
        (lambda r: r.captions.append(dict(r.captions[0])), "captions[4].caption_id"),
    ],
)
def test_broken_links_raise_data_errors(edit, field) -> None:
    recs = demo_records(2, seed=0)
    edit(recs)
    with pytest.raises(DataError) as exc:
        build_multirole_rows(recs)
    assert exc.value.field == field


def test_records_from_files_and_images_for_vlms(tmp_path) -> None:
    recs = demo_records(1, seed=0)
    loaded = RoleRecords.from_files(write_jsonl(tmp_path / "c.jsonl", recs.captions),
                                    write_jsonl(tmp_path / "r.jsonl", recs.rubrics),
                                    write_jsonl(tmp_path / "j.jsonl", recs.judgments))
    assert loaded == recs
    rows = build_multirole_rows(loaded, with_images=True)
    policy = next(r for r in rows if r["role"] == "policy")
    assert policy["prompt"][0]["content"][0] == {"type": "image"} and policy["images"][0].size == (64, 64)
    assert all(r["images"] == [] for r in rows if r["role"] == "judge")
    with pytest.raises(DataError, match="file not found"):
        RoleRecords.from_files(tmp_path / "missing.jsonl", tmp_path / "r.jsonl", tmp_path / "j.jsonl")


def test_distill_rows() -> None:
    rows = build_distill_rows([
        {"id": "a", "prompt": "Describe: 1, 2, 3", "caption": "It rises."},
        {"id": "b", "series": [1.0, 2.5, 2.0, 4.0], "caption": "It rises from 1 to 4."},
        {"id": "c", "prompt": [{"role": "user", "content": "hi"}], "caption": "hello"},
    ])
    assert [r["key"] for r in rows] == ["sft:a", "sft:b", "sft:c"]
    assert "1.00, 2.50, 2.00, 4.00" in rows[1]["prompt"][0]["content"]
    assert rows[1]["completion"][0]["content"] == "It rises from 1 to 4."
    with pytest.raises(DataError, match="cannot read images"):
        build_distill_rows([{"image": "x.png", "caption": "c"}])
    with pytest.raises(DataError, match="no prompt, series or image"):
        build_distill_rows([{"caption": "c"}])


def test_config_validation() -> None:
    with pytest.raises(ConfigError, match="needs caption, rubric and judgment"):
        load_config(MocoSFTConfig, None, [])
    with pytest.raises(ConfigError, match="teacher's captions"):
        load_config(SFTRunConfig, None, [])
    with pytest.raises(ConfigError):
        load_config(MocoSFTConfig, None, ["data.demo=true", "data.roles=[critic]"])
    with pytest.raises(ConfigError, match=r"data\.demo.*unknown setting"):  # each command has its own records
        load_config(SFTRunConfig, None, ["data.demo=true"])
    cfg = load_config(MocoSFTConfig, None, ["data.demo=true"])
    assert cfg.train.learning_rate == 1e-5 and cfg.train.lr_scheduler_type == "cosine"


def test_cli_check(capsys) -> None:
    from captionrl.cli import main

    assert main(["train", "moco-sft", "--check", "data.demo=true", "data.demo_images=3"]) == 0
    assert json.loads(capsys.readouterr().out) == {"policy": 6, "generator": 3, "judge": 6}


def _changed(model, before) -> tuple[list[str], list[str]]:
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    unchanged = [n for n in trainable if (model.get_parameter(n).detach() == before[n]).all()]
    return trainable, unchanged


@pytest.fixture(scope="module")
def tiny_policy(tiny_llama):
    """The tiny policy, loaded once: (model, tokenizer); each test trains a deep copy."""
    from captionrl.train.run.loading import load_policy
    from captionrl.train.run.sections import PolicyConfig

    model, tok, _ = load_policy(PolicyConfig(model=tiny_llama))
    return model, tok


@pytest.mark.slow
def test_full_multirole_sft_changes_every_parameter(tiny_policy, tmp_path) -> None:
    from captionrl.train.moco_sft import run

    base, tok = tiny_policy
    model = copy.deepcopy(base)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = load_config(MocoSFTConfig, None, [
        "data.demo=true", "data.demo_images=1", f"train.out_dir={tmp_path}", "train.max_steps=2",
        "train.per_device_train_batch_size=1", "train.max_length=320", "train.report_to=[]",
        "train.logging_steps=1", "train.save_steps=2", "train.learning_rate=0.0001",
    ])
    result = run(cfg, model=model, processing=tok)
    assert result["steps"] == 2 and result["rows"] == {"policy": 2, "generator": 1, "judge": 2}
    trainable, unchanged = _changed(result["trainer"].model, before)
    assert len(trainable) == len(before) and not unchanged, unchanged[:5]
    assert {r["role"] for r in read_jsonl(tmp_path / "data.jsonl")} == {"policy", "generator", "judge"}
    assert (tmp_path / "model" / "config.json").exists() and (tmp_path / "checkpoints" / "checkpoint-2").is_dir()
    summary = json.loads((tmp_path / "sft_summary.json").read_text())
    assert summary["recipe"] == "moco-sft" and summary["train_loss"] > 0


@pytest.mark.slow
def test_lora_sft_changes_every_adapter_weight_and_resumes(tiny_policy, tmp_path) -> None:
    from captionrl.train.moco_sft import run

    base, tok = tiny_policy
    base_before = {n: p.detach().clone() for n, p in base.named_parameters()}
    # captions-only rows keep the prompts short; the roles are the same code path
    args = ["data.demo=true", "data.demo_images=2", "data.roles=[policy]", f"train.out_dir={tmp_path}",
            "train.per_device_train_batch_size=1", "train.max_length=160", "train.report_to=[]",
            "train.logging_steps=1", "train.save_steps=2", "train.learning_rate=0.001",
            "policy.lora=true", "policy.lora_r=2", "policy.lora_target_modules=[q_proj,v_proj]"]
    from transformers import TrainerCallback

    start: dict = {}

    class Snapshot(TrainerCallback):  # the adapter's initial values, as TRL built it
        def on_train_begin(self, args, state, control, model=None, **kw):
            start.update({n: p.detach().clone() for n, p in model.named_parameters()})

    cfg = load_config(MocoSFTConfig, None, [*args, "train.max_steps=2"])
    result = run(cfg, model=copy.deepcopy(base), processing=tok,
                 callbacks=[Snapshot()])
    peft_model = result["trainer"].model
    trainable, unchanged = _changed(peft_model, start)
    assert trainable and all("lora_" in n for n in trainable)
    # LoRA starts with B = 0, so A gets no gradient in step 1: both must have moved after two steps
    assert not unchanged, unchanged[:5]
    for n, p in peft_model.named_parameters():
        if not p.requires_grad:
            key = n.replace("base_model.model.", "", 1).replace(".base_layer", "")
            assert (p == base_before[key]).all(), n
    # rerunning with the same folder resumes from checkpoint-2 and trains only the missing step
    cfg3 = load_config(MocoSFTConfig, None, [*args, "train.max_steps=3"])
    again = run(cfg3, model=copy.deepcopy(base), processing=tok)
    assert again["resumed_from"].endswith("checkpoint-2") and again["steps"] == 3
    losses = [h["step"] for h in again["log_history"] if "loss" in h]
    assert losses == [1, 2, 3]  # steps 1-2 come from the checkpoint's history, step 3 is new
    with pytest.raises(ConfigError, match="different config"):
        run(load_config(MocoSFTConfig, None, [*args, "train.max_steps=3", "train.learning_rate=0.01"]))
