"""Checks that several training tests share: the ones a wrong implementation fails.

TRL's own trainer tests compare every trainable parameter before and after a step; a trainer whose loss
is detached, whose rewards never reach the advantages, or whose optimiser is handed the wrong parameters
leaves some (or all) of them untouched. ``unchanged_parameters`` names those.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def snapshot(named_parameters: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """Detached copies of ``named_parameters`` (taken before training, compared after)."""
    return {n: p.detach().clone() for n, p in named_parameters}


def unchanged_parameters(before: Mapping[str, Any], after: Iterable[tuple[str, Any]]) -> list[str]:
    """Names of the parameters of ``after`` equal to their copy in ``before`` (every name must be in both)."""
    import torch

    after = dict(after)
    assert after.keys() == before.keys(), sorted(set(after) ^ set(before))[:5]
    return [n for n, p in after.items() if torch.equal(before[n], p.detach())]


def unchanged_between_folders(before: str, after: str, *, vlm: bool = False) -> list[str]:
    """``unchanged_parameters`` for two saved model folders (an initial checkpoint and a trained one)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    auto = AutoModelForImageTextToText if vlm else AutoModelForCausalLM
    return unchanged_parameters(snapshot(auto.from_pretrained(before).named_parameters()),
                                auto.from_pretrained(after).named_parameters())
