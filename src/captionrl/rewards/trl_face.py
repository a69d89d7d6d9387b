"""The TRL face of the one reward: ``RewardFunction``, a TRL reward callable over a ``rewards.reward.Reward``.

TRL 1.16 calls ``f(prompts, completions, completion_ids, **columns, trainer_state, log_extra, log_metric)``
and expects one float (or ``None``, turned into NaN and skipped) per completion. ``RewardFunction`` is that
callable over a ``Reward`` (``rewards.reward``): it extracts the caption text, forwards the dataset columns,
returns the shaped judgments' scores (``None`` where the judge could not score: an outage is never learned as
a 0), logs the family's fields and the shaping terms through ``log_metric``/``log_extra`` when TRL provides
them, and writes one sample record per caption when given a sample log. Its ``health``
(``rewards.bound.RewardHealth``) counts the unscored captions and the last error, which the trainer's reward
bound reads every step: a reward that stays gone stops the run. It follows TRL's callable contract and
imports nothing of TRL (only ``train/`` imports ``trl``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from typing import Any

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


class RewardFunction:
    """The TRL face of a ``Reward``: ``f(prompts, completions, **columns) -> list[float | None]``.

    Args:
        reward: a ``rewards.reward.Reward`` (or any object with ``score(captions, columns)`` and ``family``).
        name: the reward's name in TRL's logs (``rewards/<name>/mean``); default: the reward's.
        log_fields: numeric ``Judgment.extra`` fields averaged into ``<family>/<field>`` metrics; default:
            the family's own (``rewards.reward.FAMILY_FIELDS``).
        samples: optional sample log (``write(step, rows)``): one record per caption, ``sample_row``'s.
    """

    def __init__(self, reward: Any, name: str | None = None, log_fields: Sequence[str] | None = None,
                 samples: Any = None) -> None:
        from captionrl.rewards.reward import FAMILY_FIELDS

        self.reward = reward
        self.family = str(getattr(reward, "family", None) or reward.name)
        self.__name__ = (name or reward.name).replace("-", "_")
        self.log_fields = tuple(FAMILY_FIELDS.get(self.family, ()) if log_fields is None else log_fields)
        self.samples = samples
        self.health = RewardHealth(judge_label(getattr(reward, "base", reward)))

    @property
    def judge(self) -> Any:
        """The family's judge behind the reward (what the recipes and the preflight inspect)."""
        return getattr(self.reward, "base", self.reward)

    def quiet(self) -> RewardFunction:
        """The same reward writing no sample records and counting apart (the preflight's probes, checkpoint
        selection): the training run's samples and its reward bound see training captions only."""
        twin = copy.copy(self)
        twin.samples = None
        twin.health = RewardHealth(self.health.judge)
        return twin

    def __call__(self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] = (),
                 completion_ids: Any = None, **kwargs: Any) -> list[float | None]:
        captions = [completion_text(c) for c in completions]
        columns = {k: list(v) for k, v in kwargs.items() if k not in TRL_SPECIAL_KWARGS and isinstance(v, (list, tuple))}
        judgments = self.reward.score(captions, columns)
        scores = [j.score if j.scored else None for j in judgments]
        self.health.record(scores, [j.error for j in judgments if not j.scored])
        log_metric = kwargs.get("log_metric")
        if callable(log_metric):
            for key, value in self.metrics(captions, columns, judgments).items():
                log_metric(key, value)
        log_extra = kwargs.get("log_extra")
        if callable(log_extra):
            log_extra(f"{self.family}_error", [j.error or "" for j in judgments])
            for key in ("copied_values", "red_share"):
                if any(key in j.extra for j in judgments):
                    log_extra(key, [float(j.extra.get(key, math.nan)) for j in judgments])
            log_extra("shaped_reward", [s if s is not None else math.nan for s in scores])
        if self.samples is not None:
            state = kwargs.get("trainer_state")
            rows = [self.sample_row(i, captions[i], columns, j) for i, j in enumerate(judgments)]
            self.samples.write(int(getattr(state, "global_step", -1)) if state is not None else -1, rows)
        return scores

    def metrics(self, captions: Sequence[str], columns: Mapping[str, Sequence[Any]],
                judgments: Sequence[Judgment]) -> dict[str, float]:
        """One call's metrics: the unscored share, the family's fields over scored captions, the shaping terms."""
        from captionrl.rewards.shaping import metrics as shaping_metrics

        n_failed = sum(not j.scored for j in judgments)
        out = {f"{self.family}/unscored_frac": n_failed / max(len(judgments), 1),
               "verifier_failures": float(n_failed)}
        for field in self.log_fields:
            value = _mean([j.extra.get(field) for j in judgments if j.scored])
            if not math.isnan(value):
                out[f"{self.family}/{field}"] = value
        out.update(shaping_metrics([j.extra for j in judgments]))
        return out

    def sample_row(self, i: int, caption: str, columns: Mapping[str, Sequence[Any]], j: Judgment) -> dict[str, Any]:
        """The sample record of caption ``i``: the item, the caption, the reward, every numeric field of the
        judgment (the family's and each shaping term) and its error."""
        from captionrl.rewards.reward import sample_extras

        ids = columns.get("item_id")
        return {"item_id": ids[i] if ids else None, "caption": caption, "family": self.family,
                **sample_extras(j), "reward": j.score if j.scored else None, "error": j.error, "method": j.method}
