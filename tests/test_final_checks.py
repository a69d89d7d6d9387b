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
    """The bottleneck check runs the real protocol (MiniLM encoder + ridge head) on the systems' captions and
    its controls; every system and control gets an MSE, and nothing is turned into a 'failed' note."""
    from captionrl.domains.corpora import load_embedded_corpus
    from captionrl.domains.timeseries import window

    wins = [w for s in load_embedded_corpus() if len(s) >= 48 for w in window(s, 24)[:2]][:12]
    series = {w.id: w.values.tolist() for w in wins}
    honest = {w.id: describe_series(w) for w in wins}
    vague = {w.id: "The series moves up and down." for w in wins}
    out = run_final_checks({"describer": honest, "vague": vague}, series, tmp_path, bottleneck=True)
    mse = {r["system"]: r.get("bottleneck_mse") for r in out["rows"]}
    assert {"describer", "vague", "naive", "empty caption", "shuffled caption"} <= set(mse), mse
    assert all(isinstance(v, float) and np.isfinite(v) for v in mse.values()), mse
    assert not any("failed" in n for n in out.get("notes", []))
