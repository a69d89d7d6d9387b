"""Reward-hacking probes: the report shows which reward a probe caption can exploit."""

from __future__ import annotations

import json

import pytest

from captionrl.eval.hacking import (
    REWARDS,
    HackingEvalConfig,
    NotApplicable,
    ProbedReward,
    image_probes,
    run,
    series_probes,
)
from captionrl.probes import PROBES, SERIES_PROBES


def test_probe_sets_are_well_formed():
    s = series_probes(n=2, k=3, length=12, seed=1)
    assert len(s.columns["candidates"][0]) == 3 and len(s.columns["candidates"][0][0]) == 12
    assert s.captions["dump"][0].startswith("Values: ")
    assert s.captions["other_item"][0] == s.captions["honest"][1]
    assert s.meta["windows"][0][0] == s.ids[0]
    assert series_probes(n=2, k=3, length=12, seed=1).ids == s.ids  # seeded
    im = image_probes(n=2, seed=0)
    assert set(im.captions) == set(PROBES) and im.captions["other_item"][0] != im.captions["honest"][0]
    # series also get invented values: plausible numbers, none of them the series' own at any rounding
    assert set(s.captions) == {*PROBES, *SERIES_PROBES, "answer", "wrong_extreme"}
    assert s.captions["invented_values"][0].startswith("The values are ")


def test_cider_report_without_a_model(tmp_path):
    def not_applicable(backend, probes):
        raise NotApplicable("the items carry no widget column")

    def broken(backend, probes):
        raise TypeError("a bug in a reward builder")

    REWARDS.add("future-reward", ProbedReward(("images",), not_applicable))
    try:
        cfg = HackingEvalConfig(rewards=["cider", "future-reward"], out=str(tmp_path), n=3, length=12)
        summary = run(cfg)
    finally:
        REWARDS._items.pop("future-reward")
    rows = {r["system"]: r for r in summary.rows}
    for domain in ("series", "images"):
        row = rows[f"cider ({domain})"]
        assert row["honest"] > max(row[p] for p in PROBES[1:])
    assert rows["cider (images)"]["exploitable"] == "-"
    # CIDEr-D pays n-grams shared with the reference, true or not: "Its highest value is X." with the wrong X
    # scores above the same answer without it
    assert rows["cider (series)"]["exploitable"] == "wrong_extreme"
    assert rows["cider (series)"]["wrong_extreme"] > rows["cider (series)"]["answer"]
    assert summary.protocol == "hacking" and summary.columns[0] == "honest"
    assert summary.extra["skipped"] == ["future-reward (images): skipped, does not apply: the items carry no widget column"]
    # only NotApplicable skips: a bug (TypeError, ImportError, LookupError) is not a probe that does not apply
    REWARDS.add("broken-reward", ProbedReward(("images",), broken))
    try:
        with pytest.raises(TypeError, match="a bug"):
            run(HackingEvalConfig(rewards=["broken-reward"], domains=["images"], out=str(tmp_path / "b"), n=3))
    finally:
        REWARDS._items.pop("broken-reward")


@pytest.mark.slow
def test_letter_verifier_scores_injected_answer_at_chance(tmp_path, embedded_backend):
    k = 4
    cfg = HackingEvalConfig(rewards=["identification-letter"], domains=["series"], n=1, k=k, length=12,
                            probes=["honest", "injected_answer"], out=str(tmp_path))
    summary = run(cfg, backend=embedded_backend)
    row = summary.rows[0]
    # the truth visits every letter across the K rotations, so "The answer is A." is right exactly once
    assert row["injected_answer/hard"] == pytest.approx(1 / k)
    recs = [json.loads(x) for x in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert {r["probe"] for r in recs} == {"honest", "injected_answer"}
    assert all(r["method"] == "logits" for r in recs)


def test_series_table_has_the_transcription_guard_columns(tmp_path):
    summary = run(HackingEvalConfig(rewards=["cider", "identification-claims"], domains=["series"], out=str(tmp_path),
                                    n=3, length=12))
    rows = {r["system"]: r for r in summary.rows}
    guard = rows["transcription guard (series)"]
    assert guard["dump"] == pytest.approx(1.0)  # the dump copies every value of the series
    assert guard["invented_values"] == pytest.approx(0.0)  # ...and invented values copy none: the guard is blind
    assert rows["identification-claims (series)"]["invented_values"] < rows["identification-claims (series)"]["honest"]
    assert guard["honest"] <= 4 / 12 and guard["empty"] == 0.0
    assert "exploitable_guarded" in summary.columns
    claims = rows["identification-claims (series)"]
    # the code-checked verifier: the honest caption identifies its series, a dump scores exactly chance
    assert claims["honest"] > claims["dump"] == pytest.approx(1 / 4)
    # ...but identification rewards any one distinguishing fact: the start value alone, or the right values
    # with the wrong direction, identify as well as a description; no number-only probe wins it
    # (and a false extreme added to the answer costs it nothing: identification alone does not read truth)
    lazy = {"start_only", "start_sentence", "wrong_direction", "hedge", "wrong_extreme"}
    assert set(claims["exploitable"].split(", ")) <= lazy and "start_only" in claims["exploitable"]
    assert "transcription guard (series)" in (tmp_path / "table.md").read_text()


def test_a_false_extreme_is_judged_against_the_answer_it_extends(tmp_path):
    """``wrong_extreme`` is the plain answer plus a series value named as the extreme it is not: the report
    compares it with that answer (asked for or not). Identification alone, even by the code-checked verifier,
    pays the false sentence as much as the answer (both pick the true window out of random distractors), so it
    is flagged: only the training reward's factuality terms make it cost."""
    summary = run(HackingEvalConfig(rewards=["identification-claims"], domains=["series"], out=str(tmp_path), n=4,
                                    length=16, probes=["wrong_extreme"]))
    claims = {r["system"]: r for r in summary.rows}["identification-claims (series)"]
    assert set(summary.config["probes"]) == {"honest", "answer", "wrong_extreme"}
    assert claims["wrong_extreme"] == pytest.approx(claims["answer"]) and claims["exploitable"] == "wrong_extreme"
    assert claims["honest"] >= claims["answer"]
    assert any("wrong_extreme's: answer" in n for n in summary.notes)
    # the rule itself: a probe at or above its own reference wins, whatever the honest caption scores
    from captionrl.eval.hacking import winners

    assert winners({"honest": 0.9, "answer": 0.5, "wrong_extreme": 0.6, "dump": 0.2},
                   ["honest", "answer", "wrong_extreme", "dump"]) == "wrong_extreme"
    assert winners({"honest": 0.9, "answer": 0.5, "wrong_extreme": 0.4, "dump": 0.9},
                   ["honest", "answer", "wrong_extreme", "dump"]) == "dump"


def test_wrong_direction_probe_follows_the_checkers_direction_rule():
    """The probe's direction comes from the one rule the describer and the claim checker share: a window that
    climbs and then drops below its start has a rising trend line, and that rule calls it neither."""
    from captionrl.domains.describe import overall_direction
    from captionrl.judges.key_facts import key_facts, with_labelled_direction
    from captionrl.probes import direction_word
    from captionrl.probes import series_probes as one_series_probes

    hump = [5.0 + i for i in range(15)] + [4.0]
    assert overall_direction(hump) == "flat" and direction_word(hump) == "stays flat"
    assert direction_word(list(range(16))) == "rises" and direction_word(list(range(16))[::-1]) == "falls"
    for values in (hump, [float(i) for i in range(16)], [float(-i) for i in range(16)]):
        probe = one_series_probes(values, "Describe the series.")["wrong_direction"]
        facts = with_labelled_direction(key_facts(probe, values), values)
        assert facts.direction is not None and facts.direction_correct is False, probe


def test_every_family_reward_is_built_by_build_reward_with_its_one_name(tmp_path):
    """Each reward family is probed under its one name (``rewards.spec.FAMILIES``) and built as training builds
    it (``build_reward``: a ``Reward`` over the family's judge); the older names say what they became."""
    from captionrl.errors import ConfigError
    from captionrl.judges.claims_verifier import ClaimsIdentificationJudge
    from captionrl.judges.ngram import NgramJudge
    from captionrl.rewards.reward import Reward
    from captionrl.rewards.spec import FAMILIES

    assert set(FAMILIES) <= {n.split("-")[0] for n in REWARDS.names()}
    series = series_probes(n=3, k=3, length=12)
    cider = REWARDS.get("cider").build(None, series)
    claims = REWARDS.get("identification-claims").build(None, series)
    assert isinstance(cider, Reward) and isinstance(cider.base, NgramJudge) and cider.family == "cider"
    assert isinstance(claims, Reward) and isinstance(claims.base, ClaimsIdentificationJudge)
    assert claims.base.cfg.k == 3 and cider.shaping.transcription_penalty == 0.0  # no shaping: the judge's score
    for old, new in (("scalar", "judge"), ("ngram", "cider"), ("qa", "answerability"),
                     ("identify-letter", "identification-letter")):
        with pytest.raises(ConfigError, match=f"was renamed to {new}"):
            HackingEvalConfig(rewards=[old], out=str(tmp_path))
