"""Frozen value types shared by every module.

They carry data between domains, judges, rewards and evaluations; none of them knows how it was made.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from captionrl.errors import DataError


@dataclass(frozen=True, eq=False)
class Series:
    """One validated univariate time series (a window of a source series, or a whole series).

    ``source`` and ``start`` locate the window in its source series so that distractor mining can
    exclude windows that overlap in time; ``domain`` groups series for per-domain reports.
    """

    id: str
    values: np.ndarray
    source: str = ""
    start: int = 0
    domain: str = ""
    split: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        arr = np.asarray(self.values, dtype=np.float64)
        if arr.ndim != 1:
            raise DataError(
                f"series[{self.id}].values",
                _preview(self.values),
                f"must be one-dimensional, got shape {arr.shape}",
                "pass a flat list of numbers (one value per time step)",
            )
        if arr.size < 2:
            raise DataError(
                f"series[{self.id}].values",
                _preview(self.values),
                f"needs at least 2 values, got {arr.size}",
                "drop this item or use a longer window",
            )
        bad = ~np.isfinite(arr)
        if bad.any():
            first = int(np.argmax(bad))
            raise DataError(
                f"series[{self.id}].values[{first}]",
                float(arr[first]),
                f"{int(bad.sum())} non-finite value(s) (NaN or inf)",
                "clean the data, or load with fill='interpolate' to interpolate and report the gaps",
            )
        arr.setflags(write=False)
        object.__setattr__(self, "values", arr)

    def __len__(self) -> int:
        return int(self.values.shape[0])

    @property
    def end(self) -> int:
        """Exclusive end index of the window in its source series."""
        return self.start + len(self)


def _preview(values: Any) -> Any:
    if isinstance(values, np.ndarray):
        return values.tolist()[:8]
    if isinstance(values, Sequence) and not isinstance(values, str):
        return list(values)[:8]
    return values


@dataclass(frozen=True)
class Judgment:
    """The outcome of one judge call: a score, or ``None`` when the judge could not score.

    ``None`` means *unscored* (the backend failed, the reply did not parse): it is never the same as a
    wrong answer, and rewards turn it into a skipped sample rather than a 0. ``raw`` and ``decision``
    keep the evidence; ``extra`` carries per-judge fields that are logged (hard/soft accuracy, method).
    """

    score: float | None
    decision: Any = None
    raw: Any = None
    reason: str = ""
    method: str = ""
    error: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def scored(self) -> bool:
        return self.score is not None and not math.isnan(self.score)

    def to_record(self) -> dict[str, Any]:
        return {
            "score": self.score,
            "decision": self.decision,
            "raw": self.raw,
            "reason": self.reason,
            "method": self.method,
            "error": self.error,
            **{k: v for k, v in self.extra.items()},
        }


@dataclass(frozen=True)
class RubricItem:
    """One weighted binary rubric check: ``criterion`` (the fact), ``test`` (how to decide), ``weight`` 1|2|3.

    A plain value: domains build rubrics from known facts (``domains.scenes.rubric_from_facts``) and
    judges validate and score them (``judges.rubric``), so the type sits below both.
    """

    criterion: str
    test: str
    weight: int

    def to_dict(self) -> dict[str, Any]:
        return {"criterion": self.criterion, "test": self.test, "weight": self.weight}
