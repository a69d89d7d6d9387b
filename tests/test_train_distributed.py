"""The multi-process path without a GPU: ``accelerate launch`` with two CPU processes (gloo) runs two
LineupRL steps (GRPO with LoRA here, so the other algorithm and PEFT are covered too). Each rank scores
its own slice of completions; the logged step reward must be the mean over both ranks' samples."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.long  # two-process training: the DeepSpeed rehearsals in the default tier
@pytest.mark.slow
def test_two_cpu_processes_train_two_steps(tmp_path):
    out = tmp_path / "run"
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    cmd = [
        accelerate, "launch", "--config_file", str(ROOT / "configs" / "accelerate" / "cpu-2proc.yaml"),
        "-m", "captionrl.cli", "train", "lineup", "--config", str(ROOT / "configs" / "lineup-cpu.yaml"),
        "data.window=8", "data.n_train=8", "data.n_test=4", "data.series=[nile,sunspots]", "reward.k=2", "reward.signal=soft",
        "train.algorithm=grpo", "warm_start.epochs=0", "train.freeze_layers=0", "train.beta=0.0", "policy.lora=true", "policy.lora_r=4", "policy.lora_alpha=8",
        "train.num_generations=2", "train.per_device_train_batch_size=2", "train.max_completion_length=6",
        "train.max_steps=2", "train.save_steps=2", "train.report_to=[]", "train.threads=1",
        "train.learning_rate=1.0e-4", "eval.enabled=false", f"train.out_dir={out}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]

    state = json.loads((out / "checkpoints" / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    ranks = sorted(p.name for p in out.glob("samples.rank*.jsonl"))
    assert ranks == ["samples.rank0.jsonl", "samples.rank1.jsonl"]  # both processes generated and scored

    from captionrl.train.run.curves import load_metrics
    from captionrl.train.run.logging import load_samples

    samples = load_samples(out)
    for m in load_metrics(out / "metrics.jsonl"):
        rows = [s for s in samples if s["step"] == m["step"] - 1]
        assert len(rows) == 4  # 2 ranks x 2 completions
        assert m["reward"] == pytest.approx(np.mean([r["reward"] for r in rows]), abs=1e-5)
    assert (out / "model" / "adapter_config.json").exists()  # LoRA: adapters saved
