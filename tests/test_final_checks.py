"""End-of-run checks: span audit, transcription, form, and the training verifier kept out of the mean."""

from __future__ import annotations

import json

import numpy as np
import pytest

from captionrl.domains.describe import describe_series
from captionrl.eval.final_checks import caption_checks, identification_columns, run_final_checks

RISING = np.linspace(10, 40, 12).round(2)


def test_honest_caption_is_green_and_a_dump_is_transcription():
    honest = describe_series(RISING)
    wrong = "It falls from 90 to 5. The maximum is 3 at step 11."
    dump = ", ".join(f"{v:.2f}" for v in RISING[:8])
    series = {"a": RISING, "b": RISING, "c": RISING}
    rows = {name: caption_checks({k: cap}, {k: series[k]}, clipped={k: k == "c"})
            for name, k, cap in (("honest", "a", honest), ("wrong", "b", wrong), ("dump", "c", dump))}
    assert rows["honest"]["red"] == 0.0 and rows["honest"]["green"] > 0.3
    assert rows["wrong"]["red"] > 0.5 and rows["wrong"]["ends_with_stop"] == 1.0
    assert rows["dump"]["transcription"] == pytest.approx(8 / 12, abs=1e-4) and rows["dump"]["run_frac"] == 1.0
    assert rows["dump"]["ends_with_stop"] == 0.0 and rows["dump"]["clipped_ratio"] == 1.0


def test_training_verifier_is_its_own_column_and_never_in_the_mean():
    summary = {"rows": [{"system": "trained", "c2s[train-verifier]": 1.0, "c2s[glm]": 0.5, "c2s[phi]": 0.3,
                         "c2s": 0.6}, {"system": "initial", "c2s[train-verifier]": 0.4}]}
    cols = identification_columns(summary)
    assert cols["trained"] == {"c2s[train]": 1.0, "c2s[glm]": 0.5, "c2s[phi]": 0.3, "c2s_eval_mean": 0.4}
    assert cols["initial"]["c2s_eval_mean"] is None


def test_run_writes_the_table_and_says_when_no_independent_verifier_exists(tmp_path):
    summary = run_final_checks({"trained": {"a": describe_series(RISING)}}, {"a": RISING}, tmp_path,
                               identification={"rows": [{"system": "trained", "c2s[train-verifier]": 1.0}]})
    saved = json.loads((tmp_path / "final_checks.json").read_text())
    assert saved["rows"][0]["c2s[train]"] == 1.0 and saved["rows"][0]["c2s_eval_mean"] is None
    assert any("no evaluation verifier" in n for n in summary["notes"])
    assert "| system |" in (tmp_path / "final_checks.md").read_text()


@pytest.mark.slow
def test_bottleneck_column_comes_from_the_real_caption_only_predictor(tmp_path):
    """The bottleneck check runs the real predictor (MiniLM encoder + ridge head), cross-fitted so every window
    is scored: the describer's captions carry the series (lower MSE than a vague caption and than the
    describer's captions shuffled across windows), and a caption that is the same for every window carries
    exactly what the empty caption carries (the ridge head then predicts the training mean in both)."""
    from captionrl.domains.corpora import load_embedded_corpus
    from captionrl.domains.timeseries import window

    wins = [w for s in load_embedded_corpus() if len(s) >= 48 for w in window(s, 24)[:3]][:15]
    series = {w.id: w.values.tolist() for w in wins}
    honest = {w.id: describe_series(w) for w in wins}
    vague = {w.id: "The series moves up and down." for w in wins}
    out = run_final_checks({"describer": honest, "vague": vague}, series, tmp_path, bottleneck=True)
    rows = {r["system"]: r for r in out["rows"]}
    mse = {name: r.get("bottleneck_mse") for name, r in rows.items()}
    assert {"describer", "vague", "empty caption", "shuffled caption"} <= set(mse), mse
    assert mse["describer"] < mse["vague"] and mse["describer"] < mse["shuffled caption"], mse
    assert mse["vague"] == pytest.approx(mse["empty caption"], abs=1e-6), mse
    lo, hi = rows["describer"]["bottleneck_mse_ci"]
    assert lo < mse["describer"] < hi
    items = json.loads((tmp_path / "bottleneck" / "items.json").read_text())["item_mse"]
    assert len(items["describer"]) == len(wins)  # every window scored, none held back for a test split
    diff = [items["describer"][i] - items["vague"][i] for i in items["describer"]]
    assert rows["describer"]["bottleneck_vs_vague"] == pytest.approx(float(np.mean(diff)), abs=1e-4)
    assert not any("failed" in n for n in out.get("notes", []))


def _windows(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {}
    for j in range(n):
        slope = (-1, 0, 1)[j % 3] * 2.0
        out[f"w{j}"] = (50 + slope * np.arange(16) + rng.normal(0, 0.3, 16)).round(2)
    return out


def test_verdict_is_taken_against_rl_start_point_with_the_initial_model_as_second_reference(tmp_path):
    """A run whose RL changed nothing over its warm start is 'not better' against that start point, however
    much the warm start beat the untrained model: the warm start's gain is reported as the second reference."""
    from captionrl.eval.final_checks import verdict_references

    series = _windows(24)
    honest = {i: describe_series(v) for i, v in series.items()}
    silent = dict.fromkeys(series, "This is a time series of sixteen values here.")
    systems = {"trained": honest, "warm start": honest, "initial": silent}
    refs = verdict_references(list(systems))
    assert list(refs) == ["warm start", "initial"]
    out = run_final_checks(systems, series, tmp_path, references=refs)
    assert out["verdict"]["systems"] == ["trained", "warm start"]
    assert out["verdict"]["outcome"] == "not better"
    assert out["verdict"]["line"].startswith("verdict against RL's start point (the warm start): NOT BETTER")
    (second,) = out["reference_verdicts"]
    assert second["systems"] == ["trained", "initial"] and second["outcome"] == "better"
    text = (tmp_path / "final_checks.md").read_text()
    assert "Reference, trained vs initial: verdict against the initial model: BETTER" in text
    # without a warm start the initial model decides, as before
    assert list(verdict_references(["trained", "initial"])) == ["initial"]
    from captionrl.errors import DataError

    with pytest.raises(DataError, match="references"):
        run_final_checks(systems, series, tmp_path / "x", references={"nobody": "a model"})


def test_checks_per_corpus_report_each_group_with_its_own_verdict(tmp_path):
    """A captioner right about one corpus and silent about another: the per-corpus table shows both, so a gain
    on one cannot hide a loss on the other."""
    from captionrl.eval.final_checks import run_final_checks_by_group

    series = _windows(24)
    ids = sorted(series)
    groups = {"first": ids[:12], "second": ids[12:]}
    silent = "This is a time series of sixteen values here."
    trained = {i: describe_series(series[i]) if i in groups["first"] else silent for i in ids}
    initial = dict.fromkeys(ids, silent)
    errors = {"trained": {i: (1.0 if i in groups["first"] else 100.0) for i in ids},
              "initial": {i: (2.0 if i in groups["first"] else 100.0) for i in ids}}
    out = run_final_checks_by_group({"trained": trained, "initial": initial}, series, groups, tmp_path,
                                    bottleneck_items=errors)
    rows = {(r["corpus"], r["system"]): r for r in out["rows"]}
    assert rows[("first", "trained")]["direction_right"] == 1.0 and rows[("first", "trained")]["n"] == 12
    assert rows[("second", "trained")]["direction_right"] == 0.0
    # the reconstruction errors cross-fitted over every window, averaged per corpus: the second corpus's large
    # errors do not hide the first's difference
    assert rows[("first", "trained")]["bottleneck_mse"] == 1.0 and rows[("first", "initial")]["bottleneck_mse"] == 2.0
    assert rows[("second", "trained")]["bottleneck_mse"] == 100.0
    assert out["verdicts"]["first"][0]["outcome"] == "better"
    assert out["verdicts"]["second"][0]["outcome"] == "worse"  # one silent sentence for every window
    text = (tmp_path / "by_corpus.md").read_text()
    assert "| first | trained | 12 | 1.000" in text and "- second: verdict against the initial model: WORSE" in text
    assert (tmp_path / "first" / "final_checks.json").is_file()


def _records(system: str, verifier: str, scores: dict[str, float | None], control: bool = False) -> list[dict]:
    """Identification records as ``eval/records.jsonl`` holds them (one per system, verifier and window)."""
    return [{"system": system, "verifier": verifier, "direction": "c2s", "control": control, "item_id": i,
             "soft": s, "hard": None if s is None else float(s > 0.5)} for i, s in scores.items()]


def test_held_out_identification_joins_the_checks_and_decides_the_verdict(tmp_path):
    """Per window, the evaluation verifiers' mean probability on the true series (``c2s_eval``) is a deciding
    check: the same description identified more by verifiers that took no part in training is better, and
    less is worse. The training verifier, the controls and unscored judgments are left out of it."""
    from captionrl.eval.final_checks import identification_items

    series = _windows(24)
    honest = {i: describe_series(v) for i, v in series.items()}
    ids = sorted(series)
    high = {i: 0.6 + 0.01 * (k % 5) for k, i in enumerate(ids)}
    low = {i: 0.3 + 0.01 * (k % 3) for k, i in enumerate(ids)}
    records = (_records("trained", "claims", high) + _records("warm start", "claims", low)
               + _records("trained", "train-verifier", dict.fromkeys(ids, 0.0))  # the reward's own: never counted
               + _records("trained", "claims", dict.fromkeys(ids, 0.0), control=True)
               + _records("trained", "other", {ids[0]: None, ids[1]: 0.0}))
    items = identification_items(records)
    assert items["trained"][ids[0]] == pytest.approx(high[ids[0]])  # the unscored judgment is not a zero
    assert items["trained"][ids[1]] == pytest.approx(high[ids[1]] / 2)  # a second verifier's score is averaged in
    systems = {"trained": honest, "warm start": honest}
    out = run_final_checks(systems, series, tmp_path / "up", identification_records=records,
                           references={"warm start": "RL's start point (the warm start)"})
    assert out["verdict"]["outcome"] == "better"
    assert "better on c2s_eval +0.2" in out["verdict"]["line"]
    assert out["rows"][0]["c2s_eval"] == pytest.approx(np.mean(list(items["trained"].values())), abs=1e-4)
    swapped = _records("trained", "claims", low) + _records("warm start", "claims", high)
    down = run_final_checks(systems, series, tmp_path / "down", identification_records=swapped,
                            references={"warm start": "RL's start point (the warm start)"})
    assert down["verdict"]["outcome"] == "worse" and "worse on c2s_eval" in down["verdict"]["line"]
    without = run_final_checks(systems, series, tmp_path / "none", references={"warm start": "the warm start"})
    assert without["verdict"]["outcome"] == "not better" and "c2s_eval" not in without["per_item"]["trained"]
