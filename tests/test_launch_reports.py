"""How the 2-process rehearsals read a failed launch (``deepspeed_launch``): the report keeps the aborted
rank's native crash report, and only a rank killed by SIGABRT counts as a native abort (the one case
``test_shared_prefix_ranks`` launches once more). The launcher's text is torch's own, as a clean-clone CI
printed it on 2026-12-04 (a parse path: no launch needed)."""

from __future__ import annotations

from deepspeed_launch import _failure, native_abort


def launcher_report(root_exit: str) -> str:
    return f"""Traceback (most recent call last):
  File "/tmp/ci3/.venv/bin/accelerate", line 8, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
=======================================================
tests/shared_prefix_ranks.py FAILED
-------------------------------------------------------
Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 13184)  (SIGTERM)
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : {root_exit}
=======================================================
"""


ABORT = ("Fatal Python error: Aborted\n\nThread 0x00007f (most recent call first):\n  File \"deepspeed/comm/torch.py\", "
         "line 117 in all_gather_into_tensor\n\nExtension modules: numpy, torch (total: 2)\n")


def test_a_rank_killed_by_sigabrt_is_a_native_abort():
    assert native_abort(ABORT + launcher_report("-6 (pid: 13185)  (SIGABRT)"))


def test_a_rank_that_raised_or_was_stopped_is_not():
    assert not native_abort("AssertionError: max_dlogp 0.3\n" + launcher_report("1 (pid: 13185)"))
    assert not native_abort(launcher_report("-9 (pid: 13185)  (SIGKILL)"))
    assert not native_abort("no launcher report at all")


def test_the_failure_report_keeps_the_native_stack_however_long_the_output():
    out = ABORT + "x" * 20000 + launcher_report("-6 (pid: 13185)  (SIGABRT)") + "y" * 5000
    report = _failure(out)
    assert "all_gather_into_tensor" in report           # the aborted rank's stack, 25,000 characters before the end
    assert "ChildFailedError" in report                 # the launcher's traceback
    assert report.endswith("y" * 3000) and len(report) < 16000
    assert "all_gather_into_tensor" not in _failure("x" * 20000 + launcher_report("1 (pid: 1)") + "y" * 5000)
