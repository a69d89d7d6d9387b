"""Pairwise protocol: both orders cancel position bias, invalid replies are counted, runs resume."""

from __future__ import annotations

import json

import pytest

from captionrl.backends.base import ChoiceResult, Generation
from captionrl.errors import DataError
from captionrl.eval.common import demo_systems, easy_vqa_items, load_caption_file
from captionrl.eval.pairwise import PairwiseEvalConfig, run
from captionrl.judges.pairwise import PairwiseConfig, PairwiseJudge, outcome_for_first, parse_pairwise


class AlwaysA:
    """A maximally position-biased judge: all probability on "A" (or the reply "A"), counting calls."""

    name = "fake:always-A"

    def __init__(self, reply: str = "A") -> None:
        self.reply = reply
        self.prompts = 0

    def choose(self, prompts, options):
        self.prompts += len(prompts)
        return [ChoiceResult({o: float(o == "A") for o in options}, "logits", mass=1.0) for _ in prompts]

    def generate(self, requests):
        self.prompts += len(requests)
        return [Generation(self.reply) for _ in requests]

    def loglikelihood(self, pairs):  # pragma: no cover - not used
        raise NotImplementedError


@pytest.fixture(scope="module")
def systems():
    return demo_systems(easy_vqa_items(6, seed=1))


def test_parse_pairwise():
    assert parse_pairwise("A") == "A"
    assert parse_pairwise("  b. Caption B is better") == "B"
    assert parse_pairwise("Tie") == "tie"
    assert parse_pairwise("C") == "tie"
    assert parse_pairwise("They are equally good.") == "tie"
    assert parse_pairwise("I cannot help with that.") is None
    assert parse_pairwise("") is None


def test_both_orders_always_A_gives_exactly_half(tmp_path, systems):
    judge = PairwiseJudge(AlwaysA())
    result = run(PairwiseEvalConfig(out=str(tmp_path)), judge=judge, systems=systems)
    assert result.protocol == "pairwise"
    assert {r["system"] for r in result.rows} == set(systems)
    for row in result.rows:
        assert row["win_rate"] == 0.5  # one win and one loss per pair
        assert row["caparena"] == 0
        assert row["wins"] == row["losses"] > 0
        assert row["ties"] == row["invalid"] == 0
    # 4 systems -> 6 pairs x 6 items x 2 orders
    records = [json.loads(x) for x in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert len(records) == judge.backend.prompts == 6 * 6 * 2
    assert result.columns[0] == "win_rate" and result.better["win_rate"] == "higher"
    assert "| system | win_rate |" in (tmp_path / "table.md").read_text()
    # resume: the same out dir judges nothing again
    again = PairwiseJudge(AlwaysA())
    run(PairwiseEvalConfig(out=str(tmp_path)), judge=again, systems=systems)
    assert again.backend.prompts == 0


def test_baseline_protocol_and_unparseable_replies_are_excluded(tmp_path, systems):
    judge = PairwiseJudge(AlwaysA(reply="I refuse."), PairwiseConfig(mode="generate"))
    result = run(PairwiseEvalConfig(out=str(tmp_path), baseline="empty"), judge=judge, systems=systems)
    assert result.extra["attempted"] == 3 * 6 * 2 and result.extra["excluded"] == result.extra["attempted"]
    assert "excluded as invalid" in result.notes[0]
    assert all(r["win_rate"] != r["win_rate"] for r in result.rows)  # nan: nothing valid


def test_judge_protocol_score_against_baseline():
    judge = PairwiseJudge(AlwaysA())
    out = judge.judge(["a", "b"], {"baseline": ["x", "y"], "reference": ["r", "r"]})
    assert [j.score for j in out] == [0.5, 0.5]
    assert outcome_for_first(*judge.compare_both_orders(["a"], ["b"], ["r"])[0]) == [1.0, 0.0]


def test_missing_reference_and_bad_file(tmp_path):
    judge = PairwiseJudge(AlwaysA())
    with pytest.raises(DataError, match="reference"):
        judge.decide(["a"], ["b"], [None])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\n')
    with pytest.raises(DataError, match="caption"):
        load_caption_file(bad)


@pytest.mark.slow
def test_embedded_judge_end_to_end(tmp_path, embedded_backend):
    items = easy_vqa_items(2, seed=0)
    sys = {k: v for k, v in demo_systems(items).items() if k in ("reference", "empty")}
    for name, caps in sys.items():
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in caps.values()))
    cfg = PairwiseEvalConfig(captions=[str(tmp_path / "reference.jsonl"), str(tmp_path / "empty.jsonl")],
                             out=str(tmp_path / "out"))
    result = run(cfg, judge=PairwiseJudge(embedded_backend))
    assert result.extra["attempted"] == 4 and result.extra["excluded"] == 0
    recs = [json.loads(x) for x in (tmp_path / "out" / "records.jsonl").read_text().splitlines()]
    assert all(r["method"] == "logits" and abs(sum(r["probs"].values()) - 1) < 1e-6 for r in recs)
    rows = {r["system"]: r for r in result.rows}
    for r in recs:  # each decision is the argmax letter of the recorded probabilities
        best = max(r["probs"], key=r["probs"].get)
        assert r["decision"] == ("tie" if best == "C" else best)
    for name in ("reference", "empty"):  # and the table is the tally of those decisions
        wins = sum(r["winner"] == name for r in recs)
        ties = sum(r["winner"] == "tie" for r in recs)
        assert rows[name]["wins"] == wins and rows[name]["ties"] == ties
        assert rows[name]["win_rate"] == pytest.approx((wins + ties / 2) / len(recs))


class ReferenceOracle:
    """``choose`` that knows the truth from the prompt: the caption equal to the reference is better."""

    name = "scripted:oracle"

    def choose(self, prompts, options):
        out = []
        for p in prompts:
            text = p[-1]["content"]
            ref = text.split("Reference description of the image:\n", 1)[1].split("\n\nCaption A:", 1)[0]
            a = text.split("Caption A:\n", 1)[1].split("\n\nCaption B:", 1)[0]
            b = text.split("Caption B:\n", 1)[1].split("\n\n", 1)[0]
            pick = "A" if a == ref else "B" if b == ref else "C"
            out.append(ChoiceResult({o: float(o == pick) for o in options}, "logits", mass=1.0))
        return out


def test_an_oracle_judge_makes_the_reference_win_every_comparison_in_both_orders(tmp_path, systems):
    result = run(PairwiseEvalConfig(out=str(tmp_path)), judge=PairwiseJudge(ReferenceOracle()), systems=systems)
    rows = {r["system"]: r for r in result.rows}
    others = [s for s in systems if s != "reference"]
    assert rows["reference"]["win_rate"] == 1.0  # whichever side it is shown on
    assert rows["reference"]["wins"] == len(others) * 6 * 2 and rows["reference"]["losses"] == 0
    for s in others:  # against each other the non-references tie (neither equals the reference)
        assert rows[s]["losses"] == 6 * 2 and rows[s]["ties"] == (len(others) - 1) * 6 * 2
        assert rows[s]["win_rate"] == pytest.approx(((len(others) - 1) * 6 * 2 / 2) / (len(others) * 6 * 2))
