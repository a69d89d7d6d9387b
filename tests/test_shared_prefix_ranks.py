"""The shared-prompt pass on 2 CPU processes with gradient checkpointing on: per-token log-probs, entropies and
every parameter's gradient (reduced over the ranks, gathered from ZeRO-3's shards) equal TRL's own pass under
DeepSpeed ZeRO-3 (default tier) and ZeRO-2 and DDP (long tier), for the tiny random Llama and a tiny random
Qwen2.5-VL with an image per row. Each launch runs ``shared_prefix_ranks.py`` on both ranks (see it)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import warnings
from pathlib import Path

import pytest

from deepspeed_launch import ROOT, _failure, free_port, native_abort, requires_deepspeed, run_group

pytestmark = pytest.mark.slow


def _launch(config: str, out: Path, models: list[str], timeout: int = 600) -> float:
    """``accelerate launch --config_file configs/accelerate/<config>.yaml tests/shared_prefix_ranks.py``; wall s.
    The tiny models are built here first, once: two ranks building a cached fixture would race."""
    from captionrl.testing.tiny_llama import tiny_llama_dir
    from captionrl.tiny_models import tiny_qwen_vl_dir

    tiny_llama_dir()
    for name in models:
        if name != "text":
            tiny_qwen_vl_dir(name)
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    cmd = [accelerate, "launch", "--config_file", str(ROOT / "configs" / "accelerate" / f"{config}.yaml"),
           "--main_process_port", str(free_port()), str(ROOT / "tests" / "shared_prefix_ranks.py"),
           "--out", str(out), "--models", *models]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONFAULTHANDLER": "1", "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    t0 = time.perf_counter()
    returncode, log = run_group(cmd, env, timeout)
    if returncode not in (None, 0) and native_abort(log):
        # once in three clean-clone CI runs (2026-12-04) a rank died on SIGABRT, in none of 8 reruns alone: the
        # launch is repeated once (it only writes rank*.json), and the abort's report goes to a warning to be read
        warnings.warn(f"a rank aborted (SIGABRT); launching once more. The abort:\n{_failure(log)}", stacklevel=1)
        t0 = time.perf_counter()
        returncode, log = run_group(cmd, env, timeout)
    assert returncode is not None, f"timed out after {timeout} s:\n{log[-12000:]}"
    assert returncode == 0, _failure(log)
    return time.perf_counter() - t0


def _check(out: Path, models: list[str], stage: int | None) -> None:
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank in ranks:
        assert rank["processes"] == 2 and rank["zero_stage"] == stage
        for name in models:
            r = rank[name]
            assert r["checkpointing"] and r["same_params"] and r["params"] > 10, r
            assert r["prompt_passes"] == 2 and r["rows"] == 6, r      # one prompt pass per group, not per row
            assert r["max_dlogp"] < 2e-4 and r["max_dentropy"] < 2e-4, r
            assert r["max_rel_grad"] < 2e-3, r
            if stage == 3:
                assert r["sharded_params"] >= r["params"] // 2, r     # ZeRO-3 sharded the weight matrices
                assert r["engine"] == "DeepSpeedEngine"


@requires_deepspeed
@pytest.mark.timeout(900)
def test_zero3_with_checkpointing_equals_trl(tmp_path):
    models = ["text", "qwen2.5-vl"]
    wall = _launch("cpu-zero3", tmp_path, models)
    print(f"zero3: {wall:.0f} s wall")
    _check(tmp_path, models, 3)


@pytest.mark.long  # the same check under ZeRO-2 and plain DDP: ZeRO-3's (above) in the default tier
@requires_deepspeed
@pytest.mark.timeout(900)
@pytest.mark.parametrize("config, stage", [("cpu-zero2", 2), ("cpu-2proc", None)])
def test_zero2_and_ddp_with_checkpointing_equal_trl(tmp_path, config, stage):
    models = ["text", "qwen2.5-vl"]
    wall = _launch(config, tmp_path, models)
    print(f"{config}: {wall:.0f} s wall")
    _check(tmp_path, models, stage)
