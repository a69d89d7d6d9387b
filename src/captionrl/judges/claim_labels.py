"""How far the rule claim checker agrees with people: precision and recall per claim kind on hand-labelled
captions of real series.

A labelled record is ``{"id", "source", "split", "series": [...], "caption", "labels": {kind: true | false |
null}}``: for each claim kind the caption asserts, whether a person reading the numbers found it true for
that series (null: the person could not tell; left out). Kinds (``LABEL_KINDS``): ``value`` (numbers: start,
end, extremes, a value at a step), ``trend`` (overall direction), ``hedge``, ``extremum`` (an extreme placed
in the window), ``stretch`` (a local direction, a sequence, a dip or spike, a move to a value),
``volatility``, ``magnitude``. Where a caption makes several claims of a kind, the label is true only when
all of them hold.

For each labelled (caption, kind) the checker predicts **true** when it coloured at least one claim of that
kind green and none red, **false** when it coloured one red, and **missed** when it extracted none (or only
gray ones). Green precision = TP / (TP + FP); green recall = TP / labelled true (a miss counts against it);
red precision = TN / (TN + FN); red recall = TN / labelled false; extraction recall = labelled claims the
extractor found / labelled claims. Claims of a kind the labels do not mention for that caption are counted
as ``unlabelled`` (extractions nobody asked for; not scored). ``bench/bench_shape_claims.py`` prints the
table on ``tests/data/shape_captions.jsonl`` and ``tests/test_shape_claims.py`` holds it above thresholds.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from captionrl.errors import DataError
from captionrl.judges.claims import Claim, check, extract_rules

LABEL_KINDS = ("value", "trend", "hedge", "extremum", "stretch", "volatility", "magnitude")


def label_kind(claim: Claim) -> str | None:
    """The label kind a checked claim answers for (None: not one of LABEL_KINDS, e.g. a length)."""
    if claim.kind in ("value", "stat"):
        return "value"
    if claim.kind == "position":
        return "extremum" if claim.stat in ("max", "min") else "stretch" if claim.direction else None
    return claim.kind if claim.kind in LABEL_KINDS else None


def load_labelled(path: str | Path) -> list[dict[str, Any]]:
    """Labelled records from a JSONL file, validated (a bad record names its line and the fix)."""
    p = Path(path)
    if not p.exists():
        raise DataError("labelled captions", str(p), "file not found", "give tests/data/shape_captions.jsonl")
    out = []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{p.name}:{n}", line[:80], f"not JSON ({exc.msg})", "one JSON object per line") from exc
        series, labels = rec.get("series"), rec.get("labels")
        if not isinstance(rec.get("caption"), str) or not isinstance(series, list) or len(series) < 3:
            raise DataError(f"{p.name}:{n}", rec.get("id"), "needs a string 'caption' and a 'series' of >= 3 numbers",
                            "write {id, source, split, series: [...], caption, labels: {...}}")
        if not isinstance(labels, dict) or any(k not in LABEL_KINDS or v not in (True, False, None)
                                                for k, v in labels.items()):
            raise DataError(f"{p.name}:{n}.labels", labels, f"kinds must be among {LABEL_KINDS}, values true/false/null",
                            "label each asserted claim kind with true, false or null")
        out.append(rec)
    return out


@dataclass
class KindScore:
    """Counts for one claim kind (see the module doc for the definitions)."""

    kind: str
    tp: int = 0
    fp: int = 0
    tn: int = 0
    fn: int = 0
    missed_true: int = 0
    missed_false: int = 0
    unlabelled: int = 0
    misses: list[str] = field(default_factory=list)  # "id: why" for each disagreement

    @property
    def labelled(self) -> int:
        return self.tp + self.fp + self.tn + self.fn + self.missed_true + self.missed_false

    @property
    def labelled_true(self) -> int:
        return self.tp + self.fn + self.missed_true

    @property
    def labelled_false(self) -> int:
        return self.tn + self.fp + self.missed_false

    @staticmethod
    def _ratio(a: int, b: int) -> float | None:
        return a / b if b else None

    @property
    def extraction_recall(self) -> float | None:
        return self._ratio(self.labelled - self.missed_true - self.missed_false, self.labelled)

    @property
    def precision(self) -> float | None:
        return self._ratio(self.tp, self.tp + self.fp)

    @property
    def recall(self) -> float | None:
        return self._ratio(self.tp, self.labelled_true)

    @property
    def red_precision(self) -> float | None:
        return self._ratio(self.tn, self.tn + self.fn)

    @property
    def red_recall(self) -> float | None:
        return self._ratio(self.tn, self.labelled_false)


def score(records: Iterable[Mapping[str, Any]], tolerance: float = 0.35) -> dict[str, KindScore]:
    """Per-kind agreement of ``extract_rules`` + ``check`` with the labels of ``records``."""
    scores = {k: KindScore(k) for k in LABEL_KINDS}
    for rec in records:
        v = np.asarray(rec["series"], dtype=float)
        colours: dict[str, list[str]] = {}
        for c in extract_rules(rec["caption"]):
            kind = label_kind(c)
            got = check(c, v, tolerance).colour
            if kind is not None and got in ("green", "red"):
                colours.setdefault(kind, []).append(got)
        labels = rec["labels"]
        for kind in colours:
            if kind not in labels:
                scores[kind].unlabelled += 1
        for kind, truth in labels.items():
            if truth is None:
                continue
            s, cols = scores[kind], colours.get(kind, [])
            if not cols:
                if truth:
                    s.missed_true += 1
                else:
                    s.missed_false += 1
                s.misses.append(f"{rec['id']}: missed ({truth}) {rec['caption']!r}")
                continue
            said = "red" not in cols
            if said and truth:
                s.tp += 1
            elif said:
                s.fp += 1
                s.misses.append(f"{rec['id']}: green, labelled false {rec['caption']!r}")
            elif truth:
                s.fn += 1
                s.misses.append(f"{rec['id']}: red, labelled true {rec['caption']!r}")
            else:
                s.tn += 1
    return scores


def table(scores: Mapping[str, KindScore], kinds: Sequence[str] = LABEL_KINDS) -> str:
    """A markdown table of the scores (— where a ratio has no denominator)."""

    def f(x: float | None) -> str:
        return "—" if x is None else f"{x:.2f}"

    lines = ["| kind | labelled (true/false) | extraction recall | green precision | green recall | "
             "red precision | red recall | unlabelled extractions |",
             "|---|---|---|---|---|---|---|---|"]
    for k in kinds:
        s = scores[k]
        lines.append(f"| {k} | {s.labelled} ({s.labelled_true}/{s.labelled_false}) | {f(s.extraction_recall)} | "
                     f"{f(s.precision)} | {f(s.recall)} | {f(s.red_precision)} | {f(s.red_recall)} | {s.unlabelled} |")
    return "\n".join(lines)
