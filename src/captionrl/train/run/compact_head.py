"""On CPU, TRL's fused LM head projects only the positions that carry a label, as it does on GPU.

Why: TRL 1.16's fused head (``trl.trainer.utils.add_fused_lm_head``, used by ``SFTTrainer``'s loss and by
RLOO/GRPO's log-prob passes) scores "only the valid positions" where Triton runs (CUDA, XPU) and every position
elsewhere, because on Neuron a changing number of valid positions would recompile the tiles. Eager CPU has
no such cost, and it pays the other one in full: the LineupRL warm start's batch of 8 windows has ~1,800
positions of which ~220 carry a label (the caption), so the 49,152-word projection, its softmax statistics and
their backward ran on eight times the rows they needed (profiled: 11 of ~20 s a warm-start step; the warm
start with this and ``train.run.bottom_cache`` in 0.40x the time under AVX2 kernels: docs/main-job.md "Time").
The two paths compute the same per-token log-probabilities: the
compact one gathers the labelled rows before the projection and scatters the results back
(``tests/test_compact_head.py`` compares values and gradients).

How: ``trl.trainer.utils`` binds the name ``_use_triton`` for that one decision (``compact =
_use_triton(hidden_states.device)``), separately from the kernel module's own binding, which keeps choosing
the torch fallback on CPU. :func:`compact_on_cpu` rebinds the utils name, for the block, to a function that
also says yes for CPU tensors. Declared in ``train.run.trl_compat``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from captionrl.train.run.trl_compat import original


@contextmanager
def compact_on_cpu() -> Iterator[None]:
    """Inside the block, TRL's fused LM head scores only labelled positions on CPU too (GPU unchanged)."""
    import trl.trainer.utils as trl_utils

    gpu_choice = original(trl_utils, "_use_triton")

    def compact(device: Any) -> bool:
        return getattr(device, "type", None) == "cpu" or gpu_choice(device)

    trl_utils._use_triton = compact
    try:
        yield
    finally:
        trl_utils._use_triton = gpu_choice
