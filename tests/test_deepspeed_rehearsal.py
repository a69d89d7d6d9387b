"""DeepSpeed ZeRO-2 and ZeRO-3 rehearsed on 2 CPU processes (issue 22): the multi-GPU launches of the paper
presets, with tiny randomly initialised models of the papers' families and everything in-process.

Each recipe runs 2 steps with a checkpoint per step, then the final checks (on rank 0, on the gathered
weights under ZeRO-3). Then a resume: checkpoint-2 and the final model are deleted and the same command
resumes from checkpoint-1; the redone step 2 must reproduce the first run's checkpoint-2 (the restored state
is the saved state: weights, optimizer, data order, per-rank RNG). Asserted as well: every trainable
parameter group moved, both ranks produced and scored captions, and the process exited 0 on every rank.
"""

from __future__ import annotations

import json
import shutil

import pytest

from deepspeed_launch import STAGES, launch, max_difference, moved_fraction, requires_deepspeed, weights

TINY = "tiny-qwen2.5-vl"  # LineupRL's paper policy family (Qwen2.5-VL), random weights, built offline

LINEUP = [
    f"policy.model={TINY}", "policy.input=chart", "policy.dtype=float32",
    "verifier.kind=hf", f"verifier.model={TINY}", "verifier.dtype=float32", "reward.mode=likelihood",
    "data.window=8", "data.n_train=4", "data.n_val=1", "data.n_test=1", "data.series=[nile,sunspots]", "reward.k=2",
    "train.num_generations=2", "train.per_device_train_batch_size=2", "train.max_completion_length=6",
    "train.max_steps=2", "train.save_steps=1", "train.save_total_limit=null", "train.report_to=[]",
    "train.threads=1", "train.learning_rate=1.0e-3", "train.preflight_items=1", "train.force_preflight=true",
    "eval.bottleneck=false",
]


def _tiny_initial_weights() -> dict:
    from captionrl.testing.tiny_qwen_vl import tiny_qwen_vl_dir

    return weights(tiny_qwen_vl_dir(TINY.removeprefix("tiny-")))


@pytest.mark.slow
@requires_deepspeed
@pytest.mark.parametrize("stage", STAGES)
def test_lineup_under_deepspeed(stage, tmp_path):
    out = tmp_path / "run"
    initial = _tiny_initial_weights()  # built here, once: two ranks building the cached fixture would race
    log, wall = launch(stage, "lineup", "lineup-cpu.yaml", [*LINEUP, f"train.out_dir={out}"])
    print(f"lineup {stage}: {wall:.0f} s wall")
    assert f"stage {stage[-1]}" in log.lower() or "zero" in log.lower()

    # both ranks generated and scored their own slices
    assert sorted(p.name for p in out.glob("samples.rank*.jsonl")) == ["samples.rank0.jsonl", "samples.rank1.jsonl"]
    result = json.loads((out / "result.json").read_text())
    assert result["steps"] == 2
    ck1, ck2 = out / "checkpoints" / "checkpoint-1", out / "checkpoints" / "checkpoint-2"
    assert json.loads((ck2 / "trainer_state.json").read_text())["global_step"] == 2
    # parameters moved (the final model is the gathered full state dict under ZeRO-3)
    final = weights(out / "model")
    assert moved_fraction(initial, final) > 0.9, moved_fraction(initial, final)
    # final checks ran on rank 0: checkpoint selection over both checkpoints, then the held-out evaluation
    assert set(result["selection"]["scores"]) <= {"checkpoint-1", "checkpoint-2"} and result["selection"]["scores"]
    assert (out / "eval" / "table.md").is_file() and result["eval"]["rows"]
    assert (out / "preflight.md").is_file()  # the preflight ran (inside train(), model on its device)

    # resume: drop step 2's checkpoint and the final model, rerun the same command
    saved2 = weights(ck2)
    shutil.rmtree(ck2)
    shutil.rmtree(out / "model")
    log2, wall2 = launch(stage, "lineup", "lineup-cpu.yaml", [*LINEUP, f"train.out_dir={out}", "eval.enabled=false"])
    print(f"lineup {stage} resume: {wall2:.0f} s wall")
    assert f"resuming from {ck1}" in log2
    redone = weights(ck2)
    assert max_difference(saved2, redone) < 1e-5  # the resumed run continued from exactly the saved state
    assert moved_fraction(weights(ck1), redone) > 0.9  # and step 2 trained

