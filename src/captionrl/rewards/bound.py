"""A bound on lost reward: a run whose reward is gone stops and says so, instead of ending green.

An unscored caption (``None``) is right for one outage: TRL gives it zero advantage, nothing is learnt
from the failure. But a verifier that stays down turns every step into a zero-advantage step, and the
run finishes normally having learnt nothing. ``RewardBound`` holds the settings every recipe shares
(``reward.max_unscored_frac``, ``reward.unscored_patience``, ``reward.max_fallback_frac``);
``RewardHealth`` is what a reward callable counts per call (how many captions, how many unscored, how
many scored by a fallback rubric, the last error); ``LossTracker`` turns those counts into a verdict per
optimizer step. The trainer side (``captionrl.train.run.callbacks.RewardBoundCallback``) saves a checkpoint,
stops the run and raises ``RewardLostError`` with one line naming the judge, the last error and how to resume.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from captionrl.config import help_field
from captionrl.errors import ConfigError


@dataclass
class RewardBound:
    """How much reward a run may lose before it stops (a mixin of every recipe's ``reward`` section)."""

    FIELD_PREFIX: ClassVar[str] = "reward"

    max_unscored_frac: float = help_field(0.5, "a step whose share of unscored captions (the judge failed: outage, timeout, unparseable reply) is above this counts as lost; 1.0 = never")
    unscored_patience: int = help_field(5, "after this many lost steps in a row the run saves a checkpoint, stops and exits non-zero naming the judge and its last error (rerun the same command to resume)")
    max_fallback_frac: float = help_field(0.5, "online rubrics (MoCo): a step whose share of groups scored by the facts fallback instead of a generated rubric is above this counts as lost too; 1.0 = never")

    def __post_init__(self) -> None:
        f = self.FIELD_PREFIX
        for name in ("max_unscored_frac", "max_fallback_frac"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ConfigError(f"{f}.{name}", value, "must be a share in [0, 1]",
                                  f"set {f}.{name}: 0.5 (1.0 switches the bound off)")
        if isinstance(self.unscored_patience, bool) or not isinstance(self.unscored_patience, int) \
                or self.unscored_patience < 1:
            raise ConfigError(f"{f}.unscored_patience", self.unscored_patience, "must be an integer >= 1",
                              f"set {f}.unscored_patience: 5")
        parent = getattr(super(), "__post_init__", None)  # cooperative: the recipe's own reward settings
        if parent is not None:
            parent()


@dataclass
class RewardHealth:
    """What one reward callable lost since the last look: captions, unscored ones, fallback-scored groups."""

    judge: str
    captions: int = 0
    unscored: int = 0
    groups: int = 0
    fallback_groups: int = 0
    last_error: str | None = None

    def record(self, scores: Sequence[float | None], errors: Sequence[str | None] = ()) -> None:
        """Count one call's scores (``None`` = unscored) and keep its last error."""
        self.captions += len(scores)
        self.unscored += sum(s is None for s in scores)
        for e in errors:
            if e:
                self.last_error = e

    def record_fallback(self, groups: int, fallback: int, error: str | None = None) -> None:
        """Count one call's rubric groups and how many of them a fallback rubric scored."""
        self.groups += groups
        self.fallback_groups += fallback
        if error:
            self.last_error = error

    def take(self) -> tuple[int, int, int, int]:
        """(captions, unscored, groups, fallback groups) since the last ``take``; the counters restart."""
        counts = (self.captions, self.unscored, self.groups, self.fallback_groups)
        self.captions = self.unscored = self.groups = self.fallback_groups = 0
        return counts


def health_of(reward: Any) -> RewardHealth | None:
    """The ``RewardHealth`` a reward callable keeps (the TRL face ``rewards.trl_face.RewardFunction`` keeps one), or ``None``."""
    health = getattr(reward, "health", None)
    return health if isinstance(health, RewardHealth) else None


@dataclass
class LossTracker:
    """Per optimizer step: is the share of lost reward above the bound, and for how many steps in a row?

    A step without reward calls (a generation batch serves several steps) leaves the streak as it is."""

    bound: RewardBound
    streaks: dict[tuple[str, str], int] = field(default_factory=dict)
    first_step: dict[tuple[str, str], int] = field(default_factory=dict)

    def step(self, step: int, name: str, counts: Sequence[int]) -> tuple[str, float, int] | None:
        """Update with one reward's counts (captions, unscored, groups, fallback); returns (what, share,
        streak) when that reward has now been lost for ``unscored_patience`` steps, else ``None``."""
        captions, unscored, groups, fallback = counts
        verdict = None
        for what, total, lost, limit in (("unscored", captions, unscored, self.bound.max_unscored_frac),
                                         ("fallback", groups, fallback, self.bound.max_fallback_frac)):
            if total <= 0:
                continue
            key = (name, what)
            share = lost / total
            if share > limit:
                self.streaks[key] = self.streaks.get(key, 0) + 1
                self.first_step.setdefault(key, step)
            else:
                self.streaks[key] = 0
                self.first_step.pop(key, None)
            if self.streaks[key] >= self.bound.unscored_patience and verdict is None:
                verdict = (what, share, self.streaks[key])
        return verdict


def lost_message(judge: str, what: str, share: float, streak: int, first: int, last: int, bound: RewardBound,
                 last_error: str | None, checkpoint: str | None) -> str:
    """The one line a run stopped by the bound ends with: judge, share, steps, last error, how to resume."""
    f = bound.FIELD_PREFIX
    if what == "fallback":
        lost = (f"scored {share:.0%} of its rubric groups with the facts fallback instead of a generated rubric "
                f"for {streak} step(s) in a row (steps {first}-{last}; {f}.max_fallback_frac="
                f"{bound.max_fallback_frac}, {f}.unscored_patience={bound.unscored_patience})")
    else:
        lost = (f"left {share:.0%} of the captions unscored for {streak} step(s) in a row (steps {first}-{last}; "
                f"{f}.max_unscored_frac={bound.max_unscored_frac}, {f}.unscored_patience={bound.unscored_patience})")
    error = " ".join((last_error or "none recorded").split())
    if len(error) > 300:
        error = error[:297] + "..."
    saved = f"checkpoint saved at {checkpoint}" if checkpoint else "no checkpoint could be saved"
    return (f"reward lost: judge {judge!r} {lost}; last error: {error}; {saved}. Fix: bring the judge back "
            f"(is its server up? does the model load?), then rerun the same command to resume from the checkpoint "
            f"(or raise {f}.max_unscored_frac / {f}.unscored_patience to tolerate it)")
