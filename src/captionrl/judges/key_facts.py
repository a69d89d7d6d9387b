"""Key facts of one caption: the distinct facts about its series it gets right and wrong, and whether it is
a degenerate output (a bare number, a copy of the instruction, a few words).

Why: a caption that copies one value into a fixed sentence ("The series starts at 359.10, which is the first
value in the series.") makes one correct claim on every item, and a share of supported claims calls it
perfect. What a description is worth is how many of the facts a reader needs it states correctly, each
counted once however often it is restated, less the ones it gets wrong. The final checks and a reward
coverage term read ``KeyFacts``; the claims are ``judges.claims.extract_rules`` (numbers and shape) and each
is checked by ``judges.claims.check``, so the tolerances are those of ``judges.shape_claims`` and
``tolerance`` standard deviations for values.

The key facts (``FACTS``): the overall **direction**; the **max value** and **max position**; the **min
value** and **min position**; the **start value**; the **end value**; a **shape** (a stretch, a sequence such
as "rises then falls", a dip or spike, a move to a value); **volatility**; a **magnitude** ("doubles",
"drops sharply"). A fact is correct when at least one claim states it and the series supports every claim
that states it; it is wrong when the series contradicts any of them (a caption that says "rises" and later
"falls" gets the direction wrong, not right). A hedge ("rises or falls") is a wrong fact (``hedge``). Values
at a step, the mean and the spread count as wrong when contradicted and are not key facts when right.

``degenerate`` says why a caption should not be read as a description at all, whatever it states:
``"no words"`` (empty, a bare number, a list of numbers), ``"instruction echoed"`` (at least 6 consecutive
words of the instruction, or half of its word 4-grams; numbers and punctuation ignored, so an echo with the
values filled in is caught too), ``"under 5 words"``. Counts are reported for degenerate captions as well;
the reader decides what a degenerate caption earns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from captionrl.domains.describe import overall_direction
from captionrl.judges.claims import Claim, check, extract_rules
from captionrl.judges.shape_claims import TIE

FACTS = ("direction", "max value", "max position", "min value", "min position", "start value", "end value",
         "shape", "volatility", "magnitude")
DEGENERATE = ("no words", "instruction echoed", "under 5 words")
MIN_WORDS = 5
ECHO_RUN = 6
ECHO_SHARE = 0.5
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?", re.I)


@dataclass(frozen=True)
class Extremum:
    """One placed extremum the caption states: ``where`` is a region name or ``"step N"``."""

    stat: str            # max | min
    where: str
    correct: bool


@dataclass(frozen=True)
class KeyFacts:
    """What one caption gets right and wrong about its series (see the module doc)."""

    words: int                       # words, numbers excluded
    degenerate: str | None           # None, or one of DEGENERATE
    direction: str | None            # the overall direction stated (up | down | flat; the first one), None when
                                     #   none is (a hedge is not one)
    direction_correct: bool | None   # None when no direction is stated
    hedge: bool                      # "rises or falls" and the like
    extrema: tuple[Extremum, ...]
    correct_facts: int               # distinct key facts stated and supported
    wrong_facts: int                 # distinct facts contradicted (a hedge included)
    facts: tuple[str, ...]           # the correct key facts, in FACTS order
    wrong: tuple[str, ...]           # the wrong ones

    @property
    def direction_stated(self) -> bool:
        """An overall direction is asserted (a hedge is not one)."""
        return self.direction is not None

    @property
    def net_facts(self) -> int:
        return self.correct_facts - self.wrong_facts


def words(text: str) -> list[str]:
    """The caption's words, lower-cased; numbers and punctuation dropped."""
    return [w.lower() for w in _WORD.findall(text)]


def echoes_instruction(caption: str, instruction: str, *, run: int = ECHO_RUN, share: float = ECHO_SHARE) -> bool:
    """Whether ``caption`` repeats a long span of ``instruction``: ``run`` consecutive instruction words
    (all of them when the instruction is shorter, at least 3), or ``share`` of its word 4-grams."""
    cw, iw = words(caption), words(instruction)
    if not cw or not iw:
        return False
    need = min(run, max(3, len(iw)))
    longest, prev = 0, [0] * (len(iw) + 1)
    for a in cw:  # longest common run of words (dynamic programming, both short)
        cur = [0] * (len(iw) + 1)
        for j, b in enumerate(iw, 1):
            if a == b:
                cur[j] = prev[j - 1] + 1
                longest = max(longest, cur[j])
        prev = cur
    if longest >= need:
        return True
    grams = {tuple(iw[k:k + 4]) for k in range(len(iw) - 3)}
    if not grams:
        return False
    have = {tuple(cw[k:k + 4]) for k in range(len(cw) - 3)}
    return len(grams & have) / len(grams) >= share


def _near(v: np.ndarray, t0: int, stat: str) -> bool:
    """Whether the series' max (min) lies within max(1, n/10) steps of ``t0`` (up to the near-tie)."""
    n = len(v)
    k = max(1, n // 10)
    seg = v[max(0, t0 - k): t0 + k + 1]
    rng = float(v.max() - v.min()) or 1.0
    if not len(seg):
        return False
    return bool(seg.max() >= v.max() - TIE * rng) if stat == "max" else bool(seg.min() <= v.min() + TIE * rng)


def _facts_of(c: Claim, v: np.ndarray, tol: float) -> list[tuple[str, bool]]:
    """(fact, holds) pairs one checked claim states."""
    ok = c.colour == "green"
    if c.colour not in ("green", "red"):
        return []
    kind = c.kind
    if kind == "hedge":
        return [("hedge", False)]
    if kind == "trend":
        return [("direction", ok)]
    if kind == "extremum":
        return [(f"{c.stat} position", ok)]
    if kind == "stretch":
        return [("shape", ok)]
    if kind in ("volatility", "magnitude"):
        return [(kind, ok)]
    if kind == "stat":
        name = {"max": "max value", "min": "min value", "start": "start value", "end": "end value",
                "mean": "mean value", "std": "spread"}.get(c.stat or "", "value")
        return [(name, ok)]
    if kind == "value" and c.t0 is None and c.stat in ("start", "end"):
        return [(f"{c.stat} value", ok)]
    if kind == "value" and c.t0 is not None and c.stat in ("max", "min") and c.value is not None:
        ref = float(v.max() if c.stat == "max" else v.min())
        return [(f"{c.stat} value", abs(c.value - ref) <= tol), (f"{c.stat} position", _near(v, c.t0, c.stat))]
    if kind == "position" and c.stat in ("max", "min"):
        return [(f"{c.stat} position", ok)]
    if kind == "position" and c.direction:
        return [("shape", ok)]
    return [] if ok else [(f"{kind} claim", False)]


def key_facts(caption: str, series: Any, *, instruction: str | None = None, tolerance: float = 0.35,
              index_base: int = 0) -> KeyFacts:
    """The key facts of ``caption`` about ``series`` (see the module doc)."""
    v = np.asarray(series, dtype=float)
    n_words = len(words(caption))
    degenerate = ("no words" if n_words == 0 else
                  "instruction echoed" if instruction and echoes_instruction(caption, instruction) else
                  "under 5 words" if n_words < MIN_WORDS else None)
    checked = [check(c, v, tolerance) for c in extract_rules(caption, index_base)] if len(v) else []
    tol = tolerance * (float(v.std()) or 1.0) if len(v) else 0.0
    seen: dict[str, list[bool]] = {}
    extrema: list[Extremum] = []
    for c in checked:
        pairs = _facts_of(c, v, tol)
        for name, holds in pairs:
            seen.setdefault(name, []).append(holds)
        if c.kind == "extremum" and c.colour in ("green", "red") and c.stat in ("max", "min"):
            extrema.append(Extremum(c.stat, c.region or "?", c.colour == "green"))
        elif c.kind in ("value", "position") and c.t0 is not None and c.stat in ("max", "min"):
            extrema.append(Extremum(c.stat, f"step {c.t0}", dict(pairs).get(f"{c.stat} position", False)))
    correct = tuple(f for f in FACTS if f in seen and all(seen[f]))
    wrong = tuple(f for f in seen if not all(seen[f]))
    trends = [c for c in checked if c.kind == "trend" and c.colour in ("green", "red")]
    return KeyFacts(words=n_words, degenerate=degenerate, direction=trends[0].direction if trends else None,
                    direction_correct=all(c.colour == "green" for c in trends) if trends else None,
                    hedge=any(c.kind == "hedge" for c in checked), extrema=tuple(extrema),
                    correct_facts=len(correct), wrong_facts=len(wrong), facts=correct, wrong=wrong)


def with_labelled_direction(facts: KeyFacts, series: Any) -> KeyFacts:
    """``facts`` with the overall direction judged against the window's one label
    (``domains.describe.overall_direction``): right only when the stated direction is that label.

    Why: the claim checker accepts a direction within a tolerance ("stays roughly flat" of a window that rises
    by less than a tolerance passes), which is right for judging whether a caption is false, but a reward that
    pays it makes "flat" a soft spot: on the main job's balanced training windows "flat" said of every window
    was paid the direction on 45% of them against 33% for a constant "rises", and RL learned to say it of
    every window (docs/main-job.md). Against the label each constant word is paid exactly its share, so only a
    direction that tracks the window beats a constant one. A direction the checker tolerated but that is not
    the label becomes a wrong fact; one the checker contradicts stays wrong."""
    if facts.direction is None or not facts.direction_correct:
        return facts
    if facts.direction == overall_direction(np.asarray(series, dtype=float)):
        return facts
    return replace(facts, direction_correct=False, correct_facts=facts.correct_facts - 1,
                   wrong_facts=facts.wrong_facts + 1, facts=tuple(f for f in facts.facts if f != "direction"),
                   wrong=(*facts.wrong, "direction"))


__all__ = ["DEGENERATE", "FACTS", "Extremum", "KeyFacts", "echoes_instruction", "key_facts", "with_labelled_direction",
           "words"]
