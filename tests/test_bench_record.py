"""``bench/_workload.py``'s record: a bench prints its results; ``--record FILE`` also appends exactly what
it printed, under its command (with ``OMP_NUM_THREADS``) and wall time, to FILE; without it nothing is
written anywhere."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import _workload  # noqa: E402


def test_printed_lines_are_recorded_under_the_command_only_when_asked(tmp_path, monkeypatch, capsys):
    record = tmp_path / "draft.md"
    record.write_text("# Drafts\n")
    monkeypatch.setattr(_workload, "ROOT", tmp_path)  # a bench writes nothing under its checkout by default
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int)
    _workload.add_record_flag(ap)
    for argv in (["--items", "2", "--record", str(record)], ["--items", "3"]):
        say = _workload.Printed("/x/bench/bench_demo.py", argv)
        say("CPU: demo")
        say()
        say(f"ratio: {argv[1]}x")
        say.record(ap.parse_args(argv))
    assert capsys.readouterr().out == "CPU: demo\n\nratio: 2x\nCPU: demo\n\nratio: 3x\n"
    text = record.read_text()
    head, block = text.split("\n## ")
    assert head == "# Drafts\n" and "ratio: 3x" not in text
    assert re.fullmatch(rf"\d{{4}}-\d\d-\d\d \d\d:\d\d UTC: `OMP_NUM_THREADS=2 bench_demo.py --items 2 --record {re.escape(str(record))}` "
                        r"\(\d+ s wall\)", block.split("\n")[0])
    assert block.split("\n", 1)[1] == "\n```\nCPU: demo\n\nratio: 2x\n```\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft.md"]  # the run without --record wrote nothing


def test_a_reference_side_is_the_given_commits_tree_and_a_bad_ref_is_named(tmp_path):
    """The benches that compare with another commit take it on the command line (``--ref``, required) and
    run its ``src`` and ``configs``, extracted without touching this checkout's git state."""
    import pytest

    tree = _workload.ref_tree("HEAD", tmp_path)
    assert (tree / "src" / "captionrl" / "cli.py").is_file() and (tree / "configs" / "lineup-cpu.yaml").is_file()
    with pytest.raises(SystemExit, match="--ref no-such-ref"):
        _workload.ref_tree("no-such-ref", tmp_path)
    ap = argparse.ArgumentParser()
    _workload.add_ref_flags(ap, "test")
    with pytest.raises(SystemExit):  # no default commit: --ref is required
        ap.parse_args([])
    assert ap.parse_args(["--ref", "abc"]).ref == "abc"
