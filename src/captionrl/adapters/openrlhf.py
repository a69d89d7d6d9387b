"""OpenRLHF reward plug-in: ``--reward.remote_url <this file>`` (a .py with ``reward_func``; OpenRLHF 0.11).

OpenRLHF 0.11 calls ``reward_func(queries, prompts, labels)`` in a thread, one sample at a time (lists of
length 1, ``SingleTurnAgentExecutor._fetch_rewards_via_func``), with the full text (prompt + response),
the prompt and the label, and reads ``{"rewards", "scores", "extra_logs"}`` (tensors). Each label is
``captionrl.adapters.engine.encode_label(candidates)``. An exception (an outage past the deadline, an
unscorable caption with no ``CAPTIONRL_UNSCORED_REWARD``) leaves OpenRLHF's reward ``None``, which fails
its batch: the run stops rather than learn from an invented number (``captionrl.adapters.engine``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from captionrl.adapters.engine import final_score, shaped_scores, shaping_logs
from captionrl.adapters.rewards import reward_config, scores
from captionrl.serve.text import strip_end


def reward_func(queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any], **kwargs: Any) -> dict[str, Any]:
    import torch

    # the query is prompt + response decoded with special tokens: the response's EOS is cut (serve.text)
    captions = [strip_end(q[len(p):] if q.startswith(p) else q) for q, p in zip(queries, prompts, strict=True)]
    if reward_config() is not None:
        got = scores(captions, labels)
        values = torch.tensor([s.reward for s, _ in got], dtype=torch.float32)
        logs = {k: torch.tensor([row[k] for _, row in got]) for k in got[0][1]} if got else {}
        return {"rewards": values, "scores": values.clone(), "extra_logs": logs}
    pairs = shaped_scores(captions, labels)
    values = [final_score(j, s) for j, s in pairs]  # finite, or raises (captionrl.serve.failure)
    rewards = torch.tensor(values, dtype=torch.float32)
    # an unscored caption's log fields repeat its reward (as the service's do); ``unscored`` tells them apart
    hard = torch.tensor([float(j.extra["hard"]) if j.scored else v for (j, _), v in zip(pairs, values, strict=True)])
    logs = [shaping_logs(s) for _, s in pairs]
    return {
        "rewards": rewards,
        "scores": rewards.clone(),
        "extra_logs": {"identification_hard": hard, "caption_chars": torch.tensor([float(len(c)) for c in captions]),
                       "unscored": torch.tensor([0.0 if j.scored else 1.0 for j, _ in pairs]),
                       **{k: torch.tensor([row[k] for row in logs]) for k in (logs[0] if logs else {})}},
    }
