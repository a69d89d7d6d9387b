"""DeepSpeed ZeRO-2 and ZeRO-3 rehearsed on 2 CPU processes: the multi-GPU launches of the paper
presets, with tiny randomly initialised models of the papers' families and everything in-process.

Each recipe runs 2 steps with a checkpoint per step, then its final checks (on rank 0; under ZeRO-3 on
the weights every rank gathered). Then a resume: checkpoint-2 and the final model are deleted and the same
command resumes from checkpoint-1; the redone step 2 must reproduce the first run's checkpoint-2 (the
restored state is the saved state: weights, optimizer, data order, per-rank RNG, and MoCo's momentum).
Asserted as well: the trainable parameters moved, both ranks produced and scored captions, every rank
exited 0, the loss pass computed each group's prompt once (``train/run/shared_prefix.py``; RubiCap with gradient
checkpointing on, as its paper preset trains), and for MoCo that the momentum moved by the float32 EMA of the
gathered Policy parameters.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from deepspeed_launch import STAGES, launch, max_difference, moved_fraction, requires_deepspeed, weights

QWEN25, QWEN3 = "tiny-qwen2.5-vl", "tiny-qwen3-vl"  # the papers' policy families, random weights, built offline

STEPS = ["train.max_steps=2", "train.save_steps=1", "train.save_total_limit=null", "train.report_to=[]",
         "train.threads=1", "train.learning_rate=1.0e-3", "train.preflight_items=1", "train.force_preflight=true"]
RECIPES = {
    # LineupRL (Qwen2.5-VL reading charts, RLOO), the verifier a tiny model in likelihood mode
    "lineup": ("lineup-cpu.yaml", QWEN25, [
        f"policy.model={QWEN25}", "policy.input=chart", "policy.dtype=float32", "verifier.kind=hf", "warm_start.epochs=0", "train.freeze_layers=0", "train.beta=0.0",
        f"verifier.model={QWEN25}", "verifier.dtype=float32", "reward.mode=likelihood", "data.window=8",
        "data.n_train=4", "data.n_val=1", "data.n_test=1", "data.series=[nile,sunspots]", "reward.k=2",
        "train.num_generations=2", "train.per_device_train_batch_size=2", "train.max_completion_length=6",
        "eval.bottleneck=false"]),
    # RubiCap (Qwen2.5-VL, full fine-tune, GRPO), fact rubrics judged by a tiny model in likelihood mode
    "rubicap": ("rubicap-cpu.yaml", QWEN25, [
        f"policy.model={QWEN25}", "policy.dtype=float32", "judge.kind=hf", f"judge.model={QWEN25}",
        "judge.dtype=float32", "data.scene_count=4", "train.num_generations=2",
        "train.per_device_train_batch_size=2", "train.max_completion_length=6",
        "train.gradient_checkpointing=true"]),  # as configs/rubicap-paper.yaml trains
    # MoCo Rubric (Qwen3-VL, LoRA, GRPO), the momentum adapter writing and judging the rubrics
    "moco": ("moco-cpu.yaml", QWEN3, [
        f"policy.model={QWEN3}", "data.n=4", "train.num_generations=2", "train.per_device_train_batch_size=2",
        "rubric.n_candidates=2", "rubric.max_new_tokens=8", "train.max_completion_length=6"]),
}
M = 0.99  # configs/moco-cpu.yaml's momentum.m (H=1: one EMA update per step)


def _initial(model: str) -> dict:
    from captionrl.tiny_models import tiny_qwen_vl_dir

    return weights(tiny_qwen_vl_dir(model.removeprefix("tiny-")))


def _momentum(ckpt: Path) -> dict[str, torch.Tensor]:
    blob = torch.load(ckpt / "momentum.pt", map_location="cpu", weights_only=False)
    return {k: v.float() for k, v in blob["slots"]["ema"].items()}


def _adapter_name(name: str) -> str:
    """A momentum pair's Policy parameter as PEFT saves it (``...lora_A.default.weight`` -> ``...lora_A.weight``)."""
    return name.replace(".default.", ".")


def _check_momentum(out: Path) -> None:
    """phi_2 = m * phi_1 + (1 - m) * theta_2 over every momentum parameter, theta_2 the saved (gathered)
    Policy adapter of checkpoint-2: the EMA rule on the full tensors, whatever ZeRO sharded."""
    ck1, ck2 = out / "checkpoints" / "checkpoint-1", out / "checkpoints" / "checkpoint-2"
    phi1, phi2, theta2 = _momentum(ck1), _momentum(ck2), weights(ck2)
    assert phi1.keys() == phi2.keys() and len(phi1) > 0
    worst = 0.0
    for name in phi2:
        theta = theta2[_adapter_name(name)]
        assert theta.shape == phi2[name].shape and theta.numel() > 0, name  # gathered, not an empty shard
        worst = max(worst, float((phi2[name] - (M * phi1[name] + (1 - M) * theta)).abs().max()))
    assert worst < 1e-6, worst
    assert max(float((phi2[n] - phi1[n]).abs().max()) for n in phi2) > 0  # and it did move


# The long tier: the other stage of each recipe. The default tier runs each recipe once, under its paper preset's
# stage (LineupRL ZeRO-2, RubiCap ZeRO-3) and MoCo under ZeRO-3 (its momentum gathered from the shards), so each
# stage and each recipe is tested there once; the value names the default-tier case of the same joint.
LONG = {("lineup", "zero3"): "rubicap-zero3 and moco-zero3 (ZeRO-3), lineup-zero2 (LineupRL)",
        ("rubicap", "zero2"): "lineup-zero2 (ZeRO-2), rubicap-zero3 (RubiCap)",
        ("moco", "zero2"): "lineup-zero2 (ZeRO-2), moco-zero3 (MoCo and its momentum)"}
CASES = [pytest.param(recipe, stage, marks=[pytest.mark.long] if (recipe, stage) in LONG else [])
         for recipe in RECIPES for stage in STAGES]


@pytest.mark.slow
@pytest.mark.timeout(1800)  # two 2-process launches of at most 900 s each: 34-37 s here alone, minutes beside other jobs
@requires_deepspeed
@pytest.mark.parametrize(("recipe", "stage"), CASES)
def test_recipe_under_deepspeed(recipe, stage, tmp_path):
    config, model, overrides = RECIPES[recipe]
    out = tmp_path / "run"
    args = [*overrides, *STEPS, f"train.out_dir={out}"]
    initial = _initial(model)  # built here, once: two ranks building the cached fixture would race
    _log, wall = launch(stage, recipe, config, args)
    print(f"{recipe} {stage}: {wall:.0f} s wall")

    result = json.loads((out / "result.json").read_text())
    assert result["steps"] == 2
    ck1, ck2 = out / "checkpoints" / "checkpoint-1", out / "checkpoints" / "checkpoint-2"
    assert json.loads((ck2 / "trainer_state.json").read_text())["global_step"] == 2
    assert (out / "preflight.md").is_file()  # the preflight ran inside train(), the model on its device
    # the loss pass computed each group's prompt once under ZeRO (train/run/shared_prefix.py), never refused a call
    shared = json.loads((out / "timing.json").read_text())["shared_prompt_forward"]
    assert isinstance(shared, dict) and 0 < shared["prompts"] < shared["rows"] and shared["fallback_calls"] == 0, shared
    final = weights(out / "model")  # under ZeRO-3 the full state dict gathered from the shards
    if recipe == "moco":  # LoRA: the adapters trained, the momentum followed them by the float32 EMA
        assert moved_fraction(weights(ck1), final) > 0.9
        _check_momentum(out)
        assert result["momentum"]["updates"] == 2
        assert sorted(p.name for p in out.glob("rubrics.rank*.jsonl")) == ["rubrics.rank0.jsonl", "rubrics.rank1.jsonl"]
    else:
        assert moved_fraction(initial, final) > 0.9, moved_fraction(initial, final)
        assert sorted(p.name for p in out.glob("samples.rank*.jsonl")) == ["samples.rank0.jsonl", "samples.rank1.jsonl"]
    if recipe == "lineup":  # checkpoint selection over both checkpoints, then the held-out evaluation
        assert result["selection"]["scores"] and set(result["selection"]["scores"]) <= {"checkpoint-1", "checkpoint-2"}
        assert (out / "eval" / "table.md").is_file() and result["eval"]["rows"]
    else:  # image recipes: CIDEr-D of the trained policy's greedy captions
        assert (out / "eval" / "final_checks.md").is_file() and result["final_checks"]["rows"]

    # resume: drop step 2's checkpoint and the final model, rerun the same command
    saved2 = weights(ck2)
    saved_momentum = _momentum(ck2) if recipe == "moco" else None
    shutil.rmtree(ck2)
    shutil.rmtree(out / "model")
    log2, wall2 = launch(stage, recipe, config, [*args, "eval.enabled=false"] if recipe == "lineup" else args)
    print(f"{recipe} {stage} resume: {wall2:.0f} s wall")
    assert f"resuming from {ck1}" in log2
    redone = weights(ck2)
    assert max_difference(saved2, redone) < 1e-5  # the resumed run continued from exactly the saved state
    assert moved_fraction(weights(ck1), redone) > 0.9  # and step 2 trained
    if saved_momentum is not None:
        assert max_difference(saved_momentum, _momentum(ck2)) < 1e-6  # the momentum resumed too
