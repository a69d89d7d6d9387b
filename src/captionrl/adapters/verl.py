"""verl reward plug-in: ``custom_reward_function.path=<this file> custom_reward_function.name=compute_score``.

verl calls ``compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw)`` per sample
and logs every key of a returned dict; the newer reward loop awaits ``compute_score_async``.
``ground_truth`` is ``captionrl.adapters.engine.encode_label(candidates)``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from captionrl.adapters.engine import final_score, shaped_scores, shaping_logs


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs: Any) -> dict[str, Any]:
    """The shaped identification reward (the same guard and penalties as ``captionrl train lineup``)."""
    ((j, s),) = shaped_scores([solution_str], [ground_truth])
    return {
        "score": final_score(j, s),
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
