"""Report: summaries of any protocol merged into tables, best and not-significantly-worse rows marked."""

from __future__ import annotations

import json

import pytest

from captionrl.errors import DataError
from captionrl.eval import report


def _write(folder, summary, png=False):
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(summary))
    if png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots()
        ax.plot([0, 1], [1, 0])
        fig.savefig(folder / "plot.png")
        plt.close(fig)


def test_marks_best_and_rows_not_significantly_worse(tmp_path):
    bott = {
        "protocol": "bottleneck", "columns": ["reconstruct:co2"], "better": {"reconstruct:co2": "lower"},
        "rows": [
            {"system": "naive", "baseline": True, "reconstruct:co2": 0.5},
            {"system": "best", "reconstruct:co2": 3.0, "per_seed": {"reconstruct:co2": [1.0, 2.0, 3.0, 4.0, 5.0]}},
            {"system": "close", "reconstruct:co2": 3.5, "per_seed": {"reconstruct:co2": [1.5, 2.1, 3.9, 4.2, 5.8]}},
            {"system": "noisy", "reconstruct:co2": 3.3, "per_seed": {"reconstruct:co2": [0.5, 2.9, 2.6, 4.9, 5.6]}},
        ],
    }
    _write(tmp_path / "runA", bott, png=True)
    ent = {"protocol": "entailment", "columns": ["entailment", "n_scored"],
           "rows": [{"system": "x", "entailment": 0.4, "n_scored": 9}, {"system": "y", "entailment": 0.6, "n_scored": 3}]}
    _write(tmp_path / "runB", ent)
    s = report.build([tmp_path / "runA", tmp_path / "runB"], tmp_path / "out")
    # naive is lower but a baseline; "close" has p = .034 against "best" (worse); "noisy" p > .05 (kept).
    assert s["tables"]["bottleneck"]["marks"]["reconstruct:co2"] == ["best", "noisy"]
    assert s["tables"]["entailment"]["marks"] == {"entailment": ["y"]}  # higher is better; counts unmarked
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| best | **3.0000** |" in md and "| close | 3.5000 |" in md
    page = (tmp_path / "out" / "report.html").read_text()
    assert "<b>0.6000</b>" in page and "figures/runA_plot.png" in page
    assert (tmp_path / "out" / "figures" / "runA_plot.png").exists()


def test_same_protocol_runs_merge_and_names_disambiguate(tmp_path):
    row = {"system": "mine", "win_rate": 0.5}
    _write(tmp_path / "r1", {"protocol": "pairwise", "columns": ["win_rate"], "rows": [row]})
    _write(tmp_path / "r2", {"protocol": "pairwise", "columns": ["win_rate"], "rows": [dict(row, win_rate=0.7)]})
    s = report.build([tmp_path], tmp_path / "out")
    names = [r["system"] for r in s["tables"]["pairwise"]["rows"]]
    assert names == ["mine", "mine (r2)"] and s["tables"]["pairwise"]["marks"]["win_rate"] == ["mine (r2)"]
    again = report.build([tmp_path], tmp_path / "out")  # its own summary.json is not read back as a run
    assert list(again["tables"]) == ["pairwise"]


def test_direction_inference_and_errors(tmp_path):
    assert report.direction("forecast:ETTh2 mse", {}) == "lower"
    assert report.direction("reconstruct:Rel.", {}) == "lower"
    assert report.direction("accuracy", {}) == "higher"
    assert report.direction("n_scored", {}) is None
    assert report.direction("x", {"x": "lower"}) == "lower"
    with pytest.raises(DataError, match="no summary"):
        report.build([tmp_path], tmp_path / "out")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "summary.json").write_text('{"rows": []}')
    with pytest.raises(DataError, match="protocol"):
        report.build([tmp_path / "bad"], tmp_path / "out2")


def test_one_result_type_one_writer_and_its_round_trip(tmp_path):
    from captionrl.eval.result import EvalResult, write_result

    res = EvalResult("demo", [{"system": "a", "acc": 0.25, "K": 4, "std": {"acc": 0.1}}, {"system": "b", "acc": float("nan"), "K": 4}],
                     ["K", "acc"], better={"acc": "higher"}, labels=["K"], config={"seed": 1},
                     records=str(tmp_path / "records.jsonl"), notes=["a note"], marked={"acc": ["a"]},
                     extra={"attempted": 2})
    write_result(res, tmp_path)
    table = (tmp_path / "table.md").read_text()
    assert table.startswith("# demo") and "| a | 4 | **0.2500 ± 0.1000** |" in table and "| b | 4 | - |" in table
    assert "- a note" in table and "<b>0.2500 ± 0.1000</b>" in (tmp_path / "table.html").read_text()
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["better"] == {"acc": "higher", "K": None} and data["attempted"] == 2
    back = EvalResult.from_summary(data)
    assert (back.protocol, back.columns, back.labels, back.marked, back.extra) == ("demo", ["K", "acc"], ["K"],
                                                                                  {"acc": ["a"]}, {"attempted": 2})
    assert report.direction("K", back.summary()["better"]) is None  # a label column is never marked
    with pytest.raises(DataError, match="higher, lower"):
        EvalResult("demo", [], [], better={"acc": "up"})
    with pytest.raises(DataError, match="system"):
        EvalResult("demo", [{"acc": 1.0}], ["acc"])
