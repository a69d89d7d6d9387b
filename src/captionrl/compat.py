"""The transformers names that changed inside the range captionrl supports, read in one place.

The GPU install takes the transformers that vLLM pins (``scripts/gpu-pins.txt``: 5.17 for vLLM 0.31), the
CPU install the newest release the range in ``pyproject.toml`` admits (5.24), and the same code runs on
both. Between them the key/value cache was renamed: 5.17 returns it as ``output.past_key_values`` and takes
it as ``past_key_values=`` (the model's ``forward``, ``generate``, Qwen-VL's ``compute_3d_position_ids``);
5.24 says ``cache`` in all three places. Code that reads or passes a cache goes through these functions, so
a model that still takes the old name (a remote-code model on 5.24) works too.

``tests/test_gpu_pins.py`` runs the GPU-path tests under the pinned versions (marker ``gpu_pins``).
Imports nothing of captionrl's, so every floor may use it.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

CACHE_NAMES = ("cache", "past_key_values")
"""The cache's names, newest first: ``cache`` (transformers 5.24) and ``past_key_values`` (5.17)."""


def output_cache(output: Any) -> Any:
    """The key/value cache a forward returned (``output.cache``, or ``output.past_key_values`` on 5.17),
    or ``None`` when it returned none."""
    for name in CACHE_NAMES:
        cache = getattr(output, name, None)
        if cache is not None:
            return cache
    return None


@functools.lru_cache(maxsize=1)
def installed_cache_name() -> str:
    """The name the installed transformers gives the cache (read off its causal-LM output class)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return next((n for n in CACHE_NAMES if n in CausalLMOutputWithPast.__dataclass_fields__), CACHE_NAMES[0])


@functools.lru_cache(maxsize=256)
def _cache_parameter(fn: Any) -> str:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or C function: what the installed transformers calls it
        return installed_cache_name()
    return next((n for n in CACHE_NAMES if n in params), installed_cache_name())


def cache_argument(target: Any) -> str:
    """The keyword under which ``target`` takes a cache: ``"cache"`` or ``"past_key_values"``.

    ``target`` is a model (its class's ``forward`` is read; DDP's ``module`` and PEFT's wrapper are looked
    through) or any function (``compute_3d_position_ids``). A function that names neither (``**kwargs``
    only) gets the installed transformers' name."""
    if isinstance(target, type) or callable(getattr(target, "forward", None)):
        model = target.module if hasattr(target, "module") else target
        if not isinstance(model, type) and callable(getattr(model, "get_base_model", None)):
            model = model.get_base_model()
        fn = (model if isinstance(model, type) else type(model)).forward
    else:
        fn = getattr(target, "__func__", target)  # a bound method: its function (hashable, shared)
    return _cache_parameter(fn)


def cache_kwargs(target: Any, cache: Any) -> dict[str, Any]:
    """``{name: cache}`` for ``target``'s cache keyword (see :func:`cache_argument`), to splat into a call."""
    return {cache_argument(target): cache}
