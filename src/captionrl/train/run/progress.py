"""One progress line for a whole run: the stage, its step, the time so far and an ETA for the rest.

A run is a few stages of very different cost (a warm start, the reward preflight, RL steps, the final
checks); each trainer's own bar knows only its stage. ``RunProgress`` holds the plan (stage name, units of
work, reference seconds per unit) and the clock: the ETA is the remaining units of every stage, at their
reference cost, times this machine's speed so far (measured seconds over reference seconds of the units
done). Before any unit is timed the reference costs are taken as they are; from the first timed unit on,
the line says how fast this machine runs against them.

``ProgressCallback`` advances a stage at every optimizer step of a ``transformers``/TRL trainer; stages
without a trainer call ``start``/``advance``/``finish`` themselves. Work a rerun reads back would count as
done in no time: ``finish`` drops a whole stage's undone units untimed (a preflight passed before), ``skip``
some units of the current one (a reference model's stored captions).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from transformers import TrainerCallback

logger = logging.getLogger(__name__)


@dataclass
class Stage:
    """A stage of a run: its name, its units of work (steps, items) and each unit's reference seconds."""

    name: str
    units: int
    seconds_per_unit: float
    done: int = 0
    started: float | None = None
    finished: bool = False

    @property
    def reference_seconds(self) -> float:
        return self.units * self.seconds_per_unit


def clock_text(seconds: float) -> str:
    """``1h02m03s`` / ``12m03s`` / ``45s``."""
    s = round(max(seconds, 0.0))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


class RunProgress:
    """The whole run's progress line (see the module doc); ``echo`` receives each line (default: the log)."""

    def __init__(self, stages: Sequence[Stage], echo: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stages = {s.name: s for s in stages}  # a stage of 0 units may learn its size at train begin
        self.clock = clock
        self.t0 = clock()
        self.echo = echo or logger.info
        self.timed_seconds = 0.0      # measured seconds of the units done
        self.timed_reference = 0.0    # their reference seconds
        self._unit_started: float | None = None
        self.current: Stage | None = None

    # ------------------------------------------------------------------ the clock
    def start(self, name: str) -> None:
        """Stage ``name`` begins (unknown or empty stages are ignored)."""
        stage = self.stages.get(name)
        if stage is None:
            return
        self.current = stage
        stage.started = self._unit_started = self.clock()
        self.echo(self.line())

    def advance(self, n: int = 1) -> None:
        """``n`` units of the current stage are done."""
        stage = self.current
        if stage is None or n <= 0:
            return
        now = self.clock()
        n = min(n, stage.units - stage.done)
        if n <= 0:
            return
        if self._unit_started is not None:
            self.timed_seconds += now - self._unit_started
            self.timed_reference += n * stage.seconds_per_unit
        self._unit_started = now
        stage.done += n
        self.echo(self.line())

    def skip(self, n: int = 1) -> None:
        """``n`` units of the current stage need no work (made before and read back): they leave the plan
        untimed, so a rerun's read-back stages do not make this machine look faster than it is."""
        stage = self.current
        if stage is None or n <= 0:
            return
        stage.units -= min(n, stage.units - stage.done)
        self._unit_started = self.clock()
        self.echo(self.line())

    def complete(self, name: str) -> None:
        """Stage ``name``'s remaining units are done at once (a stage timed as a whole), and it is over."""
        stage = self.stages.get(name)
        if stage is not None and self.current is stage:
            self.advance(stage.units - stage.done)
        self.finish(name)

    def finish(self, name: str) -> None:
        """Stage ``name`` is over: its units left undone (skipped, resumed past) no longer count."""
        stage = self.stages.get(name)
        if stage is None:
            return
        stage.finished = True
        stage.units = stage.done
        if self.current is stage:
            self.current = None
        self._unit_started = self.clock()

    # ------------------------------------------------------------------ the line
    def speed(self) -> float:
        """Measured seconds per reference second so far (1.0 before anything is timed)."""
        return self.timed_seconds / self.timed_reference if self.timed_reference > 0 else 1.0

    def eta_seconds(self) -> float:
        """Seconds left: every unfinished stage's remaining units at reference cost, times the speed so far."""
        left = sum((s.units - s.done) * s.seconds_per_unit for s in self.stages.values() if not s.finished)
        return left * self.speed()

    def line(self) -> str:
        """``run [2/4] RL step 5/16 | 6m12s elapsed | ETA 8m40s (speed 1.3x the reference)``."""
        stage = self.current
        names = [n for n, s in self.stages.items() if s.units > 0 or s is stage]  # stages with work
        where = (f"[{names.index(stage.name) + 1}/{len(names)}] {stage.name} {stage.done}/{stage.units}"
                 if stage is not None else "[-]")
        speed = f" (this machine: {self.speed():.2f}x the reference time)" if self.timed_reference > 0 else ""
        return (f"run {where} | {clock_text(self.clock() - self.t0)} elapsed | "
                f"ETA {clock_text(self.eta_seconds())}{speed}")


class ProgressCallback(TrainerCallback):
    """Advances ``progress``'s stage ``name`` at every optimizer step of a trainer. The trainer's step count
    (and, after a resume, the steps already taken) is read at train begin; the stage starts at the first step,
    so work the trainer does before it (the reward preflight) is not charged to the stage; it finishes at
    train end."""

    def __init__(self, progress: RunProgress, name: str) -> None:
        self.progress = progress
        self.name = name

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        stage = self.progress.stages.get(self.name)
        if stage is not None and state.max_steps:
            stage.units = int(state.max_steps)
            stage.done = min(int(state.global_step or 0), stage.units)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.progress.current is None or self.progress.current.name != self.name:
            self.progress.start(self.name)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.progress.advance(1)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.progress.finish(self.name)
