"""Shared by the DeepSpeed rehearsals: launch ``captionrl train`` on 2 CPU processes through ``accelerate
launch`` with the project's own ``configs/accelerate/cpu-zero{2,3}.yaml``, and read back saved weights.

DeepSpeed's CPU accelerator runs the collectives over gloo when oneCCL is absent, so ZeRO-2 and ZeRO-3
shard for real across the two processes. One torch thread per process (the machine is shared)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("zero2", "zero3")

requires_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                        reason="needs deepspeed (pip install -e '.[dev]')")


def free_port() -> int:
    """A free TCP port for the rendezvous (two rehearsals in two pytest workers must not share one)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(stage: str, recipe: str, config: str, overrides: list[str], timeout: int = 900) -> tuple[str, float]:
    """Run one training command under DeepSpeed ``stage`` on 2 CPU processes; returns (output, wall seconds).
    A non-zero exit (any rank failing) fails the test with the output's tail."""
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    cmd = [accelerate, "launch", "--config_file", str(ROOT / "configs" / "accelerate" / f"cpu-{stage}.yaml"),
           "--main_process_port", str(free_port()),
           "-m", "captionrl.cli", "train", recipe, "--config", str(ROOT / "configs" / config), *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONFAULTHANDLER": "1",  # a rank stopped with SIGABRT prints every thread's Python stack
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    t0 = time.perf_counter()
    returncode, out = run_group(cmd, env, timeout)
    wall = time.perf_counter() - t0
    assert returncode is not None, f"timed out after {timeout} s{_stale_build_locks()}; every process's stack:\n{out[-12000:]}"
    assert returncode == 0, _failure(out)
    return out, wall


def run_group(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[int | None, str]:
    """Run ``cmd`` in a process group of its own; returns (exit status, stdout + stderr), the status ``None``
    when it ran past ``timeout``. Then every process of the group (the launcher *and* its ranks) gets
    SIGABRT, so that each prints its Python stack (``PYTHONFAULTHANDLER``) into the output, then SIGKILL.

    ``subprocess.run(timeout=...)`` kills only ``accelerate launch``: its ranks lived on as orphans, each
    taking a core for the rest of the suite, and every later launch on 2 cores ran slower and past its own
    timeout in turn."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    smoke = smoke_script()  # the GPU smoke script's own group stop: one implementation for both
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        return None, smoke.stop_group(proc)
    except BaseException:  # pytest-timeout or Ctrl-C while waiting: leave no rank behind either
        smoke.signal_group(proc.pid, signal.SIGKILL)
        raise


def smoke_script() -> Any:
    """``scripts/gpu_smoke.py`` as a module (a script, not a package: loaded from its path)."""
    from script_modules import load_script

    return load_script("gpu_smoke")


def _stale_build_locks() -> str:
    """DeepSpeed builds its CPU shm op with torch's JIT builder on every rank's start; a rank killed while it
    held the build lock leaves the lock file, and every later launch waits on it forever (torch's
    ``FileBaton.wait`` has no timeout; the stacks then end in ``file_baton.py``). Named in the failure."""
    from torch.utils.cpp_extension import _get_build_directory

    with contextlib.suppress(Exception):
        lock = Path(_get_build_directory("deepspeed_shm_comm", verbose=False)) / "lock"
        if lock.exists():
            return f" (torch extension build lock present: {lock}; delete it if no DeepSpeed process is running)"
    return ""


def _failure(out: str) -> str:
    """The first traceback (the rank that failed first: the others only report its lost connection), the
    first rank's native crash report if one died on a signal (faulthandler's "Fatal Python error" stack and a
    C++ "terminate called ... what():" line: a SIGABRT leaves no Python traceback), and the output's tail."""
    first = out.find("Traceback (most recent call last)")
    head = out[first:first + 4000] if first >= 0 else ""
    native = ""
    for marker in ("terminate called", "Fatal Python error"):
        at = out.find(marker)
        if at >= 0:
            native += f"\n...\n{out[max(0, at - 500):at + 4000]}"
    return f"{head}{native}\n...\n{out[-3000:]}"


def native_abort(out: str) -> bool:
    """Whether a failed launch's first failing rank was killed by SIGABRT (torch's launcher names it the root
    cause): an abort inside the native runtime (gloo, DeepSpeed's CPU ops). A rank whose Python code raised,
    a failed check included, exits with 1 instead."""
    at = out.find("Root Cause (first observed failure)")
    cause = out[at:at + 600] if at >= 0 else ""
    return re.search(r"exitcode\s*:\s*-6\b", cause) is not None


def weights(folder: Path) -> dict[str, Any]:
    """The tensors of a saved model or adapter folder (``*.safetensors``), float32 for comparisons."""
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    assert files, f"no safetensors in {folder}"
    out: dict[str, Any] = {}
    for f in files:
        out.update({k: v.float() for k, v in load_file(str(f)).items()})
    return out


def moved_fraction(before: dict[str, Any], after: dict[str, Any]) -> float:
    """Share of the common tensors whose values changed."""
    common = [k for k in before if k in after and before[k].shape == after[k].shape]
    assert common, (sorted(before)[:3], sorted(after)[:3])
    return sum(not bool((before[k] == after[k]).all()) for k in common) / len(common)


def max_difference(a: dict[str, Any], b: dict[str, Any]) -> float:
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))[:5]
    return max(float((a[k] - b[k]).abs().max()) for k in a)
