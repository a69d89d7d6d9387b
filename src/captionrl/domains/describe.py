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


def describer_demo(n_items: int = 12, seed: int = 0) -> tuple[list[Series], dict[str, str], dict[str, str]]:
    """Self-check inputs for caption metrics: embedded windows, their describer captions, and (seeded)
    the describer's caption of *another* window, which an honest metric must score lower."""
    from captionrl.domains.corpora import load_embedded_corpus
    from captionrl.domains.timeseries import window

    wins: list[Series] = []
    for s in load_embedded_corpus(["co2", "sunspots", "elnino", "nile"]):
        wins.extend(window(s, 24, stride=max(24, len(s) // 6)))
    rng = np.random.default_rng(seed)
    chosen = [wins[i] for i in sorted(rng.choice(len(wins), size=min(n_items, len(wins)), replace=False))]
    caps = {w.id: describe_series(w) for w in chosen}
    ids = list(caps)
    shift = int(rng.integers(1, len(ids)))
    other = {i: caps[ids[(k + shift) % len(ids)]] for k, i in enumerate(ids)}
    return chosen, caps, other
