"""Hand-computed scores: identification (letter and likelihood, both directions, ``lam``, soft letter
scores), the rubric judge (choose, likelihood, sigmoid), the scalar judge and EvoLM's score-gain reward.

Scripted backends stand in for the model wherever the embedded model is too weak to be deterministic
about the answer; each one reads the truth from the prompt, so a wrong mapping of rotations (or of
contexts) to the truth makes these tests fail.
"""

from __future__ import annotations

import math
import re
import types

import pytest

from captionrl.backends.base import ChoiceResult, Generation
from captionrl.domains.timeseries import render_numbers
from captionrl.errors import BackendError
from captionrl.judges.identification import (
    LIKELIHOOD_CONTEXT,
    NULL_CONTEXT,
    IdentificationJudge,
    IdentifyConfig,
    softmax,
)
from captionrl.judges.rubric import RubricItem, RubricJudge
from captionrl.judges.scalar import ScalarConfig, ScalarJudge
from captionrl.types import Judgment

K = 4
SETS = [[[1.0, 2.0, 3.0], [9.0, 8.0, 7.0], [5.0, 5.0, 5.0], [0.0, 4.0, 0.0]],
        [[2.0, 2.0, 6.0], [1.0, 1.0, 1.0], [3.0, 0.0, 3.0], [7.0, 7.0, 1.0]]]


def render(values):
    return render_numbers(values, precision=2, normalise=None)[0]  # as the judge prints them


def blocks(prompt_text):
    """Letter -> block text of a K-way prompt (series rows ``A: 1.00, ...`` or captions ``A: "..."``)."""
    return {m.group(1): m.group(2).strip('"') for m in re.finditer(r"^([A-Z]): (.*)$", prompt_text, re.M)}


class LetterOracle:
    """``choose`` that knows the truth from the prompt: the caption (c2s) or the series (s2c) is the
    printed values of the true series, so the true option is the block that repeats it."""

    name = "scripted:oracle"

    def __init__(self, p_truth=None, wrong=False):
        self.p_truth, self.wrong, self.calls = p_truth, wrong, 0

    def choose(self, prompts, options):
        out = []
        for p in prompts:
            text = p[-1]["content"]
            m = re.search(r'description of one of them:\n"(.*)"', text) or re.search(r"time series:\n(.*)\n", text)
            target = m.group(1).strip()
            b = blocks(text)
            truth = next(o for o in options if b[o] == target)
            if self.p_truth is None:
                pick = next(o for o in options if o != truth) if self.wrong else truth
                probs = {o: float(o == pick) for o in options}
            else:  # P(truth) depends on where the truth is shown; the rest is shared evenly
                pt = self.p_truth[options.index(truth)]
                probs = {o: pt if o == truth else (1 - pt) / (len(options) - 1) for o in options}
            out.append(ChoiceResult(probs, "logits", mass=1.0))
        self.calls += len(prompts)
        return out


def letter_judge(backend, direction="c2s", **kw):
    return IdentificationJudge(backend, IdentifyConfig(mode="letter", direction=direction, k=K, **kw))


def c2s_columns():
    return [render(s[0]) for s in SETS], {"candidates": SETS}


def s2c_columns():
    return [render(s[0]) for s in SETS], {"series": [s[0] for s in SETS],
                                          "distractor_captions": [[render(d) for d in s[1:]] for s in SETS]}


@pytest.mark.parametrize("direction", ["c2s", "s2c"])
def test_an_oracle_verifier_scores_one_and_an_always_wrong_one_zero_through_all_rotations(direction):
    caps, cols = c2s_columns() if direction == "c2s" else s2c_columns()
    oracle = LetterOracle()
    good = letter_judge(oracle, direction).judge(caps, cols)
    assert oracle.calls == K * len(SETS)  # every item asked in all K rotations
    assert [j.score for j in good] == [1.0, 1.0]
    assert all(j.extra["truth"] == ["A", "B", "C", "D"] and j.decision == ["A", "B", "C", "D"] for j in good)
    bad = letter_judge(LetterOracle(wrong=True), direction).judge(caps, cols)
    assert [j.score for j in bad] == [0.0, 0.0]
    assert [j.extra["soft"] for j in bad] == [0.0, 0.0]


def test_soft_letter_score_and_lam_hand_computed():
    # P(truth) by the truth's position: 0.9, 0.6, 0.3, 0.2. The truth wins (argmax) where it beats the
    # even share of the rest: 0.9 > 0.033, 0.6 > 0.133, 0.3 > 0.233, but 0.2 < 0.267: hard = 3/4.
    oracle = LetterOracle(p_truth=[0.9, 0.6, 0.3, 0.2])
    caps, cols = c2s_columns()
    hard = letter_judge(oracle, lam=2.0).judge(caps, cols)
    assert [j.extra["hard"] for j in hard] == [0.75, 0.75]
    assert [j.extra["soft"] for j in hard] == pytest.approx([0.5, 0.5])  # (0.9 + 0.6 + 0.3 + 0.2) / 4
    assert [j.score for j in hard] == pytest.approx([1.5, 1.5])  # lam * hard
    soft = letter_judge(oracle, signal="soft", lam=2.0).judge(caps, cols)
    assert [j.score for j in soft] == pytest.approx([1.0, 1.0])  # lam * soft


class ScriptedLoglik:
    """``loglikelihood`` from a table keyed by (context kind, continuation); records the pairs."""

    name = "scripted:loglik"

    def __init__(self, table):
        self.table, self.pairs = table, []

    def loglikelihood(self, pairs):
        self.pairs.extend(pairs)
        return [self.table(ctx, cont) for ctx, cont in pairs]


def test_likelihood_c2s_hand_computed_argmax_ties_and_lam():
    truth = SETS[0]
    by_series = {render(truth[0]): -1.0, render(truth[1]): -2.0, render(truth[2]): -3.0, render(truth[3]): -3.0}

    def table(ctx, cont):
        return by_series[ctx.removeprefix("Time series: ").split("\n")[0]]

    judge = IdentificationJudge(ScriptedLoglik(table), IdentifyConfig(mode="likelihood", k=K, lam=0.5))
    (j,) = judge.judge(["a caption"], {"candidates": [truth]})
    soft = math.exp(-1) / (math.exp(-1) + math.exp(-2) + 2 * math.exp(-3))
    assert (j.extra["hard"], j.extra["soft"]) == (1.0, pytest.approx(soft))
    assert j.score == 0.5  # lam * hard
    by_series[render(truth[1])] = -1.0  # a tie with one distractor: half credit
    (tie,) = judge.judge(["a caption"], {"candidates": [truth]})
    assert tie.extra["hard"] == 0.5 and tie.score == 0.25


def test_likelihood_s2c_uses_pointwise_mutual_information_hand_computed():
    caps = ["true caption", "short", "other one", "another"]
    cond = {"true caption": -5.0, "short": -4.0, "other one": -6.0, "another": -6.0}
    null = {"true caption": -6.0, "short": -1.0, "other one": -5.0, "another": -5.0}

    def table(ctx, cont):
        assert ctx == NULL_CONTEXT or ctx == LIKELIHOOD_CONTEXT.format(series=render(SETS[0][0]))
        return (null if ctx == NULL_CONTEXT else cond)[cont.strip()]

    judge = IdentificationJudge(ScriptedLoglik(table), IdentifyConfig(mode="likelihood", direction="s2c", k=K))
    (j,) = judge.judge([caps[0]], {"series": [SETS[0][0]], "distractor_captions": [caps[1:]]})
    # PMI = cond - null = [1, -3, -1, -1]: the true caption wins although "short" has the best raw log p
    assert j.extra["pmi"] is True and j.extra["scores"] == [1.0, -3.0, -1.0, -1.0]
    assert j.extra["hard"] == 1.0
    assert j.extra["soft"] == pytest.approx(float(softmax([1.0, -3.0, -1.0, -1.0])[0]))


def test_a_failed_verifier_is_unscored_never_zero():
    class Down:
        name = "scripted:down"

        def choose(self, prompts, options):
            return [ChoiceResult(None, "logits", error="connection refused") for _ in prompts]

        def loglikelihood(self, pairs):
            return [None] * len(pairs)

    caps, cols = c2s_columns()
    assert [j.score for j in letter_judge(Down()).judge(caps, cols)] == [None, None]
    lik = IdentificationJudge(Down(), IdentifyConfig(mode="likelihood", k=K)).judge(caps, cols)
    assert [j.score for j in lik] == [None, None] and all("verifier failed" in j.error for j in lik)


# ---------------------------------------------------------------------- rubric judge
RUBRIC = [RubricItem("a red circle", "is it red and round?", 3), RubricItem("two squares", "count them", 2),
          RubricItem("a white background", "is it white?", 1)]


class YesProbs:
    """``choose`` answering each criterion with a fixed P(yes), read from the criterion in the prompt."""

    name = "scripted:yes"

    def __init__(self, p_yes):
        self.p_yes = p_yes

    def choose(self, prompts, options):
        out = []
        for p in prompts:
            crit = next(c for c in self.p_yes if c in p[-1]["content"])
            out.append(ChoiceResult({options[0]: self.p_yes[crit], options[1]: 1 - self.p_yes[crit]}, "logits", mass=1.0))
        return out


def test_rubric_choose_hard_and_soft_hand_computed():
    backend = YesProbs({"a red circle": 0.9, "two squares": 0.4, "a white background": 0.6})
    (hard,) = RubricJudge(backend, mode="choose").judge(["a caption"], {"rubric": [RUBRIC]})
    assert hard.extra["satisfied"] == [1.0, 0.0, 1.0]
    assert hard.score == pytest.approx((3 + 1) / 6)
    (soft,) = RubricJudge(backend, mode="choose", decision="soft").judge(["a caption"], {"rubric": [RUBRIC]})
    assert soft.score == pytest.approx((3 * 0.9 + 2 * 0.4 + 1 * 0.6) / 6)
    (empty,) = RubricJudge(backend, mode="choose").judge([""], {"rubric": [RUBRIC]})
    assert empty.score == 0.0  # an empty caption satisfies nothing: a verifiable 0, not an outage


def test_rubric_likelihood_pmi_per_word_threshold_and_sigmoid_hand_computed():
    rubric = [RubricItem("red circle", "t", 2), RubricItem("small", "t", 1)]
    ll = {" red circle": -2.0, " small": -3.0}
    null_ll = {" red circle": -6.0, " small": -4.0}

    def table(ctx, cont):
        return (null_ll if "The image shows some things." in ctx else ll)[cont]

    backend = ScriptedLoglik(table)
    judge = RubricJudge(backend, mode="likelihood")  # threshold 1.4 on PMI per word
    (j,) = judge.judge(["A red circle."], {"rubric": [rubric]})
    assert j.extra["pmi_per_word"] == [2.0, 1.0]  # (-2 - -6) / 2 words, (-3 - -4) / 1 word
    assert j.extra["satisfied"] == [1.0, 0.0] and j.score == pytest.approx(2 / 3)
    n_pairs = len(backend.pairs)
    judge.judge(["A red circle."], {"rubric": [rubric]})
    assert len(backend.pairs) == n_pairs + 2  # the null baselines are cached: only the caption's pairs again
    (s,) = RubricJudge(ScriptedLoglik(table), mode="likelihood", decision="soft").judge(["A red circle."], {"rubric": [rubric]})

    def sig(x):
        return 1 / (1 + math.exp(-x))

    assert s.extra["values"] == pytest.approx([sig(2.0 - 1.4), sig(1.0 - 1.4)])
    assert s.score == pytest.approx((2 * sig(0.6) + 1 * sig(-0.4)) / 3)


# ---------------------------------------------------------------------- scalar judge
class Grades:
    name = "scripted:grades"

    def __init__(self, probs=None, reply="Grade: 8/10", choose_error=None):
        self.probs, self.reply, self.choose_error = probs, reply, choose_error

    def choose(self, prompts, options):
        if self.choose_error:
            raise BackendError(self.choose_error)
        return [ChoiceResult({o: self.probs.get(o, 0.0) for o in options}, "logits", mass=1.0) for _ in prompts]

    def generate(self, requests):
        return [Generation(self.reply) for _ in requests]


def test_scalar_judge_expected_grade_parsed_grade_and_fallback_hand_computed():
    (c,) = ScalarJudge(Grades({"9": 0.5, "5": 0.5})).judge(["cap"], {"reference": ["ref"]})
    assert c.extra["expected_grade"] == pytest.approx(7.0) and c.score == pytest.approx((7 - 1) / 8)
    (g,) = ScalarJudge(Grades(), ScalarConfig(mode="generate")).judge(["cap"], {})
    assert g.decision == 8 and g.score == pytest.approx(7 / 9)
    fb = ScalarJudge(Grades(reply="3", choose_error="digits are not single tokens"))
    (f,) = fb.judge(["cap"], {})
    assert f.score == pytest.approx(2 / 9) and f.method == "generate" and "choose unavailable" in f.reason
    assert fb.fallbacks == 1
    (none,) = ScalarJudge(Grades(reply="no idea"), ScalarConfig(mode="generate")).judge(["cap"], {})
    assert none.score is None and none.raw == "no idea"


# ---------------------------------------------------------------------- EvoLM's Generator reward
def test_evolm_generator_reward_is_weighted_score_gain_plus_format():
    from captionrl.train.moco import EvolmGeneratorReward

    scores = {"new good": 0.8, "new ok": 0.6, "old bad": 0.2, "old ok": 0.4}

    class Judge:
        def judge(self, captions, columns):
            assert all(r is not None for r in columns["rubric"])
            return [Judgment(score=scores.get(c)) for c in captions]

    class Roles:
        def __call__(self, role):
            assert role == "judge"
            return self

        def __enter__(self):
            return "judge-backend"

        def __exit__(self, *exc):
            return False

    cfg = types.SimpleNamespace(rubric=types.SimpleNamespace(min_items=2, max_items=8),
                                evolm=types.SimpleNamespace(judge_weight=2.0, format_weight=0.5),
                                judge=types.SimpleNamespace(factory=lambda backend: Judge()))
    valid = ('[{"criterion": "a red circle on the left", "test": "is there one?", "weight": 3},'
             ' {"criterion": "two blue squares", "test": "count them", "weight": 2}]')
    logged = {}
    reward = EvolmGeneratorReward(cfg, Roles())
    out = reward(completions=[valid, "not a rubric", valid],
                 current=[["new good", "new ok"], ["new good"], ["new good"]],
                 earlier=[["old bad", "old ok"], ["old bad"], ["unscored"]],
                 log_metric=lambda k, v: logged.__setitem__(k, v))
    # gain = mean(0.8, 0.6) - mean(0.2, 0.4) = 0.4 -> 2.0 * 0.4 + 0.5; invalid format -> 0; unscored -> None
    assert out[0] == pytest.approx(2.0 * 0.4 + 0.5)
    assert out[1] == 0.0
    assert out[2] is None
    assert logged["evolm/format_valid"] == pytest.approx(2 / 3)
    assert logged["evolm/score_gain"] == pytest.approx(0.4)
