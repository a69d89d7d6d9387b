"""verl and OpenRLHF adapters, called exactly the way those engines call reward plug-ins."""

from __future__ import annotations

import asyncio

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


@pytest.fixture
def embedded_judge(embedded_backend, monkeypatch):
    """The adapters' process-wide judge on the session's embedded model (likelihood mode, K=3)."""
    from captionrl.judges.identification import IdentificationJudge, IdentifyConfig

    judge = IdentificationJudge(embedded_backend, IdentifyConfig(mode="likelihood", k=3, signal="soft"))
    monkeypatch.setattr(engine, "identification_judge", lambda: judge)
    return judge


@pytest.mark.slow
def test_verl_compute_score_sync_and_async(embedded_judge):
    from captionrl.adapters.verl import compute_score, compute_score_async

    right = compute_score("lineup", describe_series(WAVE), LABEL, extra_info={"index": 0})
    wrong = compute_score(data_source="lineup", solution_str=describe_series(FALLING), ground_truth=LABEL)
    assert right["score"] > 0.5 > wrong["score"]
    assert {"score", "hard", "soft", "caption_chars"} <= set(right)
    again = asyncio.run(compute_score_async("lineup", describe_series(WAVE), LABEL, None))
    assert again["score"] == pytest.approx(right["score"], abs=1e-6)


@pytest.mark.slow
def test_openrlhf_reward_func_batch(embedded_judge):
    from captionrl.adapters.openrlhf import reward_func

    prompts = ["Describe: ", "Describe: "]
    queries = [prompts[0] + describe_series(WAVE), prompts[1] + describe_series(FALLING)]
    out = reward_func(queries, prompts, [LABEL, LABEL])
    assert out["rewards"].shape == (2,) and out["scores"].shape == (2,)
    assert float(out["rewards"][0]) > float(out["rewards"][1])  # the falling caption does not describe the wave
    assert set(out["extra_logs"]) == {"identification_hard", "caption_chars", "unscored", "copied_values",
                                      "transcription_share", "transcription_penalty", "red_share"}


def test_adapters_apply_the_training_guard(monkeypatch):
    """A number dump that the judge loves is penalised exactly as in training (run of 3+ values: -1)."""
    from captionrl.adapters.verl import compute_score

    class _Loves:
        def judge(self, captions, columns):
            return [Judgment(score=1.0, extra={"hard": 1.0, "soft": 1.0}) for _ in captions]

    monkeypatch.setattr(engine, "identification_judge", lambda: _Loves())
    dump = ", ".join(f"{v:.2f}" for v in WAVE[:6])
    got = compute_score("lineup", dump, LABEL)
    assert got["copied_values"] == 6 and got["score"] == pytest.approx(1.0 - 0.1 * 2 - 1.0)
    assert compute_score("lineup", describe_series(WAVE), LABEL)["score"] == pytest.approx(1.0)


def test_failures_raise_or_take_the_chosen_value_never_nan_or_zero(monkeypatch):
    """The adapters' policy is the service's (``serve.failure``): an outage is re-judged until the deadline,
    then raises; an unscorable caption takes ``CAPTIONRL_UNSCORED_REWARD`` or raises; never NaN."""
    from captionrl.adapters.verl import compute_score
    from captionrl.serve.failure import UnscorableCaption, VerifierOutage

    down = Judgment(score=None, error="verifier failed on 3/3 rotations: connection error from http://x (refused)")
    calls: list[int] = []

    class _Down:
        def judge(self, captions, columns):
            calls.append(len(captions))
            return [down for _ in captions]

    monkeypatch.setattr(engine, "identification_judge", lambda: _Down())
    monkeypatch.setenv(engine.DEADLINE_ENV, "2.5")
    with pytest.raises(VerifierOutage, match="refusing to invent a reward"):
        compute_score("lineup", "It rises.", LABEL)
    assert len(calls) >= 2  # re-judged (1 s apart) before giving up
    unscorable = Judgment(score=None, error="no letter in the reply")
    with pytest.raises(UnscorableCaption, match=engine.UNSCORED_ENV):
        engine.score_or_fail(unscorable)
    monkeypatch.setenv(engine.UNSCORED_ENV, "-0.5")
    assert engine.score_or_fail(unscorable) == -0.5
    monkeypatch.setattr(engine, "identification_judge", lambda: type("J", (), {"judge": lambda self, c, col: [unscorable]})())
    got = compute_score("lineup", "It rises.", LABEL)
    assert got["score"] == -0.5 and got["unscored"] == 1.0
    monkeypatch.setenv(engine.UNSCORED_ENV, "nan")
    with pytest.raises(ConfigError, match=engine.UNSCORED_ENV):
        engine.score_or_fail(unscorable)


def test_bad_label_is_named():
    with pytest.raises(DataError, match="candidates"):
        engine.decode_label('{"series": [1, 2]}')


@pytest.mark.slow
def test_a_number_dump_gets_the_same_shaped_score_through_the_adapters_as_through_the_trl_reward(embedded_judge):
    """One guard everywhere: the verl / OpenRLHF plug-ins and TRL's reward callable (``ShapedReward`` built by
    ``train lineup`` from its default ``reward.*`` keys) give a dump of the numbers the same shaped score."""
    from captionrl.adapters.openrlhf import reward_func
    from captionrl.adapters.verl import compute_score
    from captionrl.domains.timeseries import render_numbers
    from captionrl.rewards import JudgeReward
    from captionrl.rewards.shaping import ShapedReward
    from captionrl.train.lineup import LineupRewardConfig

    engine.shaped_reward.cache_clear()
    text = render_numbers(WAVE)[0]
    label = engine.encode_label([WAVE, RISING, FALLING], series_text=text)
    trl = ShapedReward(JudgeReward(embedded_judge), LineupRewardConfig(k=3, signal="soft"))
    for caption in ("Values: " + text, describe_series(WAVE)):
        via_trl = trl(prompts=["p"], completions=[[{"role": "assistant", "content": caption}]],
                      candidates=[[WAVE.tolist(), RISING.tolist(), FALLING.tolist()]], series=[WAVE.tolist()],
                      series_text=[text])[0]
        via_verl = compute_score("lineup", caption, label)
        via_openrlhf = float(reward_func(["p" + caption], ["p"], [label])["rewards"][0])
        assert via_verl["score"] == pytest.approx(via_trl, abs=1e-5)
        assert via_openrlhf == pytest.approx(via_trl, abs=1e-5)
        if caption.startswith("Values"):  # the dump: every value copied, in a run: the guard took it down
            assert via_verl["copied_values"] == 16 and via_verl["transcription_penalty"] == pytest.approx(1.0 + 0.1 * 12)
            dump_score = via_trl
        else:
            assert via_trl > dump_score
