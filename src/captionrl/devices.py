"""Which dtype a model should load in on the device at hand, and why.

bf16 halves memory and, on hardware that computes in it natively, speeds up every matmul. On a CPU
without native bf16 (AVX2-only laptops and many cloud VMs) torch emulates it and the same matmul runs
more than 100x slower than in float32 (156 s against 0.65 s for 512x2048 @ 2048x2048 in torch 2.13 on
an AVX2 machine). So ``auto`` picks bf16 only where it is native: on a GPU, or on a CPU whose
flags include AVX512-BF16 or AMX-BF16 (and whose torch build dispatches AVX512 kernels); float32
otherwise. The reason travels with the choice so a run can say why it runs in what it runs in.

Weights being *trained* stay float32 under ``auto``: an AdamW update at RL learning rates (1e-6) is far
below bf16's resolution (2**-8 relative) and would be rounded away; on GPU the speed comes from the
trainer's bf16 autocast (``train.bf16``), not from bf16 weights.

Low level on purpose (only torch and /proc): backends, training and benches all import it.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

from captionrl.errors import ConfigError

logger = logging.getLogger(__name__)

DTYPES = ("auto", "float32", "bfloat16", "float16")
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
"""/proc/cpuinfo flags of x86 CPUs that compute bf16 natively (AVX512-BF16 dot products, AMX tiles)."""


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags Linux reports (empty where /proc/cpuinfo is missing: macOS, Windows)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def cpu_capability() -> str:
    """torch's own report of the vector ISA its CPU kernels dispatch to (DEFAULT, AVX2, AVX512, ...)."""
    import torch

    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except AttributeError:  # torch before get_cpu_capability: treat as no fast path
        return "DEFAULT"


def cpu_native_bf16() -> tuple[bool, str]:
    """(whether this CPU runs bf16 natively, the evidence)."""
    cap = cpu_capability()
    native = sorted(f for f in NATIVE_BF16_FLAGS if f in cpu_flags())
    if native and cap.startswith("AVX512"):
        return True, f"CPU has {'+'.join(native)} and torch dispatches {cap} kernels"
    if native:
        return False, f"CPU has {'+'.join(native)} but torch dispatches {cap} kernels (no native bf16 path)"
    return False, f"CPU lacks AVX512-BF16/AMX-BF16 (torch capability {cap}): bf16 would be emulated, far slower"


def resolve_dtype(requested: str, device: Any = "cpu", *, training: bool = False) -> tuple[Any, str]:
    """The torch dtype to load weights in and the reason for it.

    ``requested`` is ``auto``, ``float32``, ``bfloat16`` or ``float16``; an explicit dtype is honoured
    as given (the reason says so). ``device`` is a string or ``torch.device`` (``auto`` means CUDA when
    visible). ``training``: the weights will be optimised (``auto`` keeps them float32, see module doc).
    """
    import torch

    if requested not in DTYPES:
        raise ConfigError("dtype", requested, "unknown dtype", "use auto, float32, bfloat16 or float16")
    dev = str(device)
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    if requested != "auto":
        reason = f"{requested} as configured"
        if requested == "bfloat16" and dev.startswith("cpu"):
            # Honoured (the user asked), but never silently: without native bf16 it is emulated, and a bf16
            # matmul on an AVX2 CPU runs about 200x slower than float32.
            native, why = cpu_native_bf16()
            if not native:
                reason += f" (slow here: {why})"
                warnings.warn(f"dtype: bfloat16 on this CPU is emulated ({why}); set dtype: auto or float32 "
                              "for float32 speed", RuntimeWarning, stacklevel=2)
        return getattr(torch, requested), reason
    if training:
        return torch.float32, ("auto, trained weights: float32 (bf16 weights would round away small AdamW "
                               "updates; GPU speed comes from bf16 autocast, train.bf16)")
    if dev.startswith("cuda"):
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return torch.bfloat16, f"auto on {dev}: the GPU computes bf16 natively"
        return torch.float32, f"auto on {dev}: no bf16 support reported by this GPU"
    if dev.startswith("cpu"):
        native, why = cpu_native_bf16()
        return (torch.bfloat16 if native else torch.float32), f"auto on CPU: {why}"
    return torch.float32, f"auto on {dev}: float32 (bf16 speed not known for this device)"


def dtype_name(dtype: Any) -> str:
    """``torch.bfloat16`` -> ``bfloat16`` (for records and summaries)."""
    return str(dtype).removeprefix("torch.")


DTYPE_CHOICES: dict[str, dict[str, str]] = {}
"""model name -> {"dtype", "reason"} for every model this process loaded; a training run writes them to
its ``timing.json`` so the run says what it ran in and why."""


def record_dtype(name: str, dtype: Any, reason: str, *, echo: bool = True) -> None:
    """Remember (and log, once per model) the dtype a model was loaded in and why."""
    entry = {"dtype": dtype_name(dtype), "reason": reason}
    if echo and DTYPE_CHOICES.get(name) != entry:
        logger.info(f"{name} dtype: {entry['dtype']} ({reason})")
    DTYPE_CHOICES[name] = entry


@contextlib.contextmanager
def no_zero3_init() -> Iterator[None]:
    """Models loaded in the block are plain, even inside a DeepSpeed ZeRO-3 run.

    Once a ZeRO-3 run's trainer arguments exist, transformers builds every ``from_pretrained`` model under
    ``deepspeed.zero.Init`` (partitioned across ranks). That is right for the policy and wrong for
    everything else a process loads for itself: an in-process verifier or judge (each rank scores its own
    samples), or a checkpoint rank 0 evaluates alone; their forward passes would become collectives that
    the other ranks never join (a hang or an empty-weight error)."""
    try:
        from transformers.integrations import deepspeed as hf_ds
    except ImportError:  # pragma: no cover - transformers always ships it
        yield
        return
    saved = hf_ds._hf_deepspeed_config_weak_ref
    hf_ds._hf_deepspeed_config_weak_ref = None
    try:
        yield
    finally:
        hf_ds._hf_deepspeed_config_weak_ref = saved
