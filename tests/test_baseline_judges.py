"""Baseline rewards: CIDEr-D (hand-computed), the scalar LLM judge, and the TRL reward wrapper."""

from __future__ import annotations

import math

import pytest

from captionrl.judges.ngram import CiderD, CorpusRequired, NgramJudge, tokenize
from captionrl.judges.scalar import ScalarConfig, ScalarJudge, parse_grade


def test_cider_d_hand_computed():
    scorer = CiderD().fit([["a cat"], ["a dog"]])  # 2 images: idf("a") = 0, idf("cat") = idf("a cat") = ln 2
    # identical caption: unigram and bigram cosines are 1, no 3/4-grams: 10 * (1 + 1 + 0 + 0) / 4
    assert scorer.score("a cat", ["a cat"]) == pytest.approx(5.0)
    # "cat a cat": unigram cos = min(2,1)·1 / (2·1) = 0.5 (in units of ln2^2); bigram cos = 1/sqrt(2);
    # length in bigrams 2 vs 1 -> penalty exp(-1/72)
    expected = 10 * math.exp(-1 / 72) * (0.5 + 1 / math.sqrt(2)) / 4
    assert scorer.score("Cat, a cat!", ["a cat"]) == pytest.approx(expected)
    assert scorer.score("", ["a cat"]) == 0.0
    assert tokenize("A red-circle, 2 dots.") == ["a", "red", "circle", "2", "dots"]


def test_ngram_judge_orders_captions():
    refs = [["a red circle on the left"], ["two blue squares at the top"], ["a yellow triangle"]]
    judge = NgramJudge(corpus=refs)
    out = judge.judge(["a red circle on the left", "two blue squares", "a red circle"],
                      {"references": [refs[0], refs[0], refs[0]]})
    assert out[0].score > out[2].score > out[1].score >= 0
    assert out[0].extra["corpus_docs"] == 3
    # no corpus: refused (a per-batch fit made every idf 0 for one-sample requests), never a silent refit
    with pytest.raises(CorpusRequired, match="references"):
        NgramJudge()


def test_parse_grade():
    assert parse_grade("8") == 8
    assert parse_grade("Grade: 7/10") == 7
    assert parse_grade("10") == 10
    assert parse_grade("I would give it 0 or 12") is None
    assert parse_grade("") is None


def test_reward_wrapper_turns_unscored_into_none():
    from captionrl.rewards import RewardFunction
    from captionrl.rewards.reward import Reward

    class NoGrade:
        name = "fake:no-grade"

        def generate(self, requests):
            from captionrl.backends.base import Generation

            return [Generation("excellent caption!") if i % 2 else Generation(None, error="timeout")
                    for i, _ in enumerate(requests)]

    reward = RewardFunction(Reward(ScalarJudge(NoGrade(), ScalarConfig(mode="generate")), family="judge"))
    assert reward(prompts=["p", "p"], completions=["a", "b"]) == [None, None]


@pytest.mark.slow
def test_scalar_judge_embedded(embedded_backend):
    """The real model: every score must be the formula of what the model returned (hand-computed
    formulas with scripted backends are in test_formulas.py)."""
    caps = ["A red circle on the left of a white background.", "This caption is accurate and complete."]
    refs = {"reference": ["A red circle on the left."] * 2}
    choose = ScalarJudge(embedded_backend, ScalarConfig(mode="choose")).judge(caps, refs)
    for j in choose:  # in-process logits always give probabilities: None here would be a bug, not the model
        assert j.method == "logits" and j.score is not None
        assert 1.0 <= j.extra["expected_grade"] <= 9.0
        assert j.score == pytest.approx((j.extra["expected_grade"] - 1) / 8)
    assert [j.score for j in ScalarJudge(embedded_backend).judge(caps, refs)] == [j.score for j in choose]  # deterministic
    for j in ScalarJudge(embedded_backend, ScalarConfig(mode="generate", max_new_tokens=4)).judge(caps, refs):
        assert j.method == "generate" and j.raw is not None
        grade = parse_grade(j.raw)
        if grade is None:  # the model may not answer with a grade: then unscored, with its reply kept
            assert j.score is None and j.error == "no grade 1-10 in the reply"
        else:
            assert j.score == pytest.approx((grade - 1) / 9) and j.decision == grade
