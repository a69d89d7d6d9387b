"""verl reward plug-in (verl 0.9.1: ``reward.custom_reward_function.path=pkg://captionrl.adapters.verl``
``reward.custom_reward_function.name=compute_score_async``; launch line in ``docs/engines.md``).

verl calls ``compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw)`` per sample
and logs every key of a returned dict (its reward loop indexes every sample by the first one's keys, so
the keys never vary); the reward loop awaits ``compute_score_async`` (``inspect.iscoroutinefunction``).
``ground_truth`` is ``captionrl.adapters.engine.encode_label(candidates)`` for identification, or what the
reward service accepts as a label for the other rewards (``captionrl.adapters.rewards``). The score is
finite or the call raises (``captionrl.serve.failure``): verl masks nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any

from captionrl.adapters.engine import final_score, shaped_scores, shaping_logs
from captionrl.adapters.rewards import reward_config, scores


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs: Any) -> dict[str, Any]:
    """The shaped identification reward (the same guard and penalties as ``captionrl train lineup``), or the
    reward the adapters' YAML names."""
    if reward_config() is not None:
        ((settled, logs),) = scores([solution_str], [ground_truth])
        return {"score": settled.reward, **logs, "caption_chars": len(solution_str), "error": settled.error or ""}
    ((j, s),) = shaped_scores([solution_str], [ground_truth])
    return {
        "score": final_score(j, s),  # finite, or raises (captionrl.serve.failure)
        "unscored": 0.0 if j.scored else 1.0,
        "identification": j.score,
        "hard": j.extra.get("hard"),
        "soft": j.extra.get("soft"),
        "caption_chars": len(solution_str),
        **shaping_logs(s),
    }


async def compute_score_async(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None,
                              **kwargs: Any) -> dict[str, Any]:
    """The same score without blocking verl's event loop (the verifier runs in a worker thread)."""
    return await asyncio.to_thread(compute_score, data_source, solution_str, ground_truth, extra_info, **kwargs)
