"""Rehearsal of MoCo Rubric's paper path on CPU (README "The papers' paths" and docs/paper-paths.md, steps
1-4), every model role played by a tiny randomly initialised Qwen3-VL (the paper's family: real processor,
chat template, TRL collation), in process, nothing scripted and nothing served:

1. ``captionrl moco records``: the tiny model is caption teacher, rubric writer and judge teacher of real
   PNG images (scenes written by the command), its rubric and judgment replies decoded under their JSON
   schemas (``backends.structured``) and read by the recipe's own parsers;
2. ``captionrl train moco-sft`` on those records: the shared multi-role SFT;
3. ``captionrl train moco`` with ``configs/moco-paper.yaml`` on the SFT checkpoint (models and sizes
   replaced; its one-GPU form, ``policy.lora=true``, as docs/gpu.md launches it: the preset itself trains
   every parameter, as §4.1 does): 2 GRPO steps in which the *momentum* LoRA adapter
   (``momentum.implementation: auto``) writes each group's rubric from the image and judges every caption
   against it in the paper's generate mode, both under their schemas, and the EMA moves that adapter;
4. evaluation: the run's own held-out check (CIDEr-D of greedy captions) and a pairwise comparison of the
   trained and the initial captioner in both orders.

An observer wraps the momentum role server only to record, per request, the role, the backend's name and
the adapter active on the model at the moment of the call, and the replies; it changes nothing served.
Budgets are set so a complete reply always fits (every token of plain schema text carries >= 1 character),
so a random model's reply can only fail the parsers' rules beyond the schema (a repeated criterion), which
the Generator's sampled retry handles, as it would for a real model.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest

from captionrl.config import load_config
from captionrl.records import read_jsonl
from presets import ON_CPU

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

ITEMS, MAX_CHARS, REASON_CHARS = 2, 160, 100
RUBRIC_TOKENS = ITEMS * (2 * MAX_CHARS + 48) + 2  # the longest reply rubric_schema(2, 2) allows, in characters
JUDGE_TOKENS = ITEMS * (REASON_CHARS + 48) + 2  # the longest judgment_schema(2) reply
TINY = {"kind": "hf", "model": "tiny-qwen3-vl", "dtype": "float32", "batch_size": 8}


class Observer:
    """Wraps the momentum role server and records every role request (it serves what it was given)."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def wrap(self, momentum_roles):
        observer = self

        class Recording:
            def __init__(self, role, backend) -> None:
                self.role, self.backend, self.name = role, backend, backend.name

            def generate(self, requests):
                adapter = self.backend.model.active_adapter  # the weights switched on for this very call
                gens = self.backend.generate(requests)
                for r, g in zip(requests, gens, strict=True):
                    observer.calls.append({"role": self.role, "backend": self.name, "adapter": adapter,
                                           "schema": r.json_schema, "text": g.text, "finish": g.finish_reason})
                return gens

            def __getattr__(self, name):
                return getattr(self.backend, name)

        @contextlib.contextmanager
        def serve(role):
            with momentum_roles(role) as backend:
                yield Recording(role, backend)

        return serve


def _score(rubric, reply):
    """The rubric reward's formula, from the Judge's raw reply: sum(w * yes) / sum(w)."""
    decisions = [d["decision"] == "yes" for d in json.loads(reply)]
    weights = [r["weight"] for r in rubric]
    return sum(w for w, d in zip(weights, decisions, strict=True) if d) / sum(weights)


def test_moco_paper_path_with_the_momentum_model_in_every_role(tmp_path, monkeypatch):
    from captionrl.eval.pairwise import PairwiseEvalConfig
    from captionrl.eval.pairwise import run as pairwise_run
    from captionrl.judges.ngram import CiderD
    from captionrl.judges.online_rubric import parse_generator_reply
    from captionrl.judges.rubric import parse_judge_reply
    from captionrl.train import moco
    from captionrl.train.image_checks import greedy_captions
    from captionrl.train.moco_records import MocoRecordsConfig, build_records
    from captionrl.train.moco_sft import MocoSFTConfig
    from captionrl.train.moco_sft import run as sft_run
    from captionrl.train.run import loading, sections
    from captionrl.train.run.curves import load_metrics

    monkeypatch.chdir(tmp_path)
    data = [f"data.n_train={ITEMS}", "data.source=scenes", "data.image_size=96", "data.max_groups=1", "data.scene_seed=0"]

    # 1. records: the tiny model in process as teacher, writer and judge
    rec_cfg = load_config(MocoRecordsConfig, None, [
        "out_dir=records", *data, f"teachers=[{json.dumps(TINY)}]", f"writer={json.dumps(TINY)}",
        "samples=2", "n_candidates=2", "min_items=2", f"max_items={ITEMS}", "max_attempts=3", "image_text=none",
        "caption_max_new_tokens=24", f"writer_max_new_tokens={RUBRIC_TOKENS}", f"judge_max_new_tokens={JUDGE_TOKENS}"])
    rec = build_records(rec_cfg)
    counts, rejected = rec["records"], rec["rejected_this_run"]
    assert counts["captions"] == 2 * ITEMS, rec
    assert counts["rubrics"] == ITEMS and rejected.get("rubric", 0) == 0, rec  # every image got a parsed rubric
    assert counts["judgments"] == 2 * ITEMS and rejected.get("judgment", 0) == 0, rec  # every caption judged
    for r in read_jsonl(Path("records/rubrics.jsonl")):
        assert all(json.loads(raw) is not None for raw in r["raws"])  # every attempt is schema-valid JSON
        assert parse_generator_reply(r["raws"][-1], 2, ITEMS)[0].to_dict() == r["rubric"][0]
    caps = list(read_jsonl(Path("records/captions.jsonl")))
    assert all(Path(c["image"]).read_bytes()[:4] == b"\x89PNG" for c in caps)

    # 2. shared multi-role SFT of a tiny Qwen3-VL on the records (images loaded from the PNGs)
    sft_cfg = load_config(MocoSFTConfig, None, [
        "policy.model=tiny-qwen3-vl", "policy.dtype=float32",
        "data.captions=records/captions.jsonl", "data.rubrics=records/rubrics.jsonl",
        "data.judgments=records/judgments.jsonl", "train.out_dir=sft", "train.max_steps=2",
        "train.per_device_train_batch_size=2", "train.max_length=2048", "train.report_to=[]", "train.save_steps=2",
        "train.logging_steps=1", "train.learning_rate=0.001", "train.use_cpu=true", "train.bf16=false",
        "train.gradient_checkpointing=false"])
    sft = sft_run(sft_cfg)
    assert sft["rows"] == {"policy": 2 * ITEMS, "generator": ITEMS, "judge": 2 * ITEMS}
    assert sft["steps"] == 2 and sft["train_loss"] > 0 and Path(sft["model"], "config.json").is_file()

    # 3. MoCo Rubric with the paper config on the SFT checkpoint: the momentum adapter writes and judges
    observer = Observer()
    cfg = load_config(moco.CONFIG, ROOT / "configs" / "moco-paper.yaml", [
        f"policy.model={sft['model']}", "policy.dtype=float32", "policy.lora=true", "policy.lora_r=4",
        "policy.lora_alpha=8", *data, "data.mix=[]", "train.num_generations=4", "train.per_device_train_batch_size=4",
        "train.gradient_accumulation_steps=1", "train.max_completion_length=8", "train.max_steps=2",
        "train.save_steps=2", "train.report_to=[]", "train.threads=1", *ON_CPU,
        "train.gradient_checkpointing=false", "train.learning_rate=0.001", "train.out_dir=moco",
        "train.warmup_steps=0",  # §4.1's 5% warm-up of 2 steps is 1 step at rate 0: nothing would move in step 1
        "rubric.min_items=2", f"rubric.max_items={ITEMS}", f"rubric.max_new_tokens={RUBRIC_TOKENS}",
        f"judge.max_new_tokens={JUDGE_TOKENS}",
        # A greedy Judge with near-random weights answers every caption alike (all "yes": no advantage, no
        # update); sampling its reply (seeds recorded) gives the groups unequal scores, so GRPO moves.
        "judge.temperature=1.0",
        # Likewise a greedy random Generator writes the same criterion twice (a parser rule beyond the schema,
        # answered by a sampled retry); sampling its first attempt too, every rubric it writes parses.
        "rubric.temperature=1.0",
        # tests/test_moco_preflight.py runs the preflight; here it would only add minutes of generation.
        "train.preflight_items=0"])
    assert (cfg.judge.mode, cfg.rubric.fallback, cfg.momentum.m, cfg.momentum.variant) == (  # the paper's
        "generate", "none", 0.99, "joint")
    result = moco.run(cfg, wrap_roles=observer.wrap)
    assert result["momentum"]["implementation"] == "LoraAdapterMomentum" and result["momentum"]["updates"] == 2

    # Every role request was served by the momentum adapter, under its schema.
    gen_calls = [c for c in observer.calls if c["role"] == "generator"]
    judge_calls = [c for c in observer.calls if c["role"] == "judge"]
    assert gen_calls and judge_calls
    assert {(c["backend"], c["adapter"]) for c in observer.calls} == {("momentum:adapter=momentum", "momentum")}
    assert all(c["schema"] is not None and c["schema"]["maxItems"] == ITEMS for c in gen_calls)
    assert all(c["schema"] is not None and len(c["schema"]["prefixItems"]) == ITEMS for c in judge_calls)
    assert all(c["finish"] == "stop" for c in observer.calls), "every reply completed within its budget"
    assert all(isinstance(json.loads(c["text"]), list) for c in observer.calls), "every reply is schema-valid JSON"

    # Each group was scored with a rubric the momentum model wrote; every caption was judged.
    groups = list(read_jsonl(Path("moco/rubrics.rank0.jsonl")))
    assert [g["step"] for g in groups] == [0, 1]
    assert sum(g["attempts"] for g in groups) == len(gen_calls)
    assert all(g["attempts"] == 1 and not g["errors"] for g in groups), "every rubric the momentum model wrote parsed"
    for g in groups:
        assert g["source"] == "generator:momentum:adapter=momentum" and g["rubric"] is not None
        assert [r.to_dict() for r in parse_generator_reply(g["raws"][-1], 2, ITEMS)] == g["rubric"]
        assert len(g["scores"]) == 4 and all(s is not None for s in g["scores"])
    replies = [c["text"] for c in judge_calls]
    assert len(replies) == 4 * len(groups)
    for k, g in enumerate(groups):
        for j, s in enumerate(g["scores"]):
            reply = replies[4 * k + j]
            parse_judge_reply(reply, ITEMS)
            assert s == pytest.approx(_score(g["rubric"], reply))

    # GRPO moved the Policy where a group's scores differed; the EMA trails it.
    metrics = [m for m in load_metrics(Path("moco/metrics.jsonl")) if "reward" in m]
    assert [m["step"] for m in metrics] == [1, 2]
    for m, g in zip(metrics, groups, strict=True):
        assert m["reward"] == pytest.approx(np.mean(g["scores"]), abs=1e-6)
        assert m["rubric/generator_valid_frac"] == 1.0 and m["rubric/unscored_groups_frac"] == 0.0
        if len(set(g["scores"])) > 1:
            assert m["momentum/policy_to_initial"] > 0 and m["momentum/distance"] > 0
            assert m["momentum/momentum_to_initial"] < m["momentum/policy_to_initial"]
        else:
            assert m["frac_reward_zero_std"] == 1.0
    assert any(len(set(g["scores"])) > 1 for g in groups), f"no group had unequal scores: {groups}"

    # 4a. the run's own held-out check: CIDEr-D of the trained Policy's greedy captions, recomputed
    checks = json.loads(Path("moco/eval/final_checks.json").read_text())
    trained = next(r for r in checks["rows"] if r["system"] == "trained")
    assert trained["n"] == ITEMS and "cider_d" in checks["held_out"]
    rows = moco.build_rows(cfg)
    refs = {r["item_id"]: r["references"] for r in rows}
    cider = CiderD().fit([list(v) for v in refs.values()])
    ex = checks["examples"]
    assert trained["cider_d"] == pytest.approx(np.mean([cider.score(ex[i], refs[i]) for i in ex]), abs=1e-4)
    assert trained["length_chars"] == pytest.approx(np.mean([len(c) for c in ex.values()]), abs=0.05)

    # 4b. pairwise: trained vs initial captioner, both orders, judged by the SFT model (letter probabilities)
    def caption_file(name, model_path, adapter=None):
        policy = sections.PolicyConfig(model=model_path, dtype="float32", lora=False)
        model, processing, _ = loading.load_policy(policy)
        if adapter:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
        caps, _ = greedy_captions(model, processing, rows, 24, name)
        path = Path(f"{name}.jsonl")
        path.write_text("".join(json.dumps({"id": i, "caption": c, "reference": refs[i][0]}) + "\n" for i, c in caps.items()))
        return f"{name}={path}"

    systems = [caption_file("trained", sft["model"], result["model"]), caption_file("initial", sft["model"])]
    pw = pairwise_run(PairwiseEvalConfig(captions=systems, baseline="initial", judge=f"hf:{sft['model']},dtype=float32",
                                         mode="choose", out="pairwise"))
    records = list(read_jsonl(Path("pairwise/records.jsonl")))
    assert len(records) == 2 * ITEMS and {r["order"] for r in records} == {1, 2}
    for item in refs:
        orders = {r["order"]: r for r in records if r["id"] == item}
        assert (orders[1]["system_a"], orders[2]["system_a"]) == ("trained", "initial")  # both orders
    assert all(r["valid"] and r["method"] == "logits" for r in records)
    for r in records:  # each verdict is the judge's likeliest letter, credited to the system shown in that slot
        top = max(r["probs"], key=r["probs"].get)
        assert r["decision"] == ("tie" if top == "C" else top), r
        assert r["winner"] == {"A": r["system_a"], "B": r["system_b"], "C": "tie"}[top], r
    row = next(r for r in pw.rows if r["system"] == "trained")
    wins = sum(r["winner"] == "trained" for r in records)
    ties = sum(r["winner"] == "tie" for r in records)
    assert (row["wins"], row["ties"], row["losses"]) == (wins, ties, len(records) - wins - ties)
    assert row["win_rate"] == pytest.approx((wins + ties / 2) / len(records))
    assert row["caparena"] == row["wins"] - row["losses"]
