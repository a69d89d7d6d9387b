"""One failure policy for every path to another engine: the reward service, its verl client, the adapters.

Why one policy, and why this one: neither engine masks a reward (read from their code; see
``docs/engines.md``). OpenRLHF 0.11 puts each reply's ``rewards``/``scores`` through
``torch.tensor([value])`` and subtracts group baselines with no mask, so one NaN poisons every advantage of
its group; a reward that stays ``None`` (its client gave up after 5 tries) makes the batch's
``torch.cat`` fail, which stops the run. verl writes each ``compute_score`` result into its reward tensor
with ``torch.tensor(scores)``: a NaN flows into the group's advantage, ``None`` or an exception stops the
run. TRL is the only trainer that masks (``None`` -> NaN -> skipped), and it has its own reward callables.

So a caption ends in exactly one of three ways, never as NaN and never as a fabricated 0:

- **scored**: a finite reward.
- **outage** (the verifier cannot be reached, times out, answers 5xx/429, runs out of memory): retried
  until ``outage_deadline_s`` has passed, then the request fails loudly (the service answers HTTP 503, the
  client and the adapters raise ``VerifierOutage``), so the engine's own retry applies and, when that is
  spent, the run stops naming the verifier. A reward that is gone is not learned as a number.
- **unscorable** (the verifier answered but its reply gives no score, e.g. no grade in the text): the value
  the user chose for this engine (``unscored_reward``), flagged ``unscored`` in the reply and counted. With
  no value chosen, the request is refused (HTTP 422 / ``UnscorableCaption``) saying how to choose one.

A judge that returns a non-finite score for a caption it claims to have scored is treated as unscorable.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from captionrl.errors import BackendError, ConfigError
from captionrl.types import Judgment

Outcome = Literal["scored", "outage", "unscorable"]

OUTAGE_PATTERN = re.compile(
    r"connection error|timeout after|failed after \d+ attempt|HTTP (?:429|5\d\d)\b|out of memory|MemoryError"
    r"|ConnectError|ConnectTimeout|ReadTimeout|RemoteProtocolError",
    re.IGNORECASE,
)
"""What an unscored judgment's error says when the verifier itself failed rather than its reply: the
messages of ``backends.openai_http`` (connection error, timeout, retries spent on 5xx/429) and of a model
call that ran out of memory. Anything else (a reply that does not parse, an HTTP 4xx such as a prompt too
long for the model) is the caption's own: retrying cannot change it."""


def classify(judgment: Judgment) -> Outcome:
    """Which of the three ends this judgment is (see the module docstring)."""
    if judgment.score is not None:
        return "scored" if math.isfinite(float(judgment.score)) else "unscorable"
    return "outage" if OUTAGE_PATTERN.search(judgment.error or "") else "unscorable"


class VerifierOutage(BackendError):
    """The verifier stayed unreachable past the policy's deadline: no reward exists for these captions."""

    def __init__(self, error: str, waited_s: float, n: int) -> None:
        self.error = error
        self.waited_s = waited_s
        self.n = n
        super().__init__(
            f"the verifier could not score {n} caption(s) for {waited_s:.0f}s ({error}); refusing to invent a "
            "reward. Fix: restart the verifier server or add replicas (backend.base_url a|b); raise "
            "outage_deadline_s to wait longer")


class UnscorableCaption(BackendError):
    """The verifier answered but gave no score, and no value for unscorable captions was chosen."""

    def __init__(self, error: str, setting: str) -> None:
        self.error = error
        self.setting = setting
        super().__init__(
            f"the judge could not score a caption ({error}) and no reward for unscorable captions was chosen. "
            f"Fix: set {setting} to the reward this engine should give such a caption (e.g. the reward's "
            "minimum); it is flagged 'unscored' and counted, never silently 0")


@dataclass(frozen=True)
class FailurePolicy:
    """What an unscored caption becomes on a path to an engine that masks nothing."""

    unscored_reward: float | None = None
    """Reward of an unscorable caption (finite); None: refuse the request instead."""
    outage_deadline_s: float = 60.0
    """How long an outage is retried before the request fails (OpenRLHF's client gives up at 180 s)."""
    retry_interval_s: float = 1.0
    """Pause between retries of the captions an outage left unscored."""
    setting: str = "unscored_reward"
    """How the user sets ``unscored_reward`` on this path (named in the error)."""

    def __post_init__(self) -> None:
        if self.unscored_reward is not None and not math.isfinite(float(self.unscored_reward)):
            raise ConfigError(self.setting, self.unscored_reward, "must be a finite number: neither OpenRLHF nor "
                              "verl masks NaN or inf", f"set {self.setting} to a finite reward, e.g. the reward's minimum")
        if not self.outage_deadline_s >= 0:
            raise ConfigError("outage_deadline_s", self.outage_deadline_s, "must be >= 0",
                              "set outage_deadline_s: 60 (below the client's own timeout)")
        if not self.retry_interval_s > 0:
            raise ConfigError("outage_retry_s", self.retry_interval_s, "must be > 0", "set outage_retry_s: 1")


@dataclass(frozen=True)
class Settled:
    """One caption's reward as an engine receives it: always finite."""

    reward: float
    scored: bool
    error: str | None


def settle(judgments: Sequence[Judgment], policy: FailurePolicy, waited_s: float | None = None) -> list[Settled]:
    """Finite rewards for judgments whose outages were already retried (for ``waited_s``); raises
    ``VerifierOutage`` or ``UnscorableCaption`` when no reward may be given."""
    outages = [j for j in judgments if classify(j) == "outage"]
    if outages:
        waited = policy.outage_deadline_s if waited_s is None else waited_s
        raise VerifierOutage(outages[0].error or "unscored", waited, len(outages))
    out = []
    for j in judgments:
        if classify(j) == "scored":
            out.append(Settled(float(j.score), True, None))  # type: ignore[arg-type]
            continue
        error = j.error or (f"non-finite score {j.score}" if j.score is not None else "unscored")
        if policy.unscored_reward is None:
            raise UnscorableCaption(error, policy.setting)
        out.append(Settled(float(policy.unscored_reward), False, error))
    return out


def _pending(judgments: Sequence[Judgment]) -> list[int]:
    return [i for i, j in enumerate(judgments) if classify(j) == "outage"]


async def judge_through_outages(judge: Callable[[list[int]], Awaitable[list[Judgment]]], n: int,
                                policy: FailurePolicy, sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                                ) -> tuple[list[Judgment], int]:
    """Judge captions ``0..n-1`` (``judge(indices)`` scores a subset), re-judging those an outage left
    unscored until the deadline; returns the judgments and the number of retries made."""
    deadline = time.monotonic() + policy.outage_deadline_s
    judgments = list(await judge(list(range(n))))
    retries = 0
    while (pending := _pending(judgments)) and time.monotonic() + policy.retry_interval_s <= deadline:
        await sleep(policy.retry_interval_s)
        retries += 1
        for i, j in zip(pending, await judge(pending), strict=True):
            judgments[i] = j
    return judgments, retries


@dataclass(frozen=True)
class LabelScores:
    """One request's captions as an engine receives them: the judgments, their finite rewards, the log
    fields (``finite_logs``) and how many re-judgings an outage took."""

    judgments: list[Judgment]
    settled: list[Settled]
    logs: dict[str, list[float]]
    retries: int


async def score_labels(judge: Callable[[list[int]], Awaitable[list[Judgment]]], n: int, policy: FailurePolicy,
                       log_keys: Sequence[str], *, sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                       ) -> LabelScores:
    """Label scoring on every path to an engine (the reward service, the adapters): judge captions
    ``0..n-1`` of rows already parsed from their labels (``serve.labels.label_rows``) through outages,
    settle them under ``policy`` and give the fixed set of log fields. Raises ``VerifierOutage`` or
    ``UnscorableCaption`` where no reward may be given."""
    t0 = time.monotonic()
    judgments, retries = await judge_through_outages(judge, n, policy, sleep)
    settled = settle(judgments, policy, waited_s=time.monotonic() - t0)
    return LabelScores(judgments, settled, finite_logs(judgments, settled, log_keys), retries)


def score_labels_sync(judge: Callable[[list[int]], list[Judgment]], n: int, policy: FailurePolicy,
                      log_keys: Sequence[str]) -> LabelScores:
    """``score_labels`` for in-process callers without an event loop (the adapters, often in an engine's
    worker thread): the same code, its awaits completing at once (a blocking judge call, a blocking sleep)."""

    async def judged(indices: list[int]) -> list[Judgment]:
        return judge(indices)

    async def slept(seconds: float) -> None:
        time.sleep(seconds)

    coroutine = score_labels(judged, n, policy, log_keys, sleep=slept)
    try:
        coroutine.send(None)  # never suspends: nothing in it waits on an event loop
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coroutine.close()
    raise RuntimeError("score_labels_sync: the scoring coroutine waited on an event loop")


def finite_logs(judgments: Sequence[Judgment], settled: Sequence[Settled], keys: Sequence[str]) -> dict[str, list[float]]:
    """Per-caption log fields with one fixed key set (verl reads the keys of its first sample and indexes
    every other by them; OpenRLHF concatenates each key's values across samples): ``unscored`` (0/1)
    and each of ``keys``. A field the judge did not give for a caption (an unscored caption has none), or
    gave as a non-finite number, repeats that caption's reward; read ``unscored`` to filter them."""
    logs: dict[str, list[float]] = {"unscored": [0.0 if s.scored else 1.0 for s in settled]}
    for key in keys:
        vals: list[float] = []
        for j, s in zip(judgments, settled, strict=True):
            v: Any = j.extra.get(key) if s.scored else None
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
            vals.append(float(v) if ok else s.reward)
        logs[key] = vals
    return logs
