"""verl and OpenRLHF adapters, called exactly the way those engines call reward plug-ins."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from captionrl.adapters import engine
from captionrl.domains.describe import describe_series
from captionrl.errors import ConfigError, DataError
from captionrl.types import Judgment

RISING = np.linspace(10, 40, 16).round(2)
FALLING = np.linspace(50, 5, 16).round(2)
WAVE = (np.sin(np.arange(16) / 2) * 8 + 20).round(2)
LABEL = engine.encode_label([WAVE, RISING, FALLING])  # the wave is the true series


def _use(monkeypatch, reward, spec=None):
    """Make ``reward`` (a ``Reward``) the adapters' process-wide reward, its ``spec`` their setup's."""
    from captionrl.rewards.spec import RewardSetup

    setup = RewardSetup(reward=spec if spec is not None else reward.shaping)
    monkeypatch.setattr(engine, "setup", lambda: setup)
    monkeypatch.setattr(engine, "reward", lambda: reward)
    return reward


def _fixed(judgment, spec=None):
    """A reward whose judge gives every caption ``judgment`` (parse/error paths only)."""
    from captionrl.rewards.reward import Reward
    from captionrl.rewards.spec import RewardSpec

    class _Judge:
        name = "fixed"

        def __init__(self):
            self.calls: list[int] = []

        def judge(self, captions, columns):
            self.calls.append(len(captions))
            return [judgment for _ in captions]

    spec = spec or RewardSpec(k=3)
    return Reward(_Judge(), spec, family="identification"), spec


@pytest.fixture
def embedded_reward(embedded_backend, monkeypatch):
    """The adapters' process-wide reward on the session's embedded model (likelihood mode, K=3, soft)."""
    from captionrl.rewards.reward import build_reward
    from captionrl.rewards.spec import RewardSpec

    spec = RewardSpec(mode="likelihood", k=3, signal="soft")
    return _use(monkeypatch, build_reward(spec, embedded_backend), spec)


@pytest.mark.slow
def test_verl_compute_score_sync_and_async(embedded_reward):
    from captionrl.adapters.verl import compute_score, compute_score_async

    right = compute_score("lineup", describe_series(WAVE), LABEL, extra_info={"index": 0})
    wrong = compute_score(data_source="lineup", solution_str=describe_series(FALLING), ground_truth=LABEL)
    assert right["score"] > 0.5 > wrong["score"]
    assert {"score", "hard", "soft", "caption_chars", "unscored", "copied_values"} <= set(right)
    assert set(right) == set(wrong)  # verl indexes every sample by the first one's keys
    again = asyncio.run(compute_score_async("lineup", describe_series(WAVE), LABEL, None))
    assert again["score"] == pytest.approx(right["score"], abs=1e-6)


@pytest.mark.slow
def test_openrlhf_reward_func_batch(embedded_reward):
    from captionrl.adapters.openrlhf import reward_func

    prompts = ["Describe: ", "Describe: "]
    queries = [prompts[0] + describe_series(WAVE), prompts[1] + describe_series(FALLING)]
    out = reward_func(queries, prompts, [LABEL, LABEL])
    assert out["rewards"].shape == (2,) and out["scores"].shape == (2,)
    assert float(out["rewards"][0]) > float(out["rewards"][1])  # the falling caption does not describe the wave
    assert {"hard", "soft", "unscored", "caption_chars", "copied_values", "transcription_penalty"} <= set(out["extra_logs"])
    assert all(bool(v.isfinite().all()) for v in out["extra_logs"].values())


def test_adapters_apply_the_training_guard(monkeypatch):
    """A number dump that the judge loves is penalised exactly as in training (run of 3+ values: -1)."""
    from captionrl.adapters.verl import compute_score

    _use(monkeypatch, *_fixed(Judgment(score=1.0, extra={"hard": 1.0, "soft": 1.0})))
    dump = ", ".join(f"{v:.2f}" for v in WAVE[:6])
    got = compute_score("lineup", dump, LABEL)
    assert got["copied_values"] == 6 and got["score"] == pytest.approx(1.0 - 0.1 * 2 - 1.0)
    assert compute_score("lineup", describe_series(WAVE), LABEL)["score"] == pytest.approx(1.0)


def test_failures_raise_or_take_the_chosen_value_never_nan_or_zero(monkeypatch):
    """The adapters' policy is the service's (``serve.failure``): an outage is re-judged until the deadline,
    then raises; an unscorable caption takes ``CAPTIONRL_UNSCORED_REWARD`` or raises; never NaN, and every
    logged field of an unscored caption is a finite number too (verl once got ``hard: None``)."""
    from captionrl.adapters.verl import compute_score
    from captionrl.serve.failure import UnscorableCaption, VerifierOutage

    down = Judgment(score=None, error="verifier failed on 3/3 rotations: connection error from http://x (refused)")
    reward = _use(monkeypatch, *_fixed(down))
    monkeypatch.setenv(engine.DEADLINE_ENV, "2.5")
    with pytest.raises(VerifierOutage, match="refusing to invent a reward"):
        compute_score("lineup", "It rises.", LABEL)
    assert len(reward.base.calls) >= 2  # re-judged (1 s apart) before giving up
    _use(monkeypatch, *_fixed(Judgment(score=None, error="no letter in the reply")))
    with pytest.raises(UnscorableCaption, match=engine.UNSCORED_ENV):
        compute_score("lineup", "It rises.", LABEL)
    monkeypatch.setenv(engine.UNSCORED_ENV, "-0.5")
    got = compute_score("lineup", "It rises.", LABEL)
    assert got["score"] == -0.5 and got["unscored"] == 1.0
    numbers = {k: v for k, v in got.items() if k != "error"}
    assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in numbers.values()), numbers
    assert got["hard"] == -0.5 and got["soft"] == -0.5  # a field the judge did not give repeats the reward
    monkeypatch.setenv(engine.UNSCORED_ENV, "nan")
    with pytest.raises(ConfigError, match=engine.UNSCORED_ENV):
        compute_score("lineup", "It rises.", LABEL)


def test_every_logged_value_is_finite_when_a_caption_makes_no_checkable_claim(monkeypatch):
    """With the factuality term on, a caption without a checkable claim has no red share: the adapters once
    sent it as NaN, which OpenRLHF's ``torch.tensor`` and verl take as a number."""
    from captionrl.adapters.openrlhf import reward_func
    from captionrl.adapters.verl import compute_score
    from captionrl.rewards.spec import RewardSpec

    spec = RewardSpec(k=3, factuality_penalty=1.0, factuality_bonus=0.5)
    _use(monkeypatch, *_fixed(Judgment(score=0.7, extra={"hard": 1.0, "soft": 0.7}), spec))
    got = compute_score("lineup", "What a lovely description.", LABEL)
    assert {"red_share", "green_share", "factuality_penalty"} <= set(got)
    assert all(math.isfinite(v) for k, v in got.items() if k != "error")
    logs = reward_func(["p" + "What a lovely description."], ["p"], [LABEL])["extra_logs"]
    assert all(bool(v.isfinite().all()) for v in logs.values())


@pytest.mark.parametrize("label, where", [
    ('{"series": [1, 2]}', "labels[0].candidates"),
    ('{"candidates": "x"}', "labels[0].candidates"),
    ("not json {", "labels[0]"),
    ('{"candidates": [[1, 2], [3, "a"]]}', "labels[0].candidates[1]"),
])
def test_a_malformed_label_is_named(monkeypatch, label, where):
    """A bad label raises a ``DataError`` naming the label and the column (it once raised a raw
    ``JSONDecodeError``, and ``{"candidates": "x"}`` was reported as a set of 1 series)."""
    from captionrl.adapters.verl import compute_score

    _use(monkeypatch, *_fixed(Judgment(score=1.0, extra={"hard": 1.0, "soft": 1.0})))
    with pytest.raises(DataError) as err:
        compute_score("lineup", "It rises.", label)
    assert err.value.field == where


def test_the_numbers_masked_pass_works_through_the_adapters(monkeypatch):
    """The masked pass is part of the one reward, so the adapters run it too (they once refused it): the
    base becomes (1 - w) * score + w * score(caption with its numbers masked)."""
    from captionrl.adapters.verl import compute_score
    from captionrl.rewards.reward import Reward
    from captionrl.rewards.spec import RewardSpec

    class _NumbersOnly:  # identifies a caption only through its numbers
        name = "numbers-only"

        def judge(self, captions, columns):
            return [Judgment(score=0.0 if "#" in c else 1.0, extra={"hard": 1.0, "soft": 1.0}) for c in captions]

    spec = RewardSpec(k=3, masked_weight=0.5, transcription_penalty=0.0, run_penalty=0.0)
    _use(monkeypatch, Reward(_NumbersOnly(), spec, family="identification"), spec)
    got = compute_score("lineup", "It starts at 12.5 and ends at 40.", LABEL)
    assert got["score"] == pytest.approx(0.5) and got["masked"] == 0.0 and got["base"] == 1.0


@pytest.mark.slow
def test_a_number_dump_gets_the_same_shaped_score_through_the_adapters_as_through_the_trl_reward(embedded_reward):
    """One reward everywhere: the verl / OpenRLHF plug-ins and TRL's reward function (the face ``train lineup``
    builds over the same ``Reward``) give a dump of the numbers the same shaped score."""
    from captionrl.adapters.openrlhf import reward_func
    from captionrl.adapters.verl import compute_score
    from captionrl.domains.timeseries import render_numbers
    from captionrl.rewards import RewardFunction

    text = render_numbers(WAVE)[0]
    label = engine.encode_label([WAVE, RISING, FALLING], series_text=text)
    trl = RewardFunction(embedded_reward)
    for caption in ("Values: " + text, describe_series(WAVE)):
        via_trl = trl(prompts=["p"], completions=[[{"role": "assistant", "content": caption}]],
                      candidates=[[WAVE.tolist(), RISING.tolist(), FALLING.tolist()]], series=[WAVE.tolist()],
                      series_text=[text])[0]
        via_verl = compute_score("lineup", caption, label)
        via_openrlhf = float(reward_func(["p" + caption], ["p"], [label])["rewards"][0])
        assert via_verl["score"] == pytest.approx(via_trl, abs=1e-5)
        assert via_openrlhf == pytest.approx(via_trl, abs=1e-5)
