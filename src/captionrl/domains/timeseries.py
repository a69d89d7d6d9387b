"""Time series items: validated construction, windowing, time-ordered splits, rendering, statistics.

Every series that enters training or evaluation goes through ``make_series`` (or ``Series`` itself), so
NaN, inf, empty and ragged input fail here with the item and index named, instead of deep inside a
tokenizer. Windows remember their ``source`` and ``start`` so distractor mining can tell which windows
share time steps; splits are contiguous in time and windows are cut *inside* a split, so no window (and
no forecasting target ``next``) ever crosses a split boundary. File-format loaders live in
``captionrl.domains.corpora``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from captionrl.errors import ConfigError, DataError
from captionrl.types import Series

Fill = Literal["error", "interpolate"]

# ETT convention (Informer, Zhou et al. 2021): 12 months train, 4 validation, 4 test, 30-day months.
ETT_MONTHS = (12, 4, 4)
ETT_STEPS_PER_HOUR = {"h": 1, "hourly": 1, "15min": 4, "m": 4}


def _to_float(v: Any, field: str) -> float:
    if v is None:
        return math.nan
    if isinstance(v, str):
        text = v.strip()
        if text.lower() in ("", "nan", "na", "n/a", "null", "none"):
            return math.nan
        v = text
    try:
        return float(v)
    except (TypeError, ValueError):
        raise DataError(field, v, "is not a number", "write plain numbers (missing values as empty or NaN)") from None


def make_series(
    values: Any,
    id: str,
    *,
    fill: Fill = "error",
    source: str = "",
    start: int = 0,
    domain: str = "",
    split: str = "",
    meta: Mapping[str, Any] | None = None,
) -> Series:
    """Build a validated ``Series`` from a flat sequence of numbers.

    ``fill="error"`` rejects NaN/inf with the item and first bad index named; ``fill="interpolate"``
    fills them linearly from the nearest finite neighbours (held constant at the ends) and records the
    filled runs as ``meta["gaps"]`` (``[start, end)`` index pairs) and ``meta["filled"]`` (a count), so a
    report can say how much of an item was made up. Nested input is rejected as 2-D or ragged.
    """
    if fill not in ("error", "interpolate"):
        raise ConfigError("fill", fill, "unknown fill policy", "use 'error' or 'interpolate'")
    field = f"series[{id}]"
    if isinstance(values, np.ndarray) and values.ndim > 1:
        raise DataError(field, values.shape, "must be one-dimensional", "pass one value per time step")
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)):
        raise DataError(field, values, "is not a sequence of numbers", "pass a list of numbers")
    if len(values) == 0:
        raise DataError(field, [], "is empty", "drop this item or fix the file it came from")
    listy = [isinstance(v, (list, tuple, np.ndarray)) for v in values]
    if any(listy):
        first = values[listy.index(True)]
        odd = [i for i, v in enumerate(values) if not listy[i] or len(v) != len(first)]
        if odd:
            raise DataError(f"{field}[{odd[0]}]", values[odd[0]],
                            f"ragged input: element {odd[0]} does not match element {listy.index(True)} "
                            f"(a list of {len(first)})", "pass a flat list of numbers (one value per time step)")
        raise DataError(field, first, f"is 2-D ({len(values)} x {len(first)})",
                        "pass one univariate series (pick one column or channel)")
    arr = np.array([_to_float(v, f"{field}[{i}]") for i, v in enumerate(values)], dtype=np.float64)
    info = dict(meta or {})
    bad = ~np.isfinite(arr)
    if bad.any():
        if fill == "error":
            first = int(np.argmax(bad))
            raise DataError(f"{field}[{first}]", float(arr[first]),
                            f"{int(bad.sum())} missing or non-finite value(s) (first at index {first})",
                            "clean the data, or load with fill='interpolate' to interpolate and report the gaps")
        good = np.flatnonzero(~bad)
        if good.size < 2:
            raise DataError(field, _head(arr), f"only {good.size} finite value(s); cannot interpolate",
                            "drop this item")
        idx = np.arange(arr.size)
        arr[bad] = np.interp(idx[bad], good, arr[good])
        info["gaps"] = _runs(bad)
        info["filled"] = int(bad.sum())
    return Series(id=id, values=arr, source=source or id, start=start, domain=domain, split=split, meta=info)


def _head(arr: np.ndarray) -> list[float]:
    return arr[:8].tolist()


def _runs(mask: np.ndarray) -> list[list[int]]:
    """``[start, end)`` runs where ``mask`` is true."""
    padded = np.concatenate([[False], mask, [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return [[int(a), int(b)] for a, b in zip(edges[::2], edges[1::2], strict=True)]


# --------------------------------------------------------------------------------------------- windows
def window(
    series: Series,
    length: int,
    stride: int | None = None,
    *,
    next_length: int = 0,
    max_filled_fraction: float = 1.0,
) -> list[Series]:
    """Cut ``series`` into fixed-length windows (ids ``<id>@<start>``), oldest first.

    ``stride`` defaults to ``length`` (no overlap). With ``next_length > 0`` each window keeps the
    following ``next_length`` values as ``meta["next"]`` (the forecasting target) and windows without a
    complete target are dropped, so the target never leaves ``series`` (a split segment). Windows whose
    interpolated share exceeds ``max_filled_fraction`` are dropped too (default keeps all).
    """
    if length < 2:
        raise ConfigError("length", length, "a window needs at least 2 values", "use --length 2 or more")
    stride = length if stride is None else stride
    if stride < 1:
        raise ConfigError("stride", stride, "must be a positive integer", "use --stride 1 or more")
    if next_length < 0:
        raise ConfigError("next_length", next_length, "must be >= 0", "use 0 (no target) or the horizon")
    n = len(series)
    gaps = np.zeros(n, dtype=bool)
    for a, b in series.meta.get("gaps", []):
        gaps[a:b] = True
    dates = series.meta.get("dates")
    base = {k: v for k, v in series.meta.items() if k not in ("gaps", "filled", "dates", "next", "captions")}
    out: list[Series] = []
    for off in range(0, n - length - next_length + 1, stride):
        filled = int(gaps[off:off + length].sum())
        if filled > max_filled_fraction * length:
            continue
        meta: dict[str, Any] = dict(base)
        meta["parent"] = series.id
        if filled:
            meta["filled"] = filled
        if next_length:
            meta["next"] = series.values[off + length: off + length + next_length].tolist()
        if dates is not None:
            meta["start_date"] = dates[off]
            meta["end_date"] = dates[off + length - 1]
        out.append(Series(
            id=f"{series.id}@{off}", values=series.values[off:off + length], source=series.source or series.id,
            start=series.start + off, domain=series.domain, split=series.split, meta=meta,
        ))
    return out


def split_by_fraction(series: Series, fractions: Sequence[float] = (0.7, 0.1, 0.2),
                      names: Sequence[str] = ("train", "val", "test")) -> dict[str, Series]:
    """Contiguous, time-ordered segments (oldest = train). Fractions must sum to 1 (within 1e-6)."""
    if len(fractions) != len(names) or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
        raise ConfigError("fractions", list(fractions), f"need {len(names)} non-negative fractions summing to 1",
                          "use e.g. 0.7,0.1,0.2")
    n = len(series)
    cuts = np.round(np.cumsum([0.0, *fractions]) * n).astype(int)
    cuts[-1] = n
    return _segments(series, list(zip(names, cuts[:-1], cuts[1:], strict=True)))


def split_ett(series: Series, freq: str = "h") -> dict[str, Series]:
    """ETT's 12/4/4-month split (30-day months): hourly 8640/2880/2880 rows, 15-minute 4x that.

    Unlike the Informer loader we do not let validation and test windows reach back into the previous
    split for their context: each split is its own segment, so no window crosses a boundary.
    """
    if freq not in ETT_STEPS_PER_HOUR:
        raise ConfigError("freq", freq, "unknown ETT frequency", f"use one of {sorted(ETT_STEPS_PER_HOUR)}")
    per_month = 30 * 24 * ETT_STEPS_PER_HOUR[freq]
    sizes = [m * per_month for m in ETT_MONTHS]
    if len(series) < sum(sizes):
        raise DataError(f"series[{series.id}]", len(series), f"shorter than the ETT split needs ({sum(sizes)} rows "
                        f"at freq={freq!r})", "use split_by_fraction, or check freq ('h' hourly, '15min')")
    cuts = np.cumsum([0, *sizes])
    return _segments(series, list(zip(("train", "val", "test"), cuts[:-1], cuts[1:], strict=True)))


def _segments(series: Series, spans: list[tuple[str, int, int]]) -> dict[str, Series]:
    out: dict[str, Series] = {}
    dates = series.meta.get("dates")
    for name, a, b in spans:
        a, b = int(a), int(b)
        if b - a < 2:
            raise DataError(f"series[{series.id}]", len(series), f"split {name!r} would have {b - a} values",
                            "use a longer series or larger fractions")
        meta = {k: v for k, v in series.meta.items() if k not in ("gaps", "filled", "dates")}
        gaps = [[max(g0, a) - a, min(g1, b) - a] for g0, g1 in series.meta.get("gaps", []) if g1 > a and g0 < b]
        if gaps:
            meta["gaps"] = gaps
        if dates is not None:
            meta["dates"] = list(dates[a:b])
        out[name] = Series(id=f"{series.id}:{name}", values=series.values[a:b], source=series.source or series.id,
                           start=series.start + a, domain=series.domain, split=name, meta=meta)
    return out


def window_splits(segments: Mapping[str, Series] | Sequence[Mapping[str, Series]], length: int,
                  stride: int | None = None, next_length: int = 0) -> dict[str, list[Series]]:
    """Window each split segment separately: ``{"train": [...], "val": [...], "test": [...]}``."""
    groups = [segments] if isinstance(segments, Mapping) else list(segments)
    out: dict[str, list[Series]] = {}
    for seg in groups:
        for name, s in seg.items():
            out.setdefault(name, []).extend(window(s, length, stride, next_length=next_length))
    return out


# ------------------------------------------------------------------------------------------- rendering
def render_numbers(series: Series | np.ndarray, precision: int = 2,
                   normalise: Literal["zscore", "minmax"] | None = None) -> tuple[str, dict[str, Any]]:
    """Comma-separated numbers as a verifier or LLM captioner reads them, plus how they were made.

    ``info`` records ``precision`` and ``normalise`` with the constants needed to undo it (mean/std or
    min/max), so a reconstruction can be mapped back and a record says exactly what the model saw.
    """
    v = np.asarray(series.values if isinstance(series, Series) else series, dtype=np.float64)
    if precision < 0:
        raise ConfigError("precision", precision, "must be >= 0", "use e.g. 2")
    info: dict[str, Any] = {"precision": precision, "normalise": normalise}
    if normalise == "zscore":
        mu, sd = float(v.mean()), float(v.std())
        v = (v - mu) / sd if sd > 0 else np.zeros_like(v)
        info.update(mean=mu, std=sd)
    elif normalise == "minmax":
        lo, hi = float(v.min()), float(v.max())
        v = (v - lo) / (hi - lo) if hi > lo else np.zeros_like(v)
        info.update(min=lo, max=hi)
    elif normalise is not None:
        raise ConfigError("normalise", normalise, "unknown normalisation", "use None, 'zscore' or 'minmax'")
    text = ", ".join("0" if (t := f"{x:.{precision}f}").strip("-0.") == "" else t for x in v)
    return text, info


def render_chart(series: Series | np.ndarray, path: str | Path | None = None,
                 size: tuple[int, int] = (448, 448), dpi: int = 100, title: str | None = None) -> Any:
    """A line chart of the series as a ``PIL.Image`` (RGB) for vision captioners; saved if ``path``.

    Uses matplotlib's object API on the Agg canvas (no pyplot global state, no display needed), so it is
    safe in worker threads and headless CI.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from PIL import Image

    v = np.asarray(series.values if isinstance(series, Series) else series, dtype=np.float64)
    w, h = size
    fig = Figure(figsize=(w / dpi, h / dpi), dpi=dpi)
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.plot(np.arange(len(v)), v, color="tab:blue", linewidth=1.5)
    ax.set_xlabel("step")
    ax.grid(True, alpha=0.3)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    canvas.draw()
    img = Image.frombuffer("RGBA", canvas.get_width_height(), canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
    img = img.convert("RGB")
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        img.save(path)
    return img


# ------------------------------------------------------------------------------------------ statistics
STATS: tuple[str, ...] = ("mean", "std", "min", "max", "first", "last", "slope", "acf1", "median",
                          "argmax", "argmin", "diff_std")
DEFAULT_STATS: tuple[str, ...] = ("mean", "std", "min", "max", "first", "last", "slope", "acf1")


def summary_stats(x: np.ndarray, stats: Sequence[str] = DEFAULT_STATS) -> np.ndarray:
    """Summary statistics of each row of ``x`` (n windows x L steps) -> (n x len(stats)), vectorised.

    ``slope`` is the least-squares slope per step; ``acf1`` the lag-1 autocorrelation (0 for a constant
    row); ``argmax``/``argmin`` are positions scaled to [0, 1]; ``diff_std`` the std of first differences
    (roughness). These are the facts a caption names, so windows close in this space are hard to tell apart
    from a caption.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] < 2:
        raise DataError("windows", x.shape, "need a 2-D array of windows with at least 2 steps", "window first")
    unknown = [s for s in stats if s not in STATS]
    if unknown or not stats:
        raise ConfigError("stats", list(stats), f"unknown statistic(s) {unknown}" if unknown else "empty list",
                          f"choose from {', '.join(STATS)}")
    n, length = x.shape
    mean = x.mean(axis=1)
    centred = x - mean[:, None]
    cols: list[np.ndarray] = []
    for name in stats:
        if name == "mean":
            cols.append(mean)
        elif name == "std":
            cols.append(x.std(axis=1))
        elif name == "min":
            cols.append(x.min(axis=1))
        elif name == "max":
            cols.append(x.max(axis=1))
        elif name == "first":
            cols.append(x[:, 0])
        elif name == "last":
            cols.append(x[:, -1])
        elif name == "median":
            cols.append(np.median(x, axis=1))
        elif name == "slope":
            t = np.arange(length, dtype=np.float64) - (length - 1) / 2
            cols.append(centred @ t / float(t @ t))
        elif name == "acf1":
            den = (centred**2).sum(axis=1)
            num = (centred[:, 1:] * centred[:, :-1]).sum(axis=1)
            cols.append(np.divide(num, den, out=np.zeros(n), where=den > 0))
        elif name == "argmax":
            cols.append(x.argmax(axis=1) / (length - 1))
        elif name == "argmin":
            cols.append(x.argmin(axis=1) / (length - 1))
        elif name == "diff_std":
            cols.append(np.diff(x, axis=1).std(axis=1))
    return np.stack(cols, axis=1)
