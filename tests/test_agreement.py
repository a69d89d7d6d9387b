"""Judge-human agreement: exact agreement and Cohen's kappa against hand-computed values."""

from __future__ import annotations

import json
import math
import random

import pytest

from captionrl.errors import DataError
from captionrl.eval.agreement import AgreementEvalConfig, agreement, cohen_kappa, run


def test_kappa_hand_computed():
    human = ["A", "A", "B", "B", "tie", "A"]
    judge = ["A", "B", "B", "B", "tie", None]  # the last reply is invalid: excluded
    res = agreement(human, judge)
    # valid pairs: (A,A) (A,B) (B,B) (B,B) (tie,tie): p_o = 4/5
    # human marginals A2 B2 tie1, judge A1 B3 tie1: p_e = (2*1 + 2*3 + 1*1) / 25 = 9/25
    assert res["valid"] == 5 and res["invalid"] == 1 and res["n"] == 6
    assert res["exact"] == pytest.approx(0.8)
    assert res["kappa"] == pytest.approx((0.8 - 9 / 25) / (1 - 9 / 25))  # 0.6875


def test_kappa_edge_cases():
    assert cohen_kappa(["A", "B"], ["A", "B"]) == pytest.approx(1.0)
    assert cohen_kappa(["A", "B", "A", "B"], ["A", "A", "A", "A"]) == pytest.approx(0.0)  # constant judge
    assert cohen_kappa(["A", "B"], ["B", "A"]) == pytest.approx(-1.0)
    assert math.isnan(cohen_kappa([], []))
    with pytest.raises(DataError):
        agreement(["A", "maybe"], ["A", "B"])


def test_protocol_with_label_files(tmp_path):
    (tmp_path / "human.jsonl").write_text("".join(json.dumps({"id": i, "label": lab}) + "\n"
                                                  for i, lab in enumerate(["A", "A", "B", "B", "tie", "A"])))
    (tmp_path / "j1.jsonl").write_text("".join(json.dumps({"id": i, "decision": d}) + "\n"
                                               for i, d in enumerate(["A", "B", "B", "B", "tie", None])))
    summary = run(AgreementEvalConfig(labels=str(tmp_path / "human.jsonl"), judges=[f"j1={tmp_path / 'j1.jsonl'}"],
                                      out=str(tmp_path / "out")))
    row = summary.rows[0]
    assert row["system"] == "j1" and row["kappa"] == pytest.approx(0.6875) and row["invalid"] == 1
    assert summary.protocol == "agreement" and (tmp_path / "out" / "table.md").exists()


@pytest.mark.slow
def test_constructed_check_with_embedded_judge(tmp_path, embedded_backend):
    from captionrl.judges.pairwise import PairwiseJudge

    summary = run(AgreementEvalConfig(out=str(tmp_path), demo_items=4), judge=PairwiseJudge(embedded_backend))
    rows = {r["system"]: r for r in summary.rows}
    n = rows["always_A"]["n"]
    assert n >= 4 and rows["pairwise"]["valid"] == n  # letter scoring: every decision is valid
    # the seeded sides of the constructed pairs (seed 0: B B A B ...): both labels occur, so kappa is defined
    rng = random.Random("agreement|0")
    labels = ["B" if rng.random() < 0.5 else "A" for _ in range(n)]
    assert labels[:4] == ["B", "B", "A", "B"] and "A" in labels and "B" in labels
    assert rows["always_A"]["exact"] == pytest.approx(labels.count("A") / n)
    assert rows["always_A"]["kappa"] == 0.0  # a constant judge agrees only by chance
    recs = [json.loads(x) for x in (tmp_path / "records.jsonl").read_text().splitlines()]
    pw = [r for r in recs if r["judge"] == "pairwise"]  # written in item order
    assert [r["label"] for r in pw] == labels
    expected = cohen_kappa([r["label"] for r in pw], [r["decision"] for r in pw])  # its own recorded decisions
    assert rows["pairwise"]["kappa"] == pytest.approx(expected, nan_ok=True)
