"""A trainer-side client of the reward service: verl's ``compute_score`` / ``compute_score_async``.

Use as verl's ``custom_reward_function.path`` (see ``captionrl.serve``); the service URL comes from
``CAPTIONRL_REWARD_URL`` (``http://HOST:PORT``). verl calls per sample; the service pools concurrent
calls into one judge batch. An unscored caption comes back as NaN with its error in ``error`` (never 0).
"""

from __future__ import annotations

import math
import os
from typing import Any

import httpx

URL_ENV = "CAPTIONRL_REWARD_URL"
TIMEOUT_S = 600.0


def _url() -> str:
    url = os.environ.get(URL_ENV)
    if not url:
        from captionrl.errors import ConfigError

        raise ConfigError(URL_ENV, url, "the reward service's URL is not set",
                          f"export {URL_ENV}=http://HOST:PORT (start it with captionrl serve reward)")
    return url.rstrip("/") + "/reward"


def _body(solution_str: str, ground_truth: Any) -> dict[str, Any]:
    return {"query": [solution_str], "prompts": [""], "labels": [ground_truth]}


def _score(reply: httpx.Response) -> dict[str, Any]:
    data = reply.json()
    if reply.status_code != 200:
        from captionrl.errors import BackendError

        raise BackendError(f"reward service answered HTTP {reply.status_code}: {data.get('error', data)}")
    reward = data["rewards"][0]
    out: dict[str, Any] = {"score": math.nan if reward is None else float(reward)}
    for key, values in data.get("extra_logs", {}).items():
        out[key] = values[0]
    out["error"] = data.get("errors", [None])[0] or ""
    return out


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None,
                  **kwargs: Any) -> dict[str, Any]:
    return _score(httpx.post(_url(), json=_body(solution_str, ground_truth), timeout=TIMEOUT_S))


async def compute_score_async(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None,
                              **kwargs: Any) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        return _score(await client.post(_url(), json=_body(solution_str, ground_truth)))
