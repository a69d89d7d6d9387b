"""verl reward plug-in (verl 0.9.1: ``reward.custom_reward_function.path=pkg://captionrl.adapters.verl``
``reward.custom_reward_function.name=compute_score_async``; launch line in ``docs/engines.md``).

verl calls ``compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw)`` per sample
and logs every key of a returned dict (its reward loop indexes every sample by the first one's keys, so
the keys never vary); the reward loop awaits ``compute_score_async`` (``inspect.iscoroutinefunction``).
``ground_truth`` is what the reward service accepts as a label (``captionrl.adapters.engine``; for
identification ``encode_label(candidates)``). The score and every logged number are finite, or the call
raises (``captionrl.serve.failure``): verl masks nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any

from captionrl.adapters.engine import scores


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs: Any) -> dict[str, Any]:
    """The reward of the adapters' YAML (by default the shaped identification reward of ``train lineup``)."""
    ((settled, logs),) = scores([solution_str], [ground_truth])
    return {"score": settled.reward, **logs, "error": settled.error or ""}


async def compute_score_async(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None,
                              **kwargs: Any) -> dict[str, Any]:
    """The same score without blocking verl's event loop (the verifier runs in a worker thread)."""
    return await asyncio.to_thread(compute_score, data_source, solution_str, ground_truth, extra_info, **kwargs)
