"""Resume after a hard kill: SIGKILL a run once it wrote a checkpoint, rerun the same command, and the
run continues from that checkpoint to the end with nothing lost (its log history keeps the steps before
the kill, and the finished run has every step)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TINY = [
    "data.window=8", "data.n_train=6", "data.n_test=4", "data.series=[nile,sunspots]", "reward.k=2", "reward.signal=soft",
    "train.num_generations=2", "train.per_device_train_batch_size=2", "train.max_completion_length=6",
    "train.max_steps=3", "train.save_steps=1", "train.beta=0.0", "train.report_to=[]", "train.threads=1",
    "train.learning_rate=1.0e-5", "eval.enabled=false", "warm_start.epochs=0", "train.freeze_layers=0",
]


def _command(out: Path) -> list[str]:
    return [sys.executable, "-m", "captionrl.cli", "train", "lineup", "--config", str(ROOT / "configs" / "lineup-cpu.yaml"),
            *TINY, f"train.out_dir={out}"]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.mark.long  # SIGKILL after a checkpoint: test_resume_all.py's multi-role SFT kill in the default tier
@pytest.mark.slow
def test_sigkill_after_checkpoint_then_rerun_resumes(tmp_path):
    out = tmp_path / "run"
    log1 = (tmp_path / "first.log").open("w")
    proc = subprocess.Popen(_command(out), cwd=ROOT, env=_env(), stdout=log1, stderr=subprocess.STDOUT)
    first_ckpt = out / "checkpoints" / "checkpoint-1" / "trainer_state.json"
    deadline = time.monotonic() + 600
    try:
        while not first_ckpt.exists():
            assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint within 10 minutes"
            time.sleep(0.5)
        time.sleep(0.5)  # let the checkpoint's last files land
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        log1.close()
    assert proc.returncode == -signal.SIGKILL
    from captionrl.train.run.run_folder import last_checkpoint

    resumed_from = last_checkpoint(out)
    assert resumed_from is not None
    step_before = int(resumed_from.name.split("-")[1])
    assert step_before < 3, "the run finished before it could be killed; shrink it further"
    before = json.loads((resumed_from / "trainer_state.json").read_text())["log_history"]

    second = subprocess.run(_command(out), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]
    assert f"resuming from {resumed_from}" in second.stderr  # progress messages: the CLI logs them to stderr
    final = json.loads((out / "checkpoints" / "checkpoint-3" / "trainer_state.json").read_text())
    assert final["global_step"] == 3
    steps = [h["step"] for h in final["log_history"] if "reward" in h]
    assert steps == [1, 2, 3]
    # nothing lost: the steps logged before the kill are kept verbatim by the resumed run
    for h in before:
        if "reward" in h:
            assert h in final["log_history"]
    assert (out / "model" / "config.json").exists() and (out / "curves.png").exists()

    # a rerun with a different setting is refused with the difference named, before any model loads
    changed = subprocess.run([*_command(out), "train.learning_rate=2.0e-5"], cwd=ROOT,
                             env={**_env(), "CAPTIONRL_FORBID_MODEL_CALLS": "1"}, capture_output=True, text=True, timeout=120)
    assert changed.returncode == 2
    assert "train.learning_rate: saved 1e-05, now 2e-05" in changed.stderr
