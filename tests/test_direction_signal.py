"""``scripts/direction_signal.py`` reads how the embedded captioner's next word after "Overall, the series"
moves with a window's direction, and how that changes under supervised teaching: the measurement behind
docs/main-job.md's "Why the direction is not learned"."""

from __future__ import annotations

import json

import numpy as np
import pytest

from script_modules import ROOT, load_script


def test_auc_ranks_and_counts_ties_half():
    auc = load_script("direction_signal").auc
    assert auc([3.0, 4.0], [1.0, 2.0]) == 1.0
    assert auc([1.0], [2.0]) == 0.0
    assert auc([1.0, 1.0], [1.0]) == 0.5
    assert auc([], [1.0]) is None and auc([1.0], []) is None


def test_the_held_out_windows_are_the_main_jobs_and_labelled_by_the_shape_rule():
    from captionrl.domains.describe import overall_direction

    rows = load_script("direction_signal").load_rows(ROOT / "configs" / "lineup-cpu.yaml", 0)
    assert len(rows["train"]) == 128
    assert len(rows["test"]) > 40  # every held-out window, not the 40 the final checks read
    labels = {overall_direction(r["series"]) for r in rows["test"]}
    assert labels == {"up", "down", "flat"}


def test_the_other_views_add_a_line_of_the_same_window():
    module = load_script("direction_signal")
    row = module.load_rows(ROOT / "configs" / "lineup-cpu.yaml", 0)["test"][0]
    assert module.with_view(row, "numbers") is row
    bars = module.with_view(row, "sparkline")["prompt"][0]["content"].split("Chart: ")[1].split("\n")[0]
    assert len(bars) == len(row["series"]) and set(bars) <= set(module.BARS)
    assert bars[int(np.argmax(row["series"]))] == module.BARS[-1] and bars[int(np.argmin(row["series"]))] == module.BARS[0]
    scaled = module.with_view(row, "scaled")["prompt"][0]["content"].split("Scaled 0-100: ")[1].split("\n")[0]
    values = [int(x) for x in scaled.split(", ")]
    assert values[int(np.argmax(row["series"]))] == 100 and values[int(np.argmin(row["series"]))] == 0
    assert row["series_text"] in module.with_view(row, "scaled")["prompt"][0]["content"]


@pytest.mark.slow
def test_teaching_the_word_moves_the_measure(tmp_path):
    """Taught on eight windows' directions, the captioner names them more often than before: the measure reads
    the model, it is not fixed by the data (a constant answer would leave accuracy at its start)."""
    module = load_script("direction_signal")
    rows = module.load_rows(ROOT / "configs" / "lineup-cpu.yaml", 0)["train"][:8]
    reader = module.Reader("Overall, the series")
    before = reader.measure(rows)
    for epoch in range(4):
        reader.teach(rows, lr=2e-4, seed=epoch)
    after = reader.measure(rows)
    assert sum(before["windows"].values()) == 8
    assert after["accuracy"] > before["accuracy"]
    out = tmp_path / "signal.json"
    assert module.main(["--n_test", "4", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [e["epoch"] for e in report["epochs"]] == [0] and report["cue"] == "Overall, the series"
