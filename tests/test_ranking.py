"""Blind ranking: reply validation, the paper's total, seeded shuffles, mean rank and first-place share."""

from __future__ import annotations

import json
import re

import pytest

from captionrl.backends.base import Generation
from captionrl.eval.common import demo_systems, easy_vqa_items
from captionrl.eval.ranking import RankingEvalConfig, ranks_of, run, shuffled_order
from captionrl.judges.ranking import RankConfig, RankJudge, total_score, validate_reply


class WordCounter:
    """A ranking judge that scores accuracy by caption word count (capped at 10) in valid JSON."""

    name = "fake:word-counter"

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def generate(self, requests):
        out = []
        for r in requests:
            text = r.messages[0]["content"]
            self.prompts.append(text)
            caps = re.findall(r"Caption (\d+):\n(.*?)(?:\n\n|$)", text, re.DOTALL)
            entries = []
            for cid, cap in caps:
                words = 0 if cap == "(empty)" else len(cap.split())
                entries.append({"id": int(cid), "accuracy": min(words, 10), "completeness": 5, "clarity": 5,
                                "hallucination_penalty": 0})
            out.append(Generation("Here you go: " + json.dumps({"captions": entries})))
        return out


def test_validate_reply():
    good = '{"captions": [{"id": 2, "accuracy": 8, "completeness": 7, "clarity": 9, "hallucination_penalty": 1},' \
           ' {"id": 1, "accuracy": 5, "completeness": 5, "clarity": 5, "hallucination_penalty": 0}]}'
    scores, why = validate_reply(good, 2)
    assert why is None and scores[1]["accuracy"] == 8 and scores[0]["accuracy"] == 5
    assert validate_reply("no json here", 2)[1] == "no JSON in the reply"
    assert "entries" in validate_reply('{"captions": []}', 2)[1]
    bad = good.replace('"clarity": 9', '"clarity": 11')
    assert "clarity" in validate_reply(bad, 2)[1]
    dup = good.replace('"id": 2', '"id": 1')
    assert "repeated" in validate_reply(dup, 2)[1]


def test_total_and_ranks():
    s = {"accuracy": 9, "completeness": 6, "clarity": 9, "hallucination_penalty": 2}
    assert total_score(s) == pytest.approx(8 - 3)
    assert ranks_of([5.0, 7.0, 5.0, 1.0]) == [2.5, 1.0, 2.5, 4.0]


def test_protocol_with_fake_judge(tmp_path):
    systems = demo_systems(easy_vqa_items(5, seed=2))
    judge = RankJudge(WordCounter())
    result = run(RankingEvalConfig(out=str(tmp_path), seed=3), judge=judge, systems=systems)
    rows = {r["system"]: r for r in result.rows}
    # generic words (20 words, capped at 10) beats the 7-word reference; empty is last every time
    assert rows["empty"]["mean_rank"] == 4.0 and rows["empty"]["first_place"] == 0.0
    assert rows["generic"]["mean_rank"] == 1.0 and rows["generic"]["first_place"] == 1.0
    assert sum(r["first_place"] for r in rows.values()) == pytest.approx(1.0)
    assert sum(r["mean_rank"] for r in rows.values()) == pytest.approx(1 + 2 + 3 + 4)
    recs = [json.loads(x) for x in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert [r["order"] for r in recs] == [shuffled_order(list(systems), 3, r["id"]) for r in recs]
    assert len({tuple(r["order"]) for r in recs}) > 1  # shuffled per item
    assert result.extra["excluded"] == 0 and result.protocol == "ranking"
    assert result.better["mean_rank"] == "lower"


def test_invalid_replies_are_excluded(tmp_path):
    class Chatty(WordCounter):
        def generate(self, requests):
            return [Generation("Caption 1 is the best.") for _ in requests]

    systems = demo_systems(easy_vqa_items(3, seed=2))
    result = run(RankingEvalConfig(out=str(tmp_path)), judge=RankJudge(Chatty()), systems=systems)
    assert result.extra["excluded"] == result.extra["attempted"] == 3
    assert all(r["items"] == 0 for r in result.rows)


@pytest.mark.slow
def test_embedded_ranking_runs(tmp_path, embedded_backend):
    systems = demo_systems(easy_vqa_items(1, seed=0))
    judge = RankJudge(embedded_backend, RankConfig(mode="generate", max_new_tokens=48))
    result = run(RankingEvalConfig(out=str(tmp_path)), judge=judge, systems=systems)
    rec = json.loads((tmp_path / "records.jsonl").read_text().splitlines()[0])
    assert rec["raw"]  # the reply is kept as evidence, valid or not
    scores, why = validate_reply(rec["raw"], len(systems))  # the verdict is the validator's, on the kept reply
    assert rec["valid"] == (scores is not None) and rec["error"] == why
    assert result.extra["attempted"] == 1 and result.extra["excluded"] == (0 if rec["valid"] else 1)
    if rec["valid"]:  # ranks follow the parsed totals, in the shown order
        totals = [total_score(sc) for sc in scores]
        assert [rec["systems"][s]["rank"] for s in rec["order"]] == ranks_of(totals)
