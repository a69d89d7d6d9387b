"""Keep the bottom of a policy fixed while it trains: the input embeddings and the bottom N transformer blocks.

Used by the LineupRL warm start (``warm_start.freeze_layers``) and by any RL recipe (``train.freeze_layers``).
Why both: on CPU the backward pass through all 30 blocks of the embedded model is most of a step, and the
features the bottom blocks compute from the printed numbers are what the top blocks read the direction from.
A noisy policy-gradient step that moves every weight (Adam's steps are about the rate in size whatever the
gradient's) can erase what the warm start taught; with the bottom frozen, RL moves only the blocks the labels
were taught in (docs/main-job.md). With tied input and output embeddings (SmolLM2), freezing the
embeddings freezes the output projection too.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from captionrl.errors import ConfigError


def check_freeze_layers(value: Any, field: str) -> None:
    """The one validation of a ``freeze_layers`` setting (the warm start's and RL's): a whole number >= 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(field, value, "must be a whole number >= 0", f"set {field}: 0 (train every block) or 20")


def check_freeze_settings(cfg: Any) -> None:
    """``train.freeze_layers`` is for full fine-tuning: with LoRA only the adapters train already."""
    n = getattr(cfg.train, "freeze_layers", 0)
    if n and getattr(getattr(cfg, "policy", None), "lora", False):
        raise ConfigError("train.freeze_layers", n, "policy.lora is on: only the LoRA adapters train already",
                          "set train.freeze_layers: 0, or policy.lora: false")


def transformer_blocks(model: Any) -> Sequence[Any]:
    """The model's stack of transformer blocks (the ``ModuleList`` as long as ``config.num_hidden_layers``)."""
    import torch.nn as nn

    n = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and n is not None and len(module) == n:
            return module
    raise ValueError(f"{type(model).__name__}: no ModuleList of config.num_hidden_layers={n} blocks to freeze")


@contextmanager
def frozen_bottom(model: Any, n_layers: int, field: str = "freeze_layers") -> Iterator[int]:
    """Keep the input embeddings and the bottom ``n_layers`` blocks frozen inside the block; every weight's
    ``requires_grad`` is restored after it. Yields how many parameters stay trainable. ``field`` names the
    setting in the error raised when the policy has fewer blocks than asked for."""
    if n_layers <= 0:
        yield sum(p.numel() for p in model.parameters() if p.requires_grad)
        return
    blocks = transformer_blocks(model)
    if n_layers > len(blocks):
        raise ConfigError(field, n_layers, f"the policy has {len(blocks)} blocks",
                          f"set {field} to at most {len(blocks) - 1}")
    before = {id(p): p.requires_grad for p in model.parameters()}
    try:
        for p in model.get_input_embeddings().parameters():
            p.requires_grad_(False)
        for block in blocks[:n_layers]:
            for p in block.parameters():
                p.requires_grad_(False)
        yield sum(p.numel() for p in model.parameters() if p.requires_grad)
    finally:
        for p in model.parameters():  # weights created inside the block (a trainer's wrappers) keep their own flag
            p.requires_grad_(before.get(id(p), p.requires_grad))
