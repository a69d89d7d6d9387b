"""``scripts/gpu_smoke.sh --dry-run``: every joint of the GPU smoke test runs on the CPU (no vLLM, no
device) and the report says pass/fail, seconds and the device per joint (issue 22)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deepspeed_launch import requires_deepspeed

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(2400)  # six joints, each a fresh process: 15+ min on 2 shared cores (load average 14)
@requires_deepspeed
def test_gpu_smoke_dry_run_passes_every_joint(tmp_path):
    if not os.environ.get("CAPTIONRL_LONG_REHEARSALS"):
        pytest.skip("the whole dry run (six joints, 15+ min) has not yet passed once end to end on the development "
                    "machine (issue 22 stays open); CAPTIONRL_LONG_REHEARSALS=1 runs it")
    from captionrl.testing.tiny_qwen_vl import tiny_qwen_vl_dir

    for family in ("qwen2.5-vl", "qwen3-vl"):
        tiny_qwen_vl_dir(family)  # built once here: the joints' processes would otherwise race to build them
    out = tmp_path / "smoke"
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_smoke.sh"), "--dry-run", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=2300)
    report = json.loads((out / "report.json").read_text())
    failed = {j["name"]: j["tail"] for j in report["joints"] if not j["passed"]}
    assert proc.returncode == 0 and not failed, (proc.stdout[-2000:], failed)
    names = [j["name"] for j in report["joints"]]
    assert names == ["device", "lineup", "rubicap", "moco", "lineup-zero3", "gpu-verifier"]
    assert report["dry_run"] and report["device"] == "cpu" and report["date"]
    assert all(j["seconds"] > 0 for j in report["joints"])
    md = (out / "report.md").read_text()
    assert "| moco | pass |" in md and "dry run" in md
    for recipe in ("lineup", "rubicap", "moco", "lineup-zero3"):
        assert json.loads((out / recipe / "result.json").read_text())["steps"] == 2, recipe
    assert json.loads((out / "gpu_verifier.json").read_text())["tiny"]
