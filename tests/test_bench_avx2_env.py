"""The benches' AVX2 emulation must hold every kernel library torch uses on CPU.

torch's float32 GEMMs go to MKL, which ignores ``ATEN_CPU_CAPABILITY`` and ``ONEDNN_MAX_CPU_ISA``: before
2026-12-06 the "AVX2" main-job figures ran MKL's AVX512 kernels (106 vs 66 GFLOPS on the AMX Xeon, one
thread), so they were an AVX512 CPU's times, not a laptop's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

from bench_main_job_step import AVX2_ENV, child_env  # noqa: E402


def test_a_bench_child_under_avx2_env_holds_aten_onednn_and_mkl() -> None:
    out = subprocess.run([sys.executable, "-c",
                          "import os, torch; print(torch.backends.cpu.get_cpu_capability(), "
                          "os.environ.get('ONEDNN_MAX_CPU_ISA'), os.environ.get('MKL_ENABLE_INSTRUCTIONS'))"],
                         env=child_env(AVX2_ENV, threads=1), capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["AVX2", "AVX2", "AVX2"]
