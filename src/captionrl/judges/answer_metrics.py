"""How open-ended VQA benchmarks score a short written answer against their reference answers.

Pure functions, no model: each benchmark's own rule, so a caption-QA number means what the benchmark's
leaderboard means by it.

- ``exact_match``: the normalised answer equals a normalised reference (VQA/SQuAD-style normalisation:
  lowercase, number words to digits, articles and punctuation dropped).
- ``anls`` (DocVQA, Biten et al. 2019): ``1 - NL`` where ``NL`` is the Levenshtein distance over the
  longer string's length (lowercased, whitespace collapsed), ``0`` when ``NL >= 0.5``; max over references.
- ``relaxed_accuracy`` (ChartQA, Masry et al. 2022, as pix2struct's scorer computes it): a numeric answer
  is right within 5% of a numeric, non-zero reference ("12%" reads as 0.12); otherwise a case-insensitive
  exact string match; max over references.
- ``vqa_accuracy`` (VQA v2 / TextVQA): ``min(#humans who gave the answer / 3, 1)``, averaged, as the
  official scorer does, over the 10 leave-one-out subsets of the 10 human answers (so 1 matching human
  scores 0.3, 2 score 0.6, 3 score 0.9 and 4 or more score 1).

Every function takes the prediction and the list of references and returns a float in [0, 1].
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from captionrl.errors import DataError

ARTICLES = frozenset({"a", "an", "the"})
NUMBER_WORDS = {
    "none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6",
    "seven": "7", "eight": "8", "nine": "9", "ten": "10",
}
ANLS_THRESHOLD = 0.5
RELAXED_TOLERANCE = 0.05

_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
_POINT = re.compile(r"(?<=\d)\.(?=\d)")
_PUNCT = re.compile(r"[^\w\s\0]")


def normalise_answer(text: str) -> str:
    """VQA-style normalisation: lowercase, ``1,000`` -> ``1000``, punctuation dropped (a decimal point
    between digits kept), apostrophes removed, number words zero..ten to digits, articles dropped."""
    s = text.lower().replace("\n", " ").replace("\t", " ").strip()
    s = _THOUSANDS.sub("", s)
    s = _POINT.sub("\0", s)  # protect decimal points from the punctuation pass
    s = s.replace("'", "").replace("\u2019", "")
    s = _PUNCT.sub(" ", s).replace("\0", ".")
    words = [NUMBER_WORDS.get(w, w) for w in s.split() if w not in ARTICLES]
    return " ".join(words)


def _check_refs(references: Sequence[str]) -> None:
    if isinstance(references, str) or not references:
        raise DataError("answers", references, "must be a non-empty list of reference answers",
                        "give every open question at least one reference answer")


def exact_match(prediction: str, references: Sequence[str]) -> float:
    """1.0 when the normalised prediction equals any normalised reference."""
    _check_refs(references)
    p = normalise_answer(prediction)
    return float(any(p == normalise_answer(r) for r in references))


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions each cost 1)."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def anls(prediction: str, references: Sequence[str], threshold: float = ANLS_THRESHOLD) -> float:
    """Average Normalised Levenshtein Similarity of one answer (DocVQA's per-question value)."""
    _check_refs(references)
    p = " ".join(prediction.lower().split())
    best = 0.0
    for ref in references:
        r = " ".join(ref.lower().split())
        length = max(len(p), len(r))
        nl = levenshtein(p, r) / length if length else 0.0
        best = max(best, 1.0 - nl if nl < threshold else 0.0)
    return best


def _to_float(text: str) -> float | None:
    t = text.strip()
    try:
        if t.endswith("%"):
            return float(t.rstrip("%")) / 100.0
        return float(t)
    except ValueError:
        return None


def relaxed_accuracy(prediction: str, references: Sequence[str], tolerance: float = RELAXED_TOLERANCE) -> float:
    """ChartQA's relaxed accuracy: numbers within ``tolerance`` (relative) of the reference, else exact text."""
    _check_refs(references)
    pred = _to_float(prediction)
    for ref in references:
        target = _to_float(ref)
        if pred is not None and target:  # a zero reference falls back to the text match, as in pix2struct
            if abs(pred - target) / abs(target) <= tolerance:
                return 1.0
        elif prediction.strip().lower() == ref.strip().lower():
            return 1.0
    return 0.0


def vqa_accuracy(prediction: str, references: Sequence[str]) -> float:
    """VQA accuracy over the human answers (normally 10), leave-one-out averaged as the official scorer."""
    _check_refs(references)
    p = normalise_answer(prediction)
    matches = [normalise_answer(r) == p for r in references]
    total = sum(matches)
    return sum(min(1.0, (total - m) / 3.0) for m in matches) / len(matches)


METRICS: dict[str, Callable[[str, Sequence[str]], float]] = {
    "exact_match": exact_match,
    "anls": anls,
    "relaxed_accuracy": relaxed_accuracy,
    "vqa_accuracy": vqa_accuracy,
}
"""Metric name -> scorer; the names questions and loaders carry."""

SHORT_NAMES = {"exact_match": "em", "anls": "anls", "relaxed_accuracy": "relaxed", "vqa_accuracy": "vqa_acc"}
"""Column prefixes of the eval table (``anls/docvqa``)."""


def check_metric(name: str, where: str = "metric") -> str:
    """Validate a metric name (raises ``DataError`` listing the known ones)."""
    if name not in METRICS:
        raise DataError(where, name, "is not a known answer metric", f"use one of {', '.join(METRICS)}")
    return name


def score_answer(metric: str, prediction: str, references: Sequence[str]) -> float:
    """Score one written answer by the named metric."""
    return METRICS[check_metric(metric)](prediction, references)


def all_scores(prediction: str, references: Sequence[str]) -> dict[str, float]:
    """Every metric's value for one answer (recorded beside the benchmark's own metric, for comparison)."""
    return {name: fn(prediction, references) for name, fn in METRICS.items()}
