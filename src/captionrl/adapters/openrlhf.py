"""OpenRLHF reward plug-in: ``--remote_rm_url <this file>`` (a .py with ``reward_func``).

OpenRLHF calls ``reward_func(queries, prompts, labels, **kw)`` with the full texts (prompt + response),
the prompts and the labels of a batch, and reads ``{"rewards", "scores", "extra_logs"}`` (tensors).
Each label is ``captionrl.adapters.engine.encode_label(candidates)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from captionrl.adapters.engine import judge_captions, score_or_fail


def reward_func(queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any], **kwargs: Any) -> dict[str, Any]:
    import torch

    captions = [q[len(p):] if q.startswith(p) else q for q, p in zip(queries, prompts, strict=True)]
    judgments = judge_captions(captions, labels)
    rewards = torch.tensor([score_or_fail(j) for j in judgments], dtype=torch.float32)
    hard = torch.tensor([float(j.extra.get("hard", float("nan"))) for j in judgments])
    return {
        "rewards": rewards,
        "scores": rewards.clone(),
        "extra_logs": {"identification_hard": hard, "caption_chars": torch.tensor([float(len(c)) for c in captions])},
    }
