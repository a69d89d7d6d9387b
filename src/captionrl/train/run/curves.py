"""Training curves: the one metrics loader and the one plot every recipe draws ``curves.png`` with.

A run's metrics are TRL's log entries (reward, its std, the fraction of groups whose rewards are all
equal, completion lengths, loss, KL) plus what reward functions and callbacks add (``identification/*``,
``shaping/*``, ``rubric/*``, ``momentum/distance``, ``momentum/*_to_initial``). ``MetricsLog`` (``train.run.logging``) keeps them in
``metrics.jsonl``; ``load_metrics`` reads that file (or a ``trainer_state.json``, or entries already in
memory) and ``plot_curves`` draws one panel per metric: the logged trace plus a centred moving average.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from captionrl.errors import DataError
from captionrl.records import (  # the one metrics loader lives with the records
    Source,
    load_metrics,
    metric_entries,
)

WATCHED = (
    ("reward", "reward"),
    ("hard", "hard acc"),
    ("soft", "soft acc"),
    ("frac_reward_zero_std", "zero-std groups"),
    ("completions/mean_length", "caption tokens"),
    ("fail", "verifier failures"),
    ("shaping/caption_chars", "caption chars"),
    ("shaping/transcription_frac", "transcribed"),
    ("unscored_frac", "unscored"),
    ("momentum/distance", "momentum distance"),
    ("_to_initial", "distance to initial"),
    ("rubric/size", "rubric size"),
)
"""(substring of a metric name, label) pairs shown on the console line and plotted by default."""



def _value(row: Mapping[str, Any], key: str) -> float | None:
    for k in (key, f"train/{key}", f"train_{key}"):
        v = row.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            return float(v)
    return None


def watched(key: str) -> str | None:
    """The label of a watched metric name (``None``: not watched; std/min/max variants are not)."""
    if key.endswith("/std") or "min_" in key or "max_" in key or key.startswith("time/"):
        return None  # time/* parts get one stacked panel of their own
    for pattern, label in WATCHED:
        if pattern in key:
            return label if key == pattern else key
    return None


def curve_keys(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """Metric names worth a panel: the watched ones present in the log, plus loss and KL."""
    present = {k for r in records for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    keys: list[str] = []
    for pattern, _label in WATCHED:
        keys += [k for k in sorted(present) if pattern in k and k not in keys and watched(k) is not None]
    keys += [k for k in ("loss", "kl", "entropy") if k in present and k not in keys]
    return keys


TIME_PARTS = ("generation", "reward", "logprobs", "backward", "optimizer")
"""The disjoint parts of a step (``train/run/timing.py``); ``time/verifier`` is a share of ``time/reward``."""


def _time_breakdown(rows: Sequence[Mapping[str, Any]]) -> dict[str, tuple[list[float], list[float]]]:
    """Per-step seconds of each ``time/*`` part present in the log (empty when the run was not timed)."""
    out: dict[str, tuple[list[float], list[float]]] = {}
    for part in (*TIME_PARTS, "verifier", "step"):
        pts = [(float(r.get("step", i)), v) for i, r in enumerate(rows)
               if (v := _value(r, f"time/{part}")) is not None]
        if pts:
            out[part] = ([x for x, _ in pts], [y for _, y in pts])
    return out if any(p in out for p in TIME_PARTS) else {}


def _plot_time_breakdown(ax: Any, timing: Mapping[str, tuple[list[float], list[float]]]) -> None:
    """Stacked bars of where each step's seconds went, the verifier's share drawn over the reward's."""
    bottom: dict[float, float] = {}
    for part in TIME_PARTS:
        if part not in timing:
            continue
        xs, ys = timing[part]
        base = [bottom.get(x, 0.0) for x in xs]
        ax.bar(xs, ys, bottom=base, width=0.8, label=part)
        if part == "reward" and "verifier" in timing:
            vx, vy = timing["verifier"]
            vbase = [bottom.get(x, 0.0) for x in vx]
            ax.bar(vx, vy, bottom=vbase, width=0.4, color="none", edgecolor="black", hatch="//", label="verifier")
        for x, y, b in zip(xs, ys, base, strict=True):
            bottom[x] = b + y
    if "step" in timing:
        ax.plot(*timing["step"], color="black", linewidth=1, marker=".", label="step")
    ax.set_ylabel("seconds per step", fontsize=8)
    ax.legend(loc="upper right", fontsize=6, ncol=3)
    ax.grid(alpha=0.3)


SMOOTH = 9
"""Points of the curves' centred moving average (the MoCo paper's Figure 5 uses 9)."""


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Centred moving average (the MoCo paper's Figure 5 uses 9 points); shrinks at the edges."""
    half = window // 2
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - half): i + half + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def plot_curves(
    source: Source,
    keys: Sequence[str] | None = None,
    path: str | Path = "curves.png",
    smooth: int = SMOOTH,
    title: str | None = None,
) -> dict[str, int]:
    """Plot each ``key`` against the step (logged trace plus a centred moving average) into a PNG.

    ``keys=None`` plots the watched metrics present (``curve_keys``). Keys absent from the log are left out
    (a recipe without rubrics has no rubric size); if none is present it is an error. A path ``source`` is
    read with ``load_metrics``; entries given in memory are plotted as they are. Returns the number of
    points plotted per key.
    """
    rows = load_metrics(source) if isinstance(source, (str, Path)) else metric_entries(source)
    return _plot_rows(rows, list(keys) if keys is not None else curve_keys(rows), path, smooth, title)


def _plot_rows(rows: Sequence[Mapping[str, Any]], names: Sequence[str], path: str | Path, smooth: int,
               title: str | None) -> dict[str, int]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, tuple[list[float], list[float]]] = {}
    for key in names:
        xs, ys = [], []
        for i, row in enumerate(rows):
            v = _value(row, key)
            if v is not None:
                xs.append(float(row.get("step", i)))
                ys.append(v)
        if ys:
            series[key] = (xs, ys)
    if not series:
        found = sorted({k for r in rows for k in r})
        raise DataError("keys", names, f"none of them is in the log ({len(rows)} rows)",
                        f"choose among the logged keys: {', '.join(found[:30]) or '(empty log)'}")
    timing = _time_breakdown(rows)
    panels = len(series) + (1 if timing else 0)
    fig, axes = plt.subplots(panels, 1, figsize=(7, 2.4 * panels), sharex=True, squeeze=False)
    if timing:
        _plot_time_breakdown(axes[-1, 0], timing)
    for ax, (key, (xs, ys)) in zip(axes[:, 0], series.items(), strict=False):
        ax.plot(xs, ys, color="tab:blue", alpha=0.35, linewidth=1, marker="o", markersize=2.5, label="logged")
        if smooth > 1 and len(ys) > 2:
            ax.plot(xs, moving_average(ys, smooth), color="tab:blue", linewidth=2, label=f"{smooth}-point mean")
        ax.set_ylabel(key, fontsize=8)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("step")
    axes[0, 0].legend(loc="best", fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return {k: len(v[1]) for k, v in series.items()}


def run_curves(records: Sequence[Mapping[str, Any]], out: str | Path, keys: Sequence[str] | None = None,
               smooth: int | None = None, title: str | None = None, tensorboard: bool = False) -> dict[str, Any]:
    """A finished run's curves, as its result file holds them: ``curves.png`` in the run folder ``out`` from the
    logged steps ``records`` (none when nothing was logged; ``keys=None``: the watched metrics present), where
    the metrics and TensorBoard's logs are, the first and last reward, and the mean step time."""
    folder = Path(out)
    names = list(keys) if keys is not None else curve_keys(records)
    names = [k for k in names if any(isinstance(r.get(k), (int, float)) for r in records)]
    png = folder / "curves.png"
    points = _plot_rows(records, names, png, SMOOTH if smooth is None else smooth, title) if names else None
    result: dict[str, Any] = {"curves": str(png) if points else None, "curve_points": points,
                              "metrics": str(folder / "metrics.jsonl") if records else None,
                              "tensorboard": str(folder / "tensorboard") if tensorboard else None}
    rewards = [m["reward"] for m in records if isinstance(m.get("reward"), (int, float)) and not math.isnan(m["reward"])]
    if rewards:
        result["reward_first"], result["reward_last"] = round(rewards[0], 4), round(rewards[-1], 4)
    times = [m["step_time"] for m in records if isinstance(m.get("step_time"), (int, float))]
    if times:
        result["step_seconds"] = round(sum(times) / len(times), 2)
    return result
