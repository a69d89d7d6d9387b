"""A trainer-side client of the reward service: verl's ``compute_score`` / ``compute_score_async``.

Use as verl's reward function (0.9.1: ``reward.custom_reward_function.path=pkg://captionrl.serve.client``,
see ``docs/engines.md``). The service URL comes from ``+reward.custom_reward_function.reward_kwargs.url``
(verl passes it to every call) or ``CAPTIONRL_REWARD_URL``
(``http://HOST:PORT``). verl's reward loop calls once per sample, many at once; the service pools the
concurrent calls into one judge batch.

The failure policy is ``captionrl.serve.failure``'s, as verl needs it: verl writes the score into its
reward tensor unmasked (``torch.tensor(scores)`` in ``experimental/reward_loop/reward_loop.py``), so this
client returns only finite scores. While the service answers 503 (its verifier is down past its own
deadline) or cannot be reached, the call is retried until ``CAPTIONRL_REWARD_DEADLINE_S`` (default 300 s);
then, and at once for a 4xx (a malformed label, an unscorable caption with no ``unscored_reward``), it
raises ``BackendError`` with the service's message, which stops verl's step: a reward that is gone is
never a number. Every returned dict has the same keys (verl indexes all samples by the first one's keys).
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from typing import Any

import httpx

from captionrl.errors import BackendError, ConfigError

URL_ENV = "CAPTIONRL_REWARD_URL"
DEADLINE_ENV = "CAPTIONRL_REWARD_DEADLINE_S"
DEFAULT_DEADLINE_S = 300.0
TIMEOUT_S = 600.0
RETRY_S = 1.0


def _url(kwargs: dict[str, Any]) -> str:
    url = kwargs.get("url") or os.environ.get(URL_ENV)
    if not url:
        raise ConfigError(URL_ENV, url, "the reward service's URL is not set",
                          f"set +reward.custom_reward_function.reward_kwargs.url=http://HOST:PORT or export {URL_ENV} "
                          "(start the service with captionrl serve reward)")
    return str(url).rstrip("/") + "/reward"


def _deadline() -> float:
    raw = os.environ.get(DEADLINE_ENV, str(DEFAULT_DEADLINE_S))
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not value >= 0:
        raise ConfigError(DEADLINE_ENV, raw, "must be a number of seconds >= 0", f"export {DEADLINE_ENV}=300")
    return value


def _plain(value: Any) -> Any:
    """verl's ground truth may hold numpy arrays and scalars (parquet rows): JSON needs plain values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _body(solution_str: str, ground_truth: Any) -> dict[str, Any]:
    return {"query": [solution_str], "prompts": [""], "labels": [_plain(ground_truth)]}


def _retryable(reply: httpx.Response | None) -> bool:
    return reply is None or reply.status_code in (502, 503, 504)


def _error(reply: httpx.Response | None, exc: Exception | None) -> str:
    if reply is None:
        return f"{type(exc).__name__}: {exc}"
    try:
        return f"HTTP {reply.status_code}: {reply.json().get('error', reply.text)}"
    except ValueError:
        return f"HTTP {reply.status_code}: {reply.text[:300]}"


def _score(reply: httpx.Response) -> dict[str, Any]:
    if reply.status_code != 200:
        raise BackendError(f"reward service answered {_error(reply, None)}")
    data = reply.json()
    reward = data["rewards"][0]
    if not isinstance(reward, (int, float)) or isinstance(reward, bool) or not math.isfinite(reward):
        raise BackendError(f"reward service sent a non-finite reward {reward!r}: refusing to pass it to verl "
                           "(nothing there masks it); this is a bug in captionrl")
    out: dict[str, Any] = {"score": float(reward)}
    for key, values in data.get("extra_logs", {}).items():
        out[key] = float(values[0])
    out["error"] = (data.get("errors") or [None])[0] or ""
    return out


def _gave_up(waited: float, reply: httpx.Response | None, exc: Exception | None) -> BackendError:
    return BackendError(f"the reward service gave no reward for {waited:.0f}s ({_error(reply, exc)}); refusing to "
                        f"invent one. Fix: restart the service or its verifier, or raise {DEADLINE_ENV}")


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None,
                  **kwargs: Any) -> dict[str, Any]:
    """verl's sync ``compute_score``: the service's reward for one response (see the module docstring)."""
    url, body, t0, deadline = _url(kwargs), _body(solution_str, ground_truth), time.monotonic(), _deadline()
    while True:
        reply, exc = None, None
        try:
            reply = httpx.post(url, json=body, timeout=TIMEOUT_S)
        except httpx.TransportError as e:
            exc = e
        if not _retryable(reply):
            return _score(reply)  # type: ignore[arg-type]
        if time.monotonic() - t0 + RETRY_S > deadline:
            raise _gave_up(time.monotonic() - t0, reply, exc)
        time.sleep(RETRY_S)


async def compute_score_async(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None,
                              **kwargs: Any) -> dict[str, Any]:
    """verl's async ``compute_score`` (its reward loop awaits it; many in flight share the service's batches)."""
    url, body, t0, deadline = _url(kwargs), _body(solution_str, ground_truth), time.monotonic(), _deadline()
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        while True:
            reply, exc = None, None
            try:
                reply = await client.post(url, json=body)
            except httpx.TransportError as e:
                exc = e
            if not _retryable(reply):
                return _score(reply)  # type: ignore[arg-type]
            if time.monotonic() - t0 + RETRY_S > deadline:
                raise _gave_up(time.monotonic() - t0, reply, exc)
            await asyncio.sleep(RETRY_S)
