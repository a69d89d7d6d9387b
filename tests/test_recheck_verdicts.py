"""``scripts/recheck_verdicts.py`` rereads a finished run's held-out captions with today's checks: the windows
are rebuilt from the embedded corpus by the run's own config, the verdict is recomputed, and a run whose
captions say one direction of every window is not called better whatever its old verdict said."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from captionrl.domains.datasets import split_windows
from captionrl.domains.describe import describe_series
from script_modules import load_script


def _run(tmp_path: Path, name: str, trained: dict[str, str], initial: dict[str, str], old: str,
         warm: dict[str, str] | None = None) -> Path:
    """A run folder as ``train lineup`` leaves it, with the parts the script reads (``warm``: the warm
    start's captions, as a warm-started run's final checks write them)."""
    run = tmp_path / name
    (run / "eval").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"data": {"corpus": "embedded", "window": 16, "stride": None,
                                                              "prepared": None}}))
    records = [{"system": s, "item_id": i, "caption": c, "control": False}
               for s, caps in (("trained", trained), ("initial", initial), ("warm start", warm or {}))
               for i, c in caps.items()]
    (run / "eval" / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    red = {s: dict.fromkeys(trained, 0.0) for s in ("trained", "initial")}
    (run / "eval" / "final_checks.json").write_text(json.dumps({"verdict": {"outcome": old}, "per_item": red,
                                                                "config": {"instruction": "Describe it.",
                                                                           "tolerance": 0.35}}))
    return run


def test_a_run_is_rechecked_on_its_own_windows(tmp_path, capsys):
    windows = {w.id: np.asarray(w.values, dtype=float) for w in split_windows("embedded", 16)["test"][:30]}
    silent = dict.fromkeys(windows, "These are the values of a series over time.")
    honest = {i: describe_series(v) for i, v in windows.items()}
    wordings = ["Overall, the series is increasing.", "The value keeps increasing over time.",
                "The series increases over the window.", "Looking at the values, the series rises."]
    rising = {i: wordings[k % 4] for k, i in enumerate(windows)}
    script = load_script("recheck_verdicts")
    good = script.recheck(_run(tmp_path, "honest", honest, silent, "not better"))
    assert good["now"] == "better" and good["then"] == "not better" and good["direction_skill"] > 0.3
    guess = script.recheck(_run(tmp_path, "rising", rising, silent, "better"))
    assert guess["then"] == "better" and guess["now"] != "better", guess["line"]
    assert guess["direction_right"] > 0 and abs(guess["direction_skill"]) < 0.1
    script.main([str(tmp_path / "honest"), str(tmp_path / "rising")])
    table = capsys.readouterr().out
    assert "| not better | better |" in table and "direction_skill" in table


def test_a_warm_started_run_says_what_rl_added_and_the_runs_get_an_interval(tmp_path, capsys):
    """A warm-started seed (2026-12-04) whose warm start said "stays roughly flat" of every window and whose
    RL then said "rises" of most: the table shows trained minus warm start, and the last row the mean and
    interval over the runs."""
    windows = {w.id: np.asarray(w.values, dtype=float) for w in split_windows("embedded", 16)["test"][:30]}
    silent = dict.fromkeys(windows, "These are the values of a series over time.")
    honest = {i: describe_series(v) for i, v in windows.items()}
    flat = {i: f"Overall, the series stays roughly flat. It starts at {v[0]:.2f} and ends at {v[-1]:.2f}."
            for i, v in windows.items()}
    script = load_script("recheck_verdicts")
    runs = [_run(tmp_path, f"seed-{k}", honest, silent, "better", warm=flat) for k in range(3)]
    got = script.recheck(runs[0])
    assert got["direction_skill vs warm start"] > 0.3  # the flat template had no skill to start from
    script.main([str(r) for r in runs])
    table = capsys.readouterr().out
    assert "direction_skill (trained - warm start)" in table and "| mean [95% interval] over 3 runs | | 3 better |" in table


def test_a_run_on_other_data_is_refused_naming_the_setting(tmp_path):
    run = _run(tmp_path, "prepared", {}, {}, "better")
    (run / "config.yaml").write_text(yaml.safe_dump({"data": {"corpus": "embedded", "window": 16,
                                                              "prepared": "data/mine.jsonl"}}))
    with pytest.raises(SystemExit, match=re.escape("data.prepared='data/mine.jsonl'")):
        load_script("recheck_verdicts").recheck(run)
