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


UP_C = 0.5
"""The least-squares change over the window, in standard deviations, from which a series rises (or falls)."""


def direction_measures(values: np.ndarray) -> tuple[float, float]:
    """(c, net): ``c`` is the least-squares change over the window in standard deviations; ``net`` is the mean
    of the last tenth of the values minus the mean of the first tenth (at least one value each)."""
    v = np.asarray(values, dtype=float)
    n = len(v)
    if n < 2:
        return 0.0, 0.0
    spread = float(v.std())
    c = float(np.polyfit(np.arange(n, dtype=float), v, 1)[0]) * (n - 1) / spread if spread > 0 else 0.0
    k = max(1, n // 10)
    return c, float(v[-k:].mean() - v[:k].mean())


def overall_direction(values: np.ndarray) -> str:
    """'up', 'down' or 'flat'. Up when the trend line rises by at least half a standard deviation over the
    window *and* the series ends above where it started (last tenth vs first tenth); down mirrored; flat
    otherwise: no trend, or a slope and endpoints that disagree (a hump that ends higher than it started has
    a falling least-squares line; a reader says neither "rises" nor "falls")."""
    c, net = direction_measures(values)
    if c >= UP_C and net > 0:
        return "up"
    if c <= -UP_C and net < 0:
        return "down"
    return "flat"


def trend_word(values: np.ndarray) -> str:
    """'rises', 'falls' or 'stays roughly flat' (``overall_direction``: the shape claims' own rule, so the
    describer's direction is never contradicted by the claim checker)."""
    return {"up": "rises", "down": "falls"}.get(overall_direction(values), "stays roughly flat")


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


SHORT_DESCRIPTION_ORDERS = ("direction_first", "values_first")
"""The two forms of ``short_description`` (the warm start's ``order`` setting)."""


def interior_extremum(values: np.ndarray, precision: int = 2) -> str | None:
    """A sentence naming the window's interior extreme that lies farthest outside the range of its start and
    end ("Its highest value is 317.9." / "Its lowest value is 312.4."), or None when neither extreme is
    interior and outside that range (a monotone window: its endpoints are its extremes).

    Why: lineups whose distractors share the start, the end and the trend (``domains.pinned``) are told
    apart only by what lies between, and an extreme beyond the endpoints is the plainest such value."""
    v = np.asarray(values, dtype=float)
    lo, hi = min(v[0], v[-1]), max(v[0], v[-1])
    above, below = float(v.max()) - hi, lo - float(v.min())
    if max(above, below) <= 0:
        return None
    if above >= below:
        return f"Its highest value is {fmt(float(v.max()), precision)}."
    return f"Its lowest value is {fmt(float(v.min()), precision)}."


def short_description(series: Series | np.ndarray, precision: int = 2, *, order: str = "direction_first",
                      extremum: bool = False) -> str:
    """A two-sentence caption that answers the main job's instruction:
    "Overall, the series falls. It starts at 316.1 and ends at 315.8."

    Why this form: it is the warm start's target (``train.warm_start``), the honest answer a 135M captioner
    can be taught to write within the CPU job's 40 tokens. The direction comes first, after the cue at which
    labels teach it; written after the two values it is learned less well, and a clause naming the interior
    peak or trough costs direction accuracy and is often wrong about the peak's place, so the sentence leaves
    the extremes to RL (docs/results/warm-start-target-forms.md).

    ``extremum=True`` adds a third sentence naming the interior extreme beyond the endpoints
    (``interior_extremum``), where there is one; its value only, since the 135M captioner places it wrong
    half the time.

    ``order="values_first"`` writes the two values first: "It starts at 316.1 and ends at 315.8, so overall the
    series falls." (the direction then follows two numbers the captioner has just written, which a
    16-value window's label mostly agrees with: ``direction_measures``'s ``net`` is end minus start).
    """
    v = np.asarray(series.values if isinstance(series, Series) else series, dtype=float)
    start, end, word = fmt(v[0], precision), fmt(v[-1], precision), trend_word(v)
    if order == "values_first":
        text = f"It starts at {start} and ends at {end}, so overall the series {word}."
    elif order in SHORT_DESCRIPTION_ORDERS:
        text = f"Overall, the series {word}. It starts at {start} and ends at {end}."
    else:
        raise ValueError(f"order={order!r}: use one of {SHORT_DESCRIPTION_ORDERS}")
    extra = interior_extremum(v, precision) if extremum else None
    return f"{text} {extra}" if extra else text


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
