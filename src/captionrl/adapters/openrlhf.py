"""OpenRLHF reward plug-in: ``--remote_rm_url <this file>`` (a .py with ``reward_func``).

OpenRLHF calls ``reward_func(queries, prompts, labels, **kw)`` with the full texts (prompt + response),
the prompts and the labels of a batch, and reads ``{"rewards", "scores", "extra_logs"}`` (tensors).
Each label is ``captionrl.adapters.engine.encode_label(candidates)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from captionrl.adapters.engine import final_score, shaped_scores, shaping_logs


def reward_func(queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any], **kwargs: Any) -> dict[str, Any]:
    import torch

    captions = [q[len(p):] if q.startswith(p) else q for q, p in zip(queries, prompts, strict=True)]
    pairs = shaped_scores(captions, labels)
    rewards = torch.tensor([final_score(j, s) for j, s in pairs], dtype=torch.float32)
    hard = torch.tensor([float(j.extra.get("hard", float("nan"))) for j, _ in pairs])
    logs = [shaping_logs(s) for _, s in pairs]
    return {
        "rewards": rewards,
        "scores": rewards.clone(),
        "extra_logs": {"identification_hard": hard, "caption_chars": torch.tensor([float(len(c)) for c in captions]),
                       **{k: torch.tensor([row[k] for row in logs]) for k in (logs[0] if logs else {})}},
    }
