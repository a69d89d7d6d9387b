"""Live feedback of a training run: per-step metrics file, a one-line console summary, the curves PNG,
and per-caption sample records.

TRL already computes the step metrics (reward, its std, the fraction of groups whose rewards are all
equal, completion lengths) and forwards what reward functions log with ``log_metric`` (hard and soft
accuracy, verifier failures, shaping terms); TensorBoard/W&B get them through ``report_to``. This module
keeps a copy on disk (``metrics.jsonl``) that survives an interrupt, prints the few numbers a person
watches, and draws them at the end.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from captionrl.records import RecordWriter, read_jsonl

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
)
"""(substring of a metric name, label) pairs shown on the console line and plotted."""


def _import_callback_base() -> type:
    from transformers import TrainerCallback

    return TrainerCallback


class MetricsLog(_import_callback_base()):  # type: ignore[misc]
    """Writes every TRL log entry to ``metrics.jsonl`` (keyed by step, last write wins on resume) and
    prints a one-line summary under the progress bar."""

    def __init__(self, path: str | Path, echo: bool = True) -> None:
        self.path = Path(path)
        self.echo = echo
        self._writer: RecordWriter | None = None

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
        if not state.is_world_process_zero or not logs:
            return
        if self._writer is None:
            self._writer = RecordWriter(self.path, key_field="step")
        rec = {"step": int(state.global_step), "epoch": state.epoch, **logs}
        self._writer.write(rec)
        if self.echo and "reward" in logs:
            from tqdm.auto import tqdm

            tqdm.write(format_line(rec))

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def format_line(rec: dict[str, Any]) -> str:
    parts = [f"step {rec.get('step')}"]
    for key, value in sorted(rec.items()):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or key in ("step", "epoch"):
            continue
        for pattern, label in WATCHED:
            if pattern in key and not key.endswith("/std") and "min_" not in key and "max_" not in key:
                parts.append(f"{label if key == pattern else key}={value:.3g}")
                break
    if "step_time" in rec and isinstance(rec["step_time"], (int, float)):
        parts.append(f"{rec['step_time']:.1f}s/step")
    return " | ".join(parts)


def load_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Training log entries in step order; for a step logged twice (a resumed run) the last one wins."""
    by_step: dict[int, dict[str, Any]] = {}
    for rec in read_jsonl(path, appended=True):
        if "reward" in rec or "loss" in rec:
            by_step[int(rec["step"])] = rec
    return [by_step[s] for s in sorted(by_step)]


def curve_keys(records: Sequence[dict[str, Any]]) -> list[str]:
    """Metric names worth a panel: the watched ones present in the log, plus loss and KL."""
    present = {k for r in records for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    keys: list[str] = []
    for pattern, _label in WATCHED:
        for k in sorted(present):
            if pattern in k and k not in keys and not k.endswith("/std") and "min_" not in k and "max_" not in k:
                keys.append(k)
    for k in ("loss", "kl", "entropy"):
        if k in present and k not in keys:
            keys.append(k)
    return keys


def plot_curves(metrics_path: str | Path, png_path: str | Path, keys: Iterable[str] | None = None) -> Path | None:
    """One panel per metric against the step; returns the PNG path (``None`` when nothing was logged)."""
    records = load_metrics(metrics_path)
    if not records:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(keys) if keys is not None else curve_keys(records)
    if not names:
        return None
    cols = min(3, len(names))
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        pts = [(r["step"], r[name]) for r in records if isinstance(r.get(name), (int, float))]
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, marker="o", markersize=2.5, linewidth=1.2)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.tight_layout()
    out = Path(png_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


class SampleLog:
    """Per-caption training records (``samples.rank<R>.jsonl``): step, item, caption, reward terms.

    One file per process so that ranks never interleave writes. A resumed run re-generates the steps after
    its checkpoint; readers keep the last record of a key (see ``load_samples``).
    """

    def __init__(self, folder: str | Path) -> None:
        rank = os.environ.get("RANK", "0")
        self.path = Path(folder) / f"samples.rank{rank}.jsonl"
        self._writer: RecordWriter | None = None
        self._calls: dict[int, int] = {}

    def write(self, step: int, rows: Sequence[dict[str, Any]]) -> None:
        if self._writer is None:
            self._writer = RecordWriter(self.path)
        call = self._calls.get(step, 0)
        self._calls[step] = call + 1
        for i, row in enumerate(rows):
            self._writer.write({"key": f"s{step}-c{call}-{i}", "step": step, "index": i, **row})

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def load_samples(folder: str | Path) -> list[dict[str, Any]]:
    """Every sample record of a run (all ranks), in file order."""
    out: list[dict[str, Any]] = []
    for p in sorted(Path(folder).glob("samples.rank*.jsonl")):
        out.extend(read_jsonl(p, appended=True))
    return out
