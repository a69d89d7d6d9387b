"""A deterministic describer: a factual caption written from a series' own values.

It is the reference "honest captioner" of tests and demos (no model involved): it names the start, the
end, the extremes with their positions, the overall trend and the level, the facts a verifier needs to
identify a series and a caption-only predictor needs to reconstruct it. Positions are 0-based steps.
"""

from __future__ import annotations

import numpy as np

from captionrl.types import Series


def fmt(x: float, precision: int = 2) -> str:
    """Format a number compactly (no trailing zeros, no scientific notation for ordinary values)."""
    if abs(x) >= 1e6 or (0 < abs(x) < 10 ** (-precision)):
        return f"{x:.{precision}g}"
    text = f"{x:.{precision}f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def trend_word(values: np.ndarray) -> str:
    """'rises', 'falls' or 'stays roughly flat', from the least-squares slope relative to the spread."""
    n = len(values)
    t = np.arange(n, dtype=float)
    slope = float(np.polyfit(t, values, 1)[0])
    spread = float(values.std()) or 1.0
    change = slope * (n - 1) / spread
    if change > 0.5:
        return "rises"
    if change < -0.5:
        return "falls"
    return "stays roughly flat"


def describe_series(series: Series | np.ndarray, precision: int = 2) -> str:
    """One-paragraph factual caption of ``series`` (deterministic)."""
    v = np.asarray(series.values if isinstance(series, Series) else series, dtype=float)
    i_max, i_min = int(v.argmax()), int(v.argmin())
    return (
        f"The series has {len(v)} points. It starts at {fmt(v[0], precision)} and ends at "
        f"{fmt(v[-1], precision)}, and overall it {trend_word(v)}. "
        f"The maximum is {fmt(v[i_max], precision)} at step {i_max} and the minimum is "
        f"{fmt(v[i_min], precision)} at step {i_min}. "
        f"The mean is {fmt(float(v.mean()), precision)} with a standard deviation of "
        f"{fmt(float(v.std()), precision)}."
    )
