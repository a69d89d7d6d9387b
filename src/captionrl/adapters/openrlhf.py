"""OpenRLHF reward plug-in: ``--reward.remote_url <this file>`` (a .py with ``reward_func``; OpenRLHF 0.11).

OpenRLHF 0.11 calls ``reward_func(queries, prompts, labels)`` in a thread, one sample at a time (lists of
length 1, ``SingleTurnAgentExecutor._fetch_rewards_via_func``), with the full text (prompt + response),
the prompt and the label, and reads ``{"rewards", "scores", "extra_logs"}`` (tensors; each ``extra_logs``
value goes through ``torch.tensor``, so every one is a finite number). Each label is what the reward
service accepts (``captionrl.adapters.engine``). An exception (an outage past the deadline, an unscorable
caption with no ``CAPTIONRL_UNSCORED_REWARD``, a malformed label) leaves OpenRLHF's reward ``None``, which
fails its batch: the run stops rather than learn from an invented number.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from captionrl.adapters.engine import scores
from captionrl.serve.text import strip_end


def reward_func(queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any], **kwargs: Any) -> dict[str, Any]:
    import torch

    # the query is prompt + response decoded with special tokens: the response's EOS is cut (serve.text)
    captions = [strip_end(q[len(p):] if q.startswith(p) else q) for q, p in zip(queries, prompts, strict=True)]
    got = scores(captions, labels)
    rewards = torch.tensor([s.reward for s, _ in got], dtype=torch.float32)
    logs = {k: torch.tensor([row[k] for _, row in got], dtype=torch.float32) for k in (got[0][1] if got else {})}
    return {"rewards": rewards, "scores": rewards.clone(), "extra_logs": logs}
