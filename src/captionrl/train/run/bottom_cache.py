"""Reuse the frozen bottom's output across epochs: a supervised pass over the same rows computes the bottom
blocks once per row, not once per epoch.

Why: the LineupRL warm start (``train.warm_start``) keeps the embeddings and the bottom 20 of the embedded
model's 30 blocks frozen and passes over the same 128 windows four times. A frozen bottom maps a row's tokens
to the same hidden states every epoch, and its no-grad forward is about a third of a CPU step (profiled: 1.9
s of 5.3 s for 8 windows of ~185 tokens, one thread; both cuts together: ``bench/bench_warm_start_cache.py``,
docs/main-job.md "Time"). Keyed by the
row's tokens, the boundary states are stored the first time a row is seen and handed to the top blocks
afterwards: the same function, so the same training up to float rounding (``tests/test_bottom_cache.py``
trains with and without the cache and compares the weights).

How: the bottom blocks' ``forward`` is wrapped on the instances (no module is replaced, so parameter names,
checkpoints and optimizer state are those of the plain model). A forward pre-hook on the block stack's owner
reads each call's ``input_ids`` and ``attention_mask``. When every row of the batch is stored, block 0 returns
the stored states (padding positions zero: no real token attends to them and no label reads them) and the
other bottom blocks pass their input through; otherwise the bottom runs as usual and the last bottom block's
output is stored per row. A call it cannot key (``inputs_embeds``, a KV cache, left padding, explicit
position ids, a bottom that takes gradients) runs the plain model.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from captionrl.train.run.freezing import transformer_blocks

logger = logging.getLogger(__name__)

MAX_CACHE_BYTES = 4 * 1024**3
"""Rows beyond this many bytes of stored states are not stored (they are recomputed every epoch): a guard for
large datasets, far above the warm start's ~60 MB (128 windows of ~185 tokens x 576 floats)."""


@dataclass
class BottomCacheStats:
    """What the cache did: rows stored, batches served from it, batches the bottom ran for, bytes held."""

    stored: int = 0
    served_batches: int = 0
    computed_batches: int = 0
    bypassed_calls: int = 0
    bytes: int = 0
    states: dict[bytes, Any] = field(default_factory=dict, repr=False)

    def summary(self) -> dict[str, int]:
        """The counts, for a run's result file (the states themselves are dropped after the run)."""
        return {"stored": self.stored, "served_batches": self.served_batches,
                "computed_batches": self.computed_batches, "bypassed_calls": self.bypassed_calls,
                "bytes": self.bytes}


def _owner_of(model: Any, blocks: Any) -> Any:
    """The module whose child is the block stack (a decoder's backbone): its forward receives the token ids."""
    for module in model.modules():
        if any(child is blocks for child in module.children()):
            return module
    raise ValueError(f"{type(model).__name__}: no module holds the block stack")


def _row_keys(input_ids: Any, attention_mask: Any) -> list[tuple[bytes, int]] | None:
    """Per row, its real tokens as bytes and their count; None when a row is not right-padded (a mask that is
    not ones then zeros), so its positions could not be matched to a stored row."""
    import torch

    if input_ids is None or input_ids.dim() != 2:
        return None
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if attention_mask.dim() != 2 or attention_mask.shape != input_ids.shape:
        return None
    lengths = attention_mask.sum(dim=1)
    keys = []
    for row, n in enumerate(lengths.tolist()):
        mask = attention_mask[row]
        if n == 0 or not bool(mask[:n].all()) or bool(mask[n:].any()):
            return None
        keys.append((input_ids[row, :n].cpu().numpy().tobytes(), int(n)))
    return keys


@contextmanager
def cached_frozen_bottom(model: Any, n_layers: int) -> Iterator[BottomCacheStats | None]:
    """Inside the block, ``model``'s bottom ``n_layers`` blocks (frozen by ``freezing.frozen_bottom``) run
    once per distinct row; yields the cache's stats (None when ``n_layers`` is 0). Every wrapped forward and
    hook is removed after the block, and the stored states are dropped."""
    if n_layers <= 0:
        yield None
        return
    import torch

    blocks = transformer_blocks(model)
    bottom = list(blocks[:n_layers])
    owner = _owner_of(model, blocks)
    stats = BottomCacheStats()
    call: dict[str, Any] = {"mode": "plain"}

    def read_call(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        call.clear()
        call["mode"] = "plain"
        ids = kwargs.get("input_ids", args[0] if args else None)
        if (kwargs.get("inputs_embeds") is not None or kwargs.get("cache") is not None
                or kwargs.get("past_key_values") is not None or kwargs.get("position_ids") is not None
                or any(p.requires_grad for b in bottom for p in b.parameters())):
            stats.bypassed_calls += 1
            return
        keys = _row_keys(ids, kwargs.get("attention_mask"))
        if keys is None:
            stats.bypassed_calls += 1
            return
        call["keys"] = keys
        call["mode"] = "serve" if all(k in stats.states for k, _ in keys) else "compute"

    def first_block(original: Any) -> Any:
        def forward(hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
            if call["mode"] == "serve":
                out = torch.zeros_like(hidden_states)
                for row, (key, n) in enumerate(call["keys"]):
                    out[row, :n] = stats.states[key]
                stats.served_batches += 1
                return out
            return original(hidden_states, *args, **kwargs)
        return forward

    def middle_block(original: Any) -> Any:
        def forward(hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
            return hidden_states if call["mode"] == "serve" else original(hidden_states, *args, **kwargs)
        return forward

    def store(_module: Any, _args: Any, output: Any) -> None:
        if call["mode"] != "compute":
            return
        states = output[0] if isinstance(output, tuple) else output
        for row, (key, n) in enumerate(call["keys"]):
            if key in stats.states:
                continue
            kept = states[row, :n].detach().clone()
            size = kept.numel() * kept.element_size()
            if stats.bytes + size > MAX_CACHE_BYTES:
                continue
            stats.states[key] = kept
            stats.bytes += size
            stats.stored += 1
        stats.computed_batches += 1

    wrapped = [(bottom[0], first_block(bottom[0].forward))]
    wrapped += [(b, middle_block(b.forward)) for b in bottom[1:]]
    handles = [owner.register_forward_pre_hook(read_call, with_kwargs=True),
               bottom[-1].register_forward_hook(store)]
    for block, forward in wrapped:
        block.forward = forward
    try:
        yield stats
    finally:
        for handle in handles:
            handle.remove()
        for block, _ in wrapped:
            del block.forward  # the instance attribute: the class's forward shows through again
        logger.info(f"frozen bottom reused: {stats.stored} rows stored ({stats.bytes / 1e6:.0f} MB), "
                    f"{stats.served_batches} batches served from them, {stats.computed_batches} computed, "
                    f"{stats.bypassed_calls} calls it could not key")
        stats.states.clear()
