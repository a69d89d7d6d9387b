"""Live feedback of a training run: per-step metrics file, a one-line console summary and per-caption
sample records (the curves PNG is ``train.run.curves``).

TRL already computes the step metrics (reward, its std, the fraction of groups whose rewards are all
equal, completion lengths) and forwards what reward functions log with ``log_metric`` (hard and soft
accuracy, verifier failures, shaping terms); TensorBoard/W&B get them through ``report_to``. This module
keeps a copy on disk (``metrics.jsonl``) that survives an interrupt and prints the few numbers a person
watches.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from captionrl.records import RecordWriter, read_jsonl
from captionrl.train.run.curves import watched


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
    """The console line of one step: the watched metrics (``curves.WATCHED``) and the step time."""
    parts = [f"step {rec.get('step')}"]
    for key, value in sorted(rec.items()):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or key in ("step", "epoch"):
            continue
        label = watched(key)
        if label is not None:
            parts.append(f"{label}={value:.3g}")
    if "step_time" in rec and isinstance(rec["step_time"], (int, float)):
        parts.append(f"{rec['step_time']:.1f}s/step")
    return " | ".join(parts)


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
