"""Paired t-test, Rel. and bold marking against values computed by hand (and the paper's own tables)."""

from __future__ import annotations

import math

import pytest

from captionrl.errors import DataError
from captionrl.eval import stats


def _t4_two_sided_p(t: float) -> float:
    """Closed-form Student t CDF for 4 degrees of freedom (5 seeds), two-sided."""
    x = t * t / 4
    cdf = 0.5 + (3 / 8) * (abs(t) / math.sqrt(1 + x)) * (1 - t * t / (12 * (1 + x)))
    return 2 * (1 - cdf)


def test_paired_ttest_matches_hand_computation():
    a = [1.0, 2.0, 3.0, 4.0, 5.0]
    b = [1.5, 2.1, 3.9, 4.2, 5.8]
    # d = a - b = [-.5, -.1, -.9, -.2, -.8]; mean -.5; sample var .125; se = sqrt(.125 / 5) = .1581
    t, p = stats.paired_ttest(a, b)
    assert t == pytest.approx(-math.sqrt(10), rel=1e-9)
    assert p == pytest.approx(_t4_two_sided_p(-math.sqrt(10)), rel=1e-9)
    assert p == pytest.approx(0.03411, abs=1e-5)
    t2, p2 = stats.paired_ttest(b, a)  # two-sided: symmetric in its arguments
    assert t2 == pytest.approx(-t) and p2 == pytest.approx(p)


def test_paired_ttest_degenerate_differences():
    assert stats.paired_ttest([1, 2, 3], [1, 2, 3]) == (0.0, 1.0)
    t, p = stats.paired_ttest([2, 3, 4], [1, 2, 3])
    assert p == 0.0 and t > 0
    with pytest.raises(DataError, match="same length"):
        stats.paired_ttest([1, 2, 3], [1, 2])
    with pytest.raises(DataError, match="at least 2"):
        stats.paired_ttest([1], [2])


def test_rel_is_geometric_mean_of_ratios():
    keys = ["a", "b"]
    assert stats.geometric_rel({"a": 0.2, "b": 0.05}, {"a": 0.1, "b": 0.1}, keys) == pytest.approx(1.0)
    assert stats.geometric_rel({"a": 0.2, "b": 0.8}, {"a": 0.1, "b": 0.1}, keys) == pytest.approx(4.0)
    with pytest.raises(DataError, match="positive"):
        stats.geometric_rel({"a": 0.0, "b": 1.0}, {"a": 1.0, "b": 1.0}, keys)


def test_rel_reproduces_paper_table_11():
    """Table 11: Qwen2.5-7B against the LineupRL row, forecasting 1.369 and reconstruction 1.391."""
    corpora = ["ETTh2", "ETTm2", "Saug", "Elec"]
    ref_f = dict(zip(corpora, [0.1687, 0.0523, 0.8225, 0.1922], strict=True))
    row_f = dict(zip(corpora, [0.2535, 0.0758, 0.8709, 0.2926], strict=True))
    ref_r = dict(zip(corpora, [0.0974, 0.0286, 0.4472, 0.1317], strict=True))
    row_r = dict(zip(corpora, [0.1441, 0.0435, 0.5318, 0.1847], strict=True))
    # The paper divides unrounded MSEs; from its 4-decimal cells the ratios agree within 1e-3.
    assert stats.geometric_rel(row_f, ref_f, corpora) == pytest.approx(1.369, abs=1e-3)
    assert stats.geometric_rel(row_r, ref_r, corpora) == pytest.approx(1.391, abs=1e-3)


def test_not_worse_than_best_marks_by_paired_p():
    per_seed = {
        "best": [1.0, 2.0, 3.0, 4.0, 5.0],      # mean 3.0
        "close": [1.5, 2.1, 3.9, 4.2, 5.8],     # mean 3.5, p = .034 vs best -> significantly worse
        "noisy": [0.5, 2.9, 2.6, 4.9, 5.6],     # mean 3.3, d = [.5,-.9,.4,-.9,-.6] -> p > .05
    }
    res = stats.not_worse_than_best(per_seed)
    assert res["best"]["best"] and res["best"]["marked"]
    assert not res["close"]["marked"] and res["close"]["p"] == pytest.approx(0.03411, abs=1e-5)
    assert res["noisy"]["marked"] and res["noisy"]["p"] >= 0.05
    higher = stats.not_worse_than_best(per_seed, lower_is_better=False)
    assert higher["close"]["best"]


def test_pvalue_table_and_format():
    per_seed = {"ours": [1.0, 2.0, 3.0, 4.0, 5.0], "other": [1.5, 2.1, 3.9, 4.2, 5.8]}
    tab = stats.pvalue_table(per_seed, "ours")
    assert set(tab) == {"other"} and not tab["other"]["other_ahead"]
    assert stats.format_p(tab["other"]["p"]) == "0.034"
    assert stats.format_p(0.0004) == "< 0.001"
    with pytest.raises(DataError):
        stats.pvalue_table(per_seed, "missing")
