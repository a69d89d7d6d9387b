"""The whole run's progress line: stage, step, elapsed time and an ETA scaled by this machine's speed."""

from __future__ import annotations

from types import SimpleNamespace

from captionrl.train.run.progress import ProgressCallback, RunProgress, Stage, clock_text


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_eta_is_every_remaining_unit_at_reference_cost_times_the_measured_speed():
    clock, lines = Clock(), []
    p = RunProgress([Stage("warm start", 4, 10.0), Stage("preflight", 2, 5.0), Stage("RL", 3, 30.0),
                     Stage("empty", 0, 99.0)], echo=lines.append, clock=clock)
    assert p.eta_seconds() == 40 + 10 + 90  # nothing timed: the reference costs as they are
    p.start("warm start")
    clock.now = 20.0  # a unit took 20 s against 10: this machine is twice as slow
    p.advance()
    assert p.speed() == 2.0 and p.eta_seconds() == 2.0 * (30 + 10 + 90)
    assert lines[-1] == ("run [1/3] warm start 1/4 | 20s elapsed | ETA 4m20s "
                         "(this machine: 2.00x the reference time)")
    p.finish("warm start")  # the rest of the stage was skipped (a finished warm start found on disk)
    assert p.eta_seconds() == 2.0 * (10 + 90)
    p.start("preflight")
    clock.now = 30.0  # a stage timed as a whole: its 2 units in 10 s against 10
    p.complete("preflight")
    assert p.speed() == 30 / 20 and p.stages["preflight"].done == 2
    p.start("unknown stage")  # ignored
    p.start("RL")
    clock.now = 60.0  # an RL unit in 30 s against 30: the speed so far is (20 + 10 + 30) / (10 + 10 + 30)
    p.advance()
    assert p.speed() == 60 / 50 and p.eta_seconds() == 1.2 * 60
    assert "[3/3] RL 1/3" in lines[-1]


def test_units_read_back_leave_the_plan_untimed():
    clock, lines = Clock(), []
    p = RunProgress([Stage("preflight", 8, 15.0), Stage("RL", 4, 30.0), Stage("final checks", 3, 50.0)],
                    echo=lines.append, clock=clock)
    p.start("preflight")
    clock.now = 1.0  # a preflight passed before: its 8 items are read back in a second
    p.finish("preflight")
    assert p.stages["preflight"].units == 0 and p.speed() == 1.0  # not "120x faster than the reference"
    assert p.eta_seconds() == 4 * 30 + 3 * 50
    p.start("RL")
    clock.now = 61.0  # an RL step in 60 s against 30
    p.advance()
    assert p.speed() == 2.0 and p.eta_seconds() == 2.0 * (3 * 30 + 3 * 50)
    p.finish("RL")
    p.start("final checks")
    clock.now = 161.0  # the trained captions in 100 s against 50
    p.advance()
    clock.now = 163.0  # a reference model's captions read back
    p.skip()
    p.skip(5)  # no more than the stage has left
    assert p.stages["final checks"].units == 1 and p.speed() == 2.0 and p.eta_seconds() == 0.0
    assert "final checks 1/1" in lines[-1]


def test_callback_counts_a_resumed_trainers_steps_and_leaves_preflight_time_out():
    clock = Clock()
    p = RunProgress([Stage("RL", 16, 30.0)], echo=lambda _: None, clock=clock)
    cb = ProgressCallback(p, "RL")
    state = SimpleNamespace(max_steps=16, global_step=4)
    cb.on_train_begin(None, state, None)
    clock.now = 100.0  # the preflight runs at train begin: not an RL step
    cb.on_step_begin(None, state, None)
    clock.now = 130.0
    cb.on_step_end(None, state, None)
    assert p.stages["RL"].done == 5 and p.speed() == 1.0
    cb.on_train_end(None, state, None)
    assert p.eta_seconds() == 0.0


def test_clock_text():
    assert [clock_text(s) for s in (5, 65, 3725)] == ["5s", "1m05s", "1h02m05s"]
