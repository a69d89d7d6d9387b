"""Where the trained weights are when something other than TRL's loss uses them.

Under DeepSpeed ZeRO-3 each rank holds a shard of every parameter and a forward pass all-gathers them
layer by layer: every rank must run the same forward passes in the same order. Our own in-process uses of
the policy (MoCo's momentum Generator/Judge inside the reward, the final checks, checkpoint selection)
do not: the number of generate calls depends on each rank's data (rubric retries, batches, stop tokens),
and the final checks run on rank 0 only. Both would hang. So:

- :func:`full_weights` gathers the whole model once on every rank (one collective, entered the same
  number of times everywhere: once per reward call, once for the final checks) and removes the ZeRO-3
  hooks, so that whatever runs inside is plain local computation, as TRL does for its own generation
  (``ds3_gather_for_generation``). Outside ZeRO-3 it does nothing.
- :func:`no_zero3_init` (``captionrl.devices``, where the backends use it too) lets rank 0 load a
  checkpoint or the initial model as a plain model while a ZeRO-3 run's ``zero.Init`` is still registered
  with transformers (else the load would be partitioned, and a collective only rank 0 enters never returns).
- :func:`inference_device` is the accelerator this process trains on, where loaded models go.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from captionrl.devices import no_zero3_init

__all__ = ["full_weights", "inference_device", "no_zero3_init", "to_inference_device", "zero_stage"]


def zero_stage(trainer: Any) -> int | None:
    """The DeepSpeed ZeRO stage the trainer runs under, or ``None`` without DeepSpeed."""
    plugin = getattr(getattr(getattr(trainer, "accelerator", None), "state", None), "deepspeed_plugin", None)
    return None if plugin is None else int(getattr(plugin, "zero_stage", 0) or 0)


@contextlib.contextmanager
def full_weights(trainer: Any) -> Iterator[None]:
    """Every parameter materialised on every rank, ZeRO-3 hooks off, for the duration of the block.

    Must be entered by all ranks together (it is a collective under ZeRO-3); a no-op otherwise.
    """
    if zero_stage(trainer) != 3:
        yield
        return
    import deepspeed  # type: ignore[import-not-found]
    from trl.models.utils import add_hooks, remove_hooks

    engine = trainer.model_wrapped
    with deepspeed.zero.GatheredParameters(list(engine.parameters())):
        remove_hooks(engine)
        start_hook = _detach_start_of_forward_hook(engine)
        try:
            yield
        finally:
            add_hooks(engine)
            _reattach_start_of_forward_hook(engine, start_hook)


def _offload(engine: Any) -> Any:
    optimizer = getattr(engine, "optimizer", None)
    return getattr(optimizer, "parameter_offload", optimizer)


def _detach_start_of_forward_hook(engine: Any) -> Any:
    """Take off DeepSpeed's whole-model forward pre-hook, which TRL's ``remove_hooks`` leaves on.

    It resets the parameter coordinator at every top-level forward, and that reset is a collective (it
    checks all ranks saw the same module order): a forward on rank 0 alone, the final checks', would wait
    for ranks that have already left. Returns the hook function, to put back after."""
    offload = _offload(engine)
    handle = getattr(offload, "fwd_pre_hook", None)
    module = getattr(offload, "module", None)
    if handle is None or module is None or handle.id not in module._forward_pre_hooks:
        return None
    hook = module._forward_pre_hooks[handle.id]
    handle.remove()
    return hook


def _reattach_start_of_forward_hook(engine: Any, hook: Any) -> None:
    if hook is not None:
        offload = _offload(engine)
        offload.fwd_pre_hook = offload.module.register_forward_pre_hook(hook)


def inference_device() -> Any:
    """This process's training accelerator (``cuda:LOCAL_RANK``), or the CPU when there is none."""
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def to_inference_device(model: Any) -> Any:
    """``model`` moved onto :func:`inference_device` (checkpoint selection and evaluation run there)."""
    return model.to(inference_device())
