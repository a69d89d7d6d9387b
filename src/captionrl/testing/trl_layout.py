"""TRL's layout of a generation batch, for the tests and the bench that compare the shared-prompt pass with
TRL's own: each prompt left-padded to the longest, each completion right-padded to the longest and joined to
its prompt, ``group`` consecutive rows per prompt (``RLOOTrainer._generate_and_score`` builds it so)."""

from __future__ import annotations

from typing import Any


def trl_rows(prompts: list[list[int]], completions: list[list[int]], group: int, pad: int) -> tuple[Any, Any, int]:
    """``(input_ids, attention_mask, completion length)``: row ``r`` is prompt ``r // group`` then completion
    ``r``, as tensors."""
    import torch

    width_p, width_c = max(map(len, prompts)), max(map(len, completions))
    rows, masks = [], []
    for r, c in enumerate(completions):
        p = prompts[r // group]
        rows.append([pad] * (width_p - len(p)) + p + c + [pad] * (width_c - len(c)))
        masks.append([0] * (width_p - len(p)) + [1] * (len(p) + len(c)) + [0] * (width_c - len(c)))
    return torch.tensor(rows), torch.tensor(masks), width_c
