"""Significance and aggregation for predictor-seed studies (LineupRL Tables 2, 5, 11, 13, 15).

Only the caption-only predictor's training seed varies between repeats, so captioners are compared with a
*paired* test across seeds: seed ``s`` of captioner A and seed ``s`` of captioner B share the predictor's
initialisation and batch order, and pairing removes that shared noise (Table 5: two-sided
``scipy.stats.ttest_rel``). ``Rel.`` summarises one row over corpora as the geometric mean of its
per-corpus MSE ratios to a reference row, so every corpus weighs the same whatever its MSE scale.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from captionrl.errors import DataError

ALPHA = 0.05
"""Rows with p >= ALPHA against the best row are "not significantly worse than the best" (bold)."""


def paired_ttest(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Two-sided paired t-test across seeds: returns (t statistic, p-value).

    Identical samples (every paired difference 0) give (0.0, 1.0): no evidence of a difference, where
    scipy would return NaN. A constant non-zero difference gives p = 0 (the difference has no spread).
    """
    from scipy import stats

    x = np.asarray(a, dtype=float)
    y = np.asarray(b, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise DataError("per_seed", (len(x), len(y)), "paired samples must have the same length",
                        "run both systems with the same predictor seeds")
    if x.size < 2:
        raise DataError("per_seed", x.size, "a paired t-test needs at least 2 seeds", "run 2 or more predictor seeds")
    d = x - y
    if np.allclose(d, 0.0, rtol=0.0, atol=0.0):
        return 0.0, 1.0
    if np.allclose(d, d[0], rtol=0.0, atol=0.0):
        return (math.copysign(math.inf, float(d[0])), 0.0)
    res = stats.ttest_rel(x, y)
    return float(res.statistic), float(res.pvalue)


def geometric_rel(row: Mapping[str, float], reference: Mapping[str, float], keys: Sequence[str]) -> float:
    """``Rel.``: geometric mean over ``keys`` (corpora) of ``row[k] / reference[k]`` (> 1: worse than ref)."""
    if not keys:
        raise DataError("rel.keys", list(keys), "no corpora to average over", "give at least one column")
    logs = []
    for k in keys:
        num, den = row.get(k), reference.get(k)
        if num is None or den is None or not (num > 0 and den > 0):
            raise DataError(f"rel[{k}]", (num, den), "Rel. needs positive values in both rows",
                            "drop the column or fill the missing result")
        logs.append(math.log(num / den))
    return float(math.exp(sum(logs) / len(logs)))


def best_row(means: Mapping[str, float], lower_is_better: bool = True) -> str:
    """Name of the row with the best mean (ties: the first in order)."""
    if not means:
        raise DataError("rows", {}, "no rows to compare", "give at least one row")
    sign = 1.0 if lower_is_better else -1.0
    return min(means, key=lambda r: sign * means[r])


def not_worse_than_best(
    per_seed: Mapping[str, Sequence[float]], lower_is_better: bool = True, alpha: float = ALPHA
) -> dict[str, dict[str, float | bool]]:
    """For each row: its p-value against the best row and whether it is "not significantly worse".

    The best row is the one with the best mean; it is marked itself. A row is marked when the paired
    two-sided test against the best gives ``p >= alpha`` (Table 2's bold). Rows must share seeds.
    """
    means = {r: float(np.mean(v)) for r, v in per_seed.items()}
    best = best_row(means, lower_is_better)
    out: dict[str, dict[str, float | bool]] = {}
    for r, vals in per_seed.items():
        if r == best:
            out[r] = {"p": 1.0, "best": True, "marked": True}
            continue
        _t, p = paired_ttest(vals, per_seed[best])
        out[r] = {"p": p, "best": False, "marked": bool(p >= alpha)}
    return out


def pvalue_table(
    per_seed: Mapping[str, Sequence[float]], reference: str, lower_is_better: bool = True
) -> dict[str, dict[str, float | bool]]:
    """Table 5: p-value of ``reference`` against every other row, and whether the other row is ahead (†)."""
    if reference not in per_seed:
        raise DataError("reference", reference, "is not one of the rows", f"choose one of {sorted(per_seed)}")
    ref = per_seed[reference]
    out: dict[str, dict[str, float | bool]] = {}
    for r, vals in per_seed.items():
        if r == reference:
            continue
        _t, p = paired_ttest(ref, vals)
        ahead = np.mean(vals) < np.mean(ref) if lower_is_better else np.mean(vals) > np.mean(ref)
        out[r] = {"p": p, "other_ahead": bool(ahead)}
    return out


def format_p(p: float) -> str:
    """Table 5's notation: ``< 0.001`` below a thousandth, else three decimals."""
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def mean_interval(xs: Sequence[float], level: float = 0.95) -> tuple[float, float, float] | None:
    """Mean and its two-sided Student-t interval at ``level`` over ``xs`` (items, or seeds): ``(mean, lo, hi)``.

    A claim of improvement is a mean with an interval, never one number. One value has no spread: its
    interval is the value itself (``lo == hi``), reported as such rather than as a fake certainty; no values
    give ``None``. Non-finite values are dropped (an unscored item is not a zero).
    """
    from scipy import stats

    x = np.asarray([v for v in xs if v is not None and math.isfinite(float(v))], dtype=float)
    if x.size == 0:
        return None
    m = float(x.mean())
    if x.size == 1:
        return m, m, m
    half = float(stats.t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return m, m - half, m + half
