"""Judges -> TRL reward callables.

TRL 1.16 calls ``f(prompts, completions, completion_ids, **columns, trainer_state, log_extra, log_metric)``
and expects one float (or ``None``, turned into NaN and skipped) per completion. ``JudgeReward`` adapts
any ``Judge``: it extracts the caption text, forwards the dataset columns, returns the judgments' scores
(``None`` where the judge could not score: an outage is never learned as a 0) and logs the judge's extra
fields (hard/soft accuracy, failures) through ``log_metric``/``log_extra`` when TRL provides them. Its
``health`` (``rewards.bound.RewardHealth``) counts the unscored captions and the last error, which the
trainer's reward bound reads every step: a reward that stays gone stops the run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from captionrl.judges.base import Judge
from captionrl.rewards.bound import RewardHealth
from captionrl.types import Judgment

TRL_SPECIAL_KWARGS = ("trainer_state", "log_extra", "log_metric", "environments")


def completion_text(completion: Any) -> str:
    """The caption text of a TRL completion: a string, or a list of chat messages (last one's content)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion:
        content = completion[-1].get("content", "")
        if isinstance(content, list):  # content parts
            return "".join(p.get("text", "") for p in content if p.get("type") == "text")
        return str(content)
    if isinstance(completion, dict):
        return str(completion.get("content", ""))
    return ""


def judge_label(judge: Any) -> str:
    """The judge's name and, when it has one, its backend's (which server or model to bring back)."""
    backend = getattr(getattr(judge, "backend", None), "name", None)
    return f"{judge.name} on {backend}" if isinstance(backend, str) else str(judge.name)


def _mean(values: Sequence[float | None]) -> float:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    return sum(vals) / len(vals) if vals else float("nan")


class JudgeReward:
    """A TRL reward function backed by a judge.

    Args:
        judge: any object with ``judge(captions, columns) -> list[Judgment]``.
        name: the reward's name in TRL's logs (``rewards/<name>/mean``).
        log_fields: numeric ``Judgment.extra`` fields averaged into ``<name>/<field>`` metrics.
        on_judgments: optional hook receiving (captions, columns, judgments), e.g. to write records.
    """

    def __init__(
        self,
        judge: Judge,
        name: str | None = None,
        log_fields: Sequence[str] = ("hard", "soft"),
        on_judgments: Callable[[list[str], dict[str, list[Any]], list[Judgment]], None] | None = None,
    ) -> None:
        self.judge = judge
        self.__name__ = name or judge.name.replace("-", "_")
        self.log_fields = tuple(log_fields)
        self.on_judgments = on_judgments
        self.calls = 0
        self.failures = 0
        self.health = RewardHealth(judge_label(judge))

    def __call__(
        self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] = (), completion_ids: Any = None, **kwargs: Any
    ) -> list[float | None]:
        captions = [completion_text(c) for c in completions]
        columns = {k: list(v) for k, v in kwargs.items() if k not in TRL_SPECIAL_KWARGS and isinstance(v, (list, tuple))}
        judgments = self.judge.judge(captions, columns)
        scores = [j.score if j.scored else None for j in judgments]
        self.calls += len(scores)
        n_failed = sum(s is None for s in scores)
        self.failures += n_failed
        self.health.record(scores, [j.error for j in judgments if not j.scored])
        log_metric = kwargs.get("log_metric")
        if callable(log_metric):
            log_metric(f"{self.__name__}/unscored_frac", n_failed / max(len(scores), 1))
            for field in self.log_fields:
                value = _mean([j.extra.get(field) for j in judgments if j.scored])
                if not math.isnan(value):
                    log_metric(f"{self.__name__}/{field}", value)
        log_extra = kwargs.get("log_extra")
        if callable(log_extra):
            log_extra(f"{self.__name__}_error", [j.error or "" for j in judgments])
        if self.on_judgments is not None:
            self.on_judgments(captions, columns, judgments)
        return scores


def make_identification_reward(backend: Any, cfg: Any = None, name: str = "identification") -> JudgeReward:
    """The LineupRL reward: lambda * identification accuracy of the caption under a frozen verifier."""
    from captionrl.judges.identification import IdentificationJudge, IdentifyConfig

    judge = IdentificationJudge(backend, cfg or IdentifyConfig())
    return JudgeReward(judge, name=name, log_fields=("hard", "soft"))
