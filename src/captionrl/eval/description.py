"""What a caption describes, checked by code, and the one-line verdict of a run against the model it started from.

Checks that read numbers alone call copying an improvement: a captioner that writes "355.10" or "The series
starts at 359.10, which is the first value in the series." for every window scores well on a span audit,
because one correct value is a share of 1.0 of its claims. These checks read description instead
(``judges.key_facts``, on the claim layer's shape claims):

- ``direction_stated`` / ``direction_right``: the caption says whether the series rises, falls or stays flat
  (a hedge such as "rises or falls" is no statement), and the series agrees;
- ``direction_skill``: ``direction_right`` less the share of the held-out windows that the direction stated
  would be right about, said of every window (0 when none is stated): what a right direction is worth beyond
  guessing. A captioner that says "rising" of every window is right on the 57% of windows that rise, and has
  a skill of 0: it says nothing about the window in hand, however varied its wording. The share is measured by the claim checker that judges the caption (``guess_rates``), not by
  the direction's label: "stays roughly flat" is judged right within a tolerance, so it is right about more
  windows than are labelled flat, and a label-based guess would give "flat" said of every window a skill
  above 0;
- ``extrema_named`` / ``extrema_right``: peaks and troughs named with their position, and how many are right;
- ``key_facts`` / ``wrong_facts``: distinct correct key facts (direction, start, end, max and its position,
  min and its position, a turning point, volatility), each counted once however often restated / distinct
  facts the series contradicts (a hedge is one); ``other_facts``: the correct key facts besides the direction
  (which ``direction_skill`` judges);
- ``degenerate``: under 5 words, no words at all (a bare number), or the instruction echoed;
- ``same_sentence``: the share of captions that are one template sentence with the numbers changed, said
  whatever the window (the same text once numbers are masked as at least a quarter of the other captions,
  and wrong about the windows it is used for at least as often as its direction said of every window would
  be: "..., and is rising overall." said of falling windows too). A fixed answer form whose direction tracks
  the window is terse, not degenerate.

``verdict`` compares the trained captioner with a reference model (the model its RL started from: a warm start
where the run has one, else the initial model) item by item (paired 95% t-intervals over
the held-out windows) and says **better**, **not better** or **worse**, naming the checks that decided it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from captionrl.eval.stats import mean_interval

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")

PER_ITEM = ("direction_stated", "direction_right", "direction_skill", "extrema_named", "extrema_right", "key_facts",
            "other_facts", "wrong_facts", "degenerate", "same_sentence")
"""The per-caption description checks (each a number per held-out window)."""


def same_sentence_flags(captions: Mapping[str, str], wrong: Mapping[str, bool] | None = None,
                        share: float = 0.25, guess_wrong: Mapping[str, float] | None = None) -> dict[str, float]:
    """1.0 for a caption whose text with its numbers masked is shared by at least ``share`` of the other
    captions and, when ``wrong`` is given, whose shared text does not track the window (one template said
    whatever the window), else 0.0. Empty captions are never a template here (``degenerate`` counts them).

    Tracking: the shared text is wrong on a share of the windows it is used for at least as large as
    ``guess_wrong`` (per caption: how often it would be wrong said of every window, i.e. one minus its direction's
    ``guess_rates`` share; default 0: any wrong use). ``description_checks`` counts a use wrong when its
    direction is (or is missing), the same question the bar answers: a wrong value in a form that reads the
    direction is a wrong fact (``wrong_facts``, ``red``), not a template. Why not "wrong on one window":
    a fixed answer form is what the instruction asks for, and a captioner that uses one form of most windows but
    says "rises" mostly of rising ones reads the direction, while a template said whatever the window is wrong on
    its windows at least as often as the guess."""
    masked = {i: " ".join(NUMBER.sub("#", c).lower().split()) for i, c in captions.items()}
    counts = Counter(m for m in masked.values() if m)
    others = max(1, len(captions) - 1)
    uses: dict[str, list[str]] = {}
    for i, m in masked.items():
        uses.setdefault(m, []).append(i)

    def blind(m: str) -> bool:
        if wrong is None:
            return True
        ids = uses[m]
        rate = float(np.mean([bool(wrong.get(i)) for i in ids]))
        bar = float(np.mean([(guess_wrong or {}).get(i, 0.0) for i in ids]))
        return rate > 0 and rate >= bar - 1e-9  # said of every window, it is wrong exactly as often as the guess

    return {i: float(bool(m) and (counts[m] - 1) / others >= share and blind(m)) for i, m in masked.items()}


DIRECTION_SENTENCES = {"up": "Overall, the series rises.", "down": "Overall, the series falls.",
                       "flat": "Overall, the series stays roughly flat."}
"""One plain sentence per overall direction: what ``guess_rates`` says of every window."""


def guess_rates(series: Mapping[str, np.ndarray], *, tolerance: float = 0.35) -> dict[str, float]:
    """Per direction (up, down, flat), the share of ``series`` that saying it of every window is right about,
    judged by the claim checker that judges captions (``judges.key_facts``), so that a template said of every
    window scores exactly its guess: a window can admit two directions (a slow fall is "flat" within the
    tolerance too), and the direction's label would undercount them."""
    from captionrl.judges.key_facts import key_facts

    if not series:
        return {}
    return {d: float(np.mean([bool(key_facts(sentence, v, tolerance=tolerance).direction_correct)
                              for v in series.values()]))
            for d, sentence in DIRECTION_SENTENCES.items()}


def description_checks(captions: Mapping[str, str], series: Mapping[str, Any], *, instruction: str | None = None,
                       tolerance: float = 0.35) -> dict[str, dict[str, float]]:
    """Per check of ``PER_ITEM``, item id -> value, for the captions whose item has a series."""
    from captionrl.judges.key_facts import key_facts

    values = {i: np.asarray(series[i], dtype=float) for i in captions if i in series}
    ids = list(values)
    out: dict[str, dict[str, float]] = {k: {} for k in PER_ITEM}
    wrong: dict[str, bool] = {}
    guess_wrong: dict[str, float] = {}
    right_if_said_everywhere = guess_rates(values, tolerance=tolerance)
    for i in ids:
        kf = key_facts(captions[i], values[i], instruction=instruction, tolerance=tolerance)
        out["direction_stated"][i] = float(kf.direction_stated)
        out["direction_right"][i] = float(bool(kf.direction_correct))
        guess = right_if_said_everywhere.get(kf.direction, 0.0)  # 0 when no direction is stated
        out["direction_skill"][i] = float(bool(kf.direction_correct)) - guess
        out["other_facts"][i] = float(kf.correct_facts - ("direction" in kf.facts))
        out["extrema_named"][i] = float(len(kf.extrema))
        out["extrema_right"][i] = float(sum(bool(e.correct) for e in kf.extrema))
        out["key_facts"][i] = float(kf.correct_facts)
        out["wrong_facts"][i] = float(kf.wrong_facts)
        out["degenerate"][i] = float(kf.degenerate is not None)
        wrong[i] = not kf.direction_correct  # the template question is the direction's: the bar below is its guess
        guess_wrong[i] = 1.0 - guess if kf.direction else 0.0
    out["same_sentence"] = same_sentence_flags({i: captions[i] for i in ids}, wrong, guess_wrong=guess_wrong)
    return out


def summarise(per_item: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
    """Each check's mean over the items and its 95% interval (``<check>_ci``)."""
    row: dict[str, Any] = {}
    for key, values in per_item.items():
        vals = list(values.values())
        row[key] = round(float(np.mean(vals)), 4) if vals else None
        mi = mean_interval(vals)
        if mi is not None and key != "same_sentence":
            row[f"{key}_ci"] = [round(mi[1], 4), round(mi[2], 4)]
    return row


@dataclass(frozen=True)
class Comparison:
    """Trained minus initial on one check, paired over the held-out items."""

    check: str
    diff: float
    lo: float
    hi: float
    higher_is_better: bool

    @property
    def better(self) -> bool:
        return self.lo > 0 if self.higher_is_better else self.hi < 0

    @property
    def worse(self) -> bool:
        return self.hi < 0 if self.higher_is_better else self.lo > 0

    def text(self) -> str:
        return f"{self.check} {self.diff:+.3f} [{self.lo:+.3f}, {self.hi:+.3f}]"


@dataclass(frozen=True)
class Verdict:
    """The run against its reference model: ``better``, ``not better`` or ``worse``, and why."""

    outcome: str
    reasons: list[str]
    comparisons: list[Comparison] = field(default_factory=list)
    degenerated: bool = False
    reference: str = "the initial model"

    def line(self) -> str:
        return f"verdict against {self.reference}: {self.outcome.upper()}: " + "; ".join(self.reasons)

    def to_json(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "degenerated": self.degenerated, "reasons": self.reasons, "line": self.line(),
                "reference": self.reference,
                "comparisons": [{"check": c.check, "diff": round(c.diff, 4), "ci": [round(c.lo, 4), round(c.hi, 4)],
                                 "higher_is_better": c.higher_is_better} for c in self.comparisons]}


EVAL_IDENTIFICATION = "c2s_eval"
"""The per-item check of held-out identification: per window, the mean probability the evaluation verifiers
(never the training verifier) put on the true series among its candidates."""

DESCRIBES_MORE = ("direction_skill", "other_facts", EVAL_IDENTIFICATION)
"""The checks whose rise beyond its interval makes a run better: the caption says more that is right."""

DECIDING = (("direction_skill", True), ("other_facts", True), (EVAL_IDENTIFICATION, True), ("red", False),
            ("bottleneck_mse", False))
"""The checks a verdict weighs, and which way is better. Describing more (a direction beyond guessing, other
key facts, captions by which verifiers that took no part in training pick the window out: ``c2s_eval``) makes a
run better; contradicting the series more, or carrying less of it (the caption-only reconstruction), or being
identified less, makes it worse. A direction said of every window is no skill, so neither it nor the direction
fact it earns on the windows it fits can make a run better."""

DEGENERATE_SHARE = 0.5
"""A run whose captions are degenerate (or one template sentence) this often has degenerated."""


def compare(trained: Mapping[str, float], initial: Mapping[str, float], check: str,
            higher_is_better: bool) -> Comparison | None:
    """The paired difference over the items both systems have, with its 95% t-interval."""
    ids = [i for i in trained if i in initial]
    mi = mean_interval([trained[i] - initial[i] for i in ids])
    if mi is None:
        return None
    return Comparison(check, *mi, higher_is_better)


def verdict(trained: Mapping[str, Mapping[str, float]], initial: Mapping[str, Mapping[str, float]],
            reference: str = "the initial model") -> Verdict:
    """Trained vs a reference model (``initial``: the model RL started from, or the untrained one) on per-item
    checks (``PER_ITEM`` plus ``red`` and, when measured, ``bottleneck_mse``); ``reference`` names it in the line.

    worse: the trained captions degenerated (``DEGENERATE_SHARE`` of them under 5 words, without words, the
    instruction echoed, or one template sentence: each caption counted once), or a deciding check's interval
    lies on its bad side;
    better: not worse, and direction skill, other facts or held-out identification has its interval on the good
    side; else not better."""
    reasons: list[str] = []
    flags_deg, flags_same = trained.get("degenerate", {}), trained.get("same_sentence", {})
    deg = float(np.mean(list(flags_deg.values()) or [0.0]))
    same = float(np.mean(list(flags_same.values()) or [0.0]))
    # a caption counts once, whichever way it degenerated: 42% too short plus 42% one template is a
    # degenerated run although neither share alone reaches the bar
    either = float(np.mean([max(flags_deg.get(i, 0.0), flags_same.get(i, 0.0))
                            for i in {*flags_deg, *flags_same}] or [0.0]))
    degenerated = either >= DEGENERATE_SHARE
    if degenerated:
        parts = [f"{deg:.0%} under 5 words, without words or the instruction echoed"] if deg else []
        parts += [f"{same:.0%} one sentence with the numbers changed"] if same else []
        reasons.append(f"degenerated: {either:.0%} of the captions are degenerate ({'; '.join(parts)})")
    comparisons = [c for check, up in DECIDING if check in trained and check in initial
                   and (c := compare(trained[check], initial[check], check, up)) is not None]
    worse = [c for c in comparisons if c.worse]
    better = [c for c in comparisons if c.better]
    describes_more = [c for c in better if c.check in DESCRIBES_MORE]
    if degenerated or worse:
        outcome = "worse"
    elif describes_more:
        outcome = "better"
    else:
        outcome = "not better"
        reasons.append(f"none of {', '.join(DESCRIBES_MORE)} improved beyond its interval")
    if worse:
        reasons.append("worse on " + ", ".join(c.text() for c in worse))
    if better:
        reasons.append("better on " + ", ".join(c.text() for c in better))
    rest = [c for c in comparisons if c not in worse and c not in better]
    if rest:
        reasons.append("no change beyond the interval: " + ", ".join(c.text() for c in rest))
    return Verdict(outcome, reasons, comparisons, degenerated, reference)


def verdicts_over_runs(verdicts: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """How many of several runs' verdicts (``Verdict.to_json``) degenerated, got worse, or got better."""
    return {"runs": len(verdicts), "degenerated": sum(bool(v.get("degenerated")) for v in verdicts),
            "worse": sum(v.get("outcome") == "worse" for v in verdicts),
            "better": sum(v.get("outcome") == "better" for v in verdicts)}
