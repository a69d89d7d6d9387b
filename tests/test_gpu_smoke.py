"""``scripts/gpu_smoke.sh --dry-run``: every joint of the GPU smoke test runs on the CPU (no vLLM, no
device) and the report says pass/fail, seconds and the device per joint (issue 22)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deepspeed_launch import requires_deepspeed, run_group, smoke_script

ROOT = Path(__file__).resolve().parents[1]
JOINT_TIMEOUT = 600  # seconds per joint (the script's --timeout): six joints stay under the test's limit


def test_a_joint_past_its_timeout_fails_with_stacks_and_leaves_no_process(tmp_path):
    """The timeout stops the joint's whole process group (a child as well as the joint's first process) and
    the report keeps where each one was: ``accelerate launch``'s ranks used to outlive it."""
    smoke = smoke_script()
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import time\nprint('up', flush=True)\n\ndef waiting_here():\n    time.sleep(600)\n\n"
                       "waiting_here()\n")
    tag = f"smoke-timeout-{os.getpid()}"
    cmd = ["bash", "-c", f"(exec -a {tag} {sys.executable} {sleeper}) & exec -a {tag} {sys.executable} {sleeper}"]
    joint = smoke.run_joint("sleepy", cmd, tmp_path, timeout=10)
    assert not joint.passed and joint.tail.startswith("timed out after 10 s")
    assert joint.tail.count("waiting_here") >= 2, joint.tail  # both processes' stacks
    left = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True).stdout.split()
    assert not left, left


@pytest.mark.slow  # default tier: the whole dry run took 89 s on 2 idle cores (2026-12-02), so CI checks that the
# command a GPU user runs first works end to end, besides each joint's own test
@pytest.mark.timeout(2400)  # six joints, each a fresh process, each stopped at JOINT_TIMEOUT
@requires_deepspeed
def test_gpu_smoke_dry_run_passes_every_joint(tmp_path):
    from captionrl.tiny_models import tiny_qwen_vl_dir

    for family in ("qwen2.5-vl", "qwen3-vl"):
        tiny_qwen_vl_dir(family)  # built once here: the joints' processes would otherwise race to build them
    out = tmp_path / "smoke"
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    returncode, output = run_group(["bash", str(ROOT / "scripts" / "gpu_smoke.sh"), "--dry-run", "--out", str(out),
                                    "--timeout", str(JOINT_TIMEOUT)], env, timeout=2300)
    assert returncode is not None, output[-12000:]  # timed out: every process's stack
    report = json.loads((out / "report.json").read_text())
    failed = {j["name"]: j["tail"] for j in report["joints"] if not j["passed"]}
    assert returncode == 0 and not failed, (output[-2000:], failed)
    names = [j["name"] for j in report["joints"]]
    assert names == ["device", "lineup", "rubicap", "moco", "lineup-zero3", "gpu-verifier"]
    assert report["dry_run"] and report["device"] == "cpu" and report["date"]
    assert all(j["seconds"] > 0 for j in report["joints"])
    md = (out / "report.md").read_text()
    assert "| moco | pass |" in md and "dry run" in md
    for recipe in ("lineup", "rubicap", "moco", "lineup-zero3"):
        assert json.loads((out / recipe / "result.json").read_text())["steps"] == 2, recipe
    assert json.loads((out / "gpu_verifier.json").read_text())["tiny"]
