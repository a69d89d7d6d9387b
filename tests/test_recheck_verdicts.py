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


def _run(tmp_path: Path, name: str, trained: dict[str, str], initial: dict[str, str], old: str) -> Path:
    """A run folder as ``train lineup`` leaves it, with the parts the script reads."""
    run = tmp_path / name
    (run / "eval").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"data": {"corpus": "embedded", "window": 16, "stride": None,
                                                              "prepared": None}}))
    records = [{"system": s, "item_id": i, "caption": c, "control": False}
               for s, caps in (("trained", trained), ("initial", initial)) for i, c in caps.items()]
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


def test_a_run_on_other_data_is_refused_naming_the_setting(tmp_path):
    run = _run(tmp_path, "prepared", {}, {}, "better")
    (run / "config.yaml").write_text(yaml.safe_dump({"data": {"corpus": "embedded", "window": 16,
                                                              "prepared": "data/mine.jsonl"}}))
    with pytest.raises(SystemExit, match=re.escape("data.prepared='data/mine.jsonl'")):
        load_script("recheck_verdicts").recheck(run)
