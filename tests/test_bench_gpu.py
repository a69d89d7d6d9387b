"""``bench/gpu_verifier.py --tiny``: the GPU bench's code path runs on a CPU and its two paths agree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_gpu_verifier_bench_tiny_runs_on_cpu(tmp_path: Path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_verifier.py"), "--tiny", "--device", "cpu",
                           "--out", str(out)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert any(line.startswith("CPU: ") for line in proc.stdout.splitlines())  # the machine, as it is recorded
    res = json.loads(out.read_text())
    assert res["tiny"] and res["questions"] == 2 * 2 * 4 and res["shape"]["num_key_value_heads"] == 2
    for path in ("shared prefix", "no sharing"):
        assert res["results"][path]["questions_per_s"] > 0 and res["results"][path]["unscored"] == 0
    assert res["max_abs_diff"] < 1e-2  # shared-prefix and plain forward passes give the same probabilities
    assert "README: |" in proc.stdout


def test_gpu_verifier_refuses_the_full_shape_without_a_gpu():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_verifier.py"), "--device", "cpu"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "needs a CUDA GPU" in proc.stderr
