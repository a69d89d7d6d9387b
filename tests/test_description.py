"""Checks that read description, the verdict, the description reward terms and the lazy-optimum probes:
each must fail a bare number, the instruction echoed and one template sentence for every item,
the outputs our trained captioners found when every check read only numbers."""

from __future__ import annotations

import numpy as np
import pytest

from captionrl.domains.describe import describe_series
from captionrl.eval.description import description_checks, same_sentence_flags, verdict
from captionrl.probes import series_probes
from captionrl.rewards import RewardFunction
from captionrl.rewards.reward import Reward
from captionrl.rewards.spec import RewardSpec
from captionrl.types import Judgment

INSTRUCTION = ("In one or two short sentences, say the value the series starts at, the value it ends at, and "
               "whether it rises or falls overall.")


def _windows(n: int = 12, length: int = 16) -> dict[str, np.ndarray]:
    """Real windows of the embedded corpus, rising, falling and flat ones among them."""
    from captionrl.domains.corpora import load_embedded_corpus
    from captionrl.domains.timeseries import window

    out: dict[str, np.ndarray] = {}
    for s in load_embedded_corpus(["co2", "nile", "sunspots"]):
        for w in window(s, length, stride=max(length, len(s) // 5)):
            out[w.id] = np.asarray(w.values, dtype=float)
            if len(out) == n:
                return out
    return out


WINDOWS = _windows()


def _degenerate_systems(series: dict[str, np.ndarray]) -> dict[str, dict[str, str]]:
    """The three degenerate outputs of the checklist, and the template our seed-1 captioner wrote."""
    return {
        "bare number": {i: f"{v[0]:.2f}" for i, v in series.items()},
        "instruction echoed": {i: series_probes(v, INSTRUCTION)["echo_values"] for i, v in series.items()},
        "one template sentence": {i: f"The series starts at {v[0]:.2f}, which is the first value in the series."
                                  for i, v in series.items()},
    }


def test_description_checks_read_direction_extrema_and_key_facts():
    honest = {i: describe_series(v) for i, v in WINDOWS.items()}
    got = description_checks(honest, WINDOWS, instruction=INSTRUCTION)
    assert all(got["direction_stated"][i] == 1.0 and got["direction_right"][i] == 1.0 for i in WINDOWS)
    assert all(got["extrema_right"][i] == 2.0 and got["key_facts"][i] >= 5 for i in WINDOWS)
    assert not any(got["degenerate"].values())
    assert not any(got["same_sentence"].values())  # the describer's sentences differ by more than numbers


@pytest.mark.parametrize("name", ["bare number", "instruction echoed", "one template sentence"])
def test_a_degenerate_output_fails_the_checks_and_the_verdict(name):
    """A degenerate captioner is never 'better' than an honest initial model: its description checks drop
    and the verdict says worse (degenerated, or worse on direction and key facts), naming why."""
    initial = {i: describe_series(v) for i, v in WINDOWS.items()}
    degenerate = _degenerate_systems(WINDOWS)[name]
    init = {**description_checks(initial, WINDOWS, instruction=INSTRUCTION), "red": dict.fromkeys(WINDOWS, 0.0)}
    deg = {**description_checks(degenerate, WINDOWS, instruction=INSTRUCTION), "red": dict.fromkeys(WINDOWS, 0.0)}
    assert np.mean(list(deg["direction_right"].values())) == 0.0
    assert np.mean(list(deg["key_facts"].values())) <= 1.0
    if name != "one template sentence":
        assert np.mean(list(deg["degenerate"].values())) == 1.0
    else:
        assert np.mean(list(deg["same_sentence"].values())) == 1.0
    v = verdict(deg, init)
    assert v.outcome == "worse" and v.degenerated, v.line()
    assert "degenerated" in v.line()
    assert verdict(init, deg).outcome == "better"  # and the honest captioner beats it


def test_the_verdict_weighs_intervals_and_says_not_better_when_nothing_moved():
    ids = [str(i) for i in range(20)]
    base = {"direction_skill": dict.fromkeys(ids, 0.0), "other_facts": dict.fromkeys(ids, 2.0),
            "degenerate": dict.fromkeys(ids, 0.0), "same_sentence": dict.fromkeys(ids, 0.0),
            "red": dict.fromkeys(ids, 0.2)}
    assert verdict(base, base).outcome == "not better"
    better = {**base, "direction_skill": {i: float(k % 2) for k, i in enumerate(ids)}}  # half of them right now
    v = verdict(better, base)
    assert v.outcome == "better" and "direction_skill +0.500" in v.line()
    redder = {**better, "red": dict.fromkeys(ids, 0.6)}  # right more often, but contradicting the series more
    v = verdict(redder, base)
    assert v.outcome == "worse" and "red +0.400" in v.line()


def test_a_run_degenerate_in_two_ways_at_once_is_degenerated():
    """Half the captions too short, the other half one template (neither share alone at the bar): degenerated.
    Two fifths of each on different captions is not (the bar is half of the captions, each counted once)."""
    ids = [str(i) for i in range(20)]
    base = {"direction_right": dict.fromkeys(ids, 0.0), "key_facts": dict.fromkeys(ids, 1.0),
            "degenerate": dict.fromkeys(ids, 0.0), "same_sentence": dict.fromkeys(ids, 0.0),
            "red": dict.fromkeys(ids, 0.2)}
    two_ways = {**base, "degenerate": {i: float(k < 5) for k, i in enumerate(ids)},
                "same_sentence": {i: float(5 <= k < 10) for k, i in enumerate(ids)}}
    v = verdict(two_ways, base)
    assert v.outcome == "worse" and v.degenerated and "50% of the captions" in v.line(), v.line()
    overlapping = {**two_ways, "same_sentence": {i: float(k < 9) for k, i in enumerate(ids)}}  # mostly the same ones
    assert not verdict(overlapping, base).degenerated


def test_same_sentence_flags_a_template_said_whatever_the_window():
    caps = {"a": "It starts at 3.5 and rises.", "b": "It starts at 9.25 and rises.", "c": "It falls steadily.",
            "d": "It starts at 1 and rises."}
    assert same_sentence_flags(caps) == {"a": 1.0, "b": 1.0, "c": 0.0, "d": 1.0}
    # the same wording right for every window it is used on is terse, not degenerate
    assert same_sentence_flags(caps, {"a": False, "b": False, "c": True, "d": False}) == dict.fromkeys("abcd", 0.0)
    assert same_sentence_flags(caps, {"a": False, "b": True, "c": False, "d": False}) == {**dict.fromkeys("abd", 1.0),
                                                                                        "c": 0.0}


def test_a_fixed_answer_form_that_tracks_the_window_is_not_a_template():
    """Our warm-started captioner (2026-12-03) answered in one form, "Overall, the series rises. It starts at
    # and ends at #.", right about the direction of most windows it said it of: it reads the window. The
    same form with one direction said of every window does not, and is flagged."""
    from captionrl.domains.describe import overall_direction, trend_word

    ids = list(WINDOWS)
    word = {i: trend_word(WINDOWS[i]) for i in ids}
    flip = next(i for i in ids if overall_direction(WINDOWS[i]) != "up")
    word[flip] = "rises"  # one window wrong, as a captioner that reads the window still is at times
    tracking = {i: f"Overall, the series {word[i]}. It starts at {WINDOWS[i][0]:.2f} and ends at {WINDOWS[i][-1]:.2f}."
                for i in ids}
    assert not any(description_checks(tracking, WINDOWS)["same_sentence"].values())
    constant = {i: f"Overall, the series rises. It starts at {WINDOWS[i][0]:.2f} and ends at {WINDOWS[i][-1]:.2f}."
                for i in ids}
    assert np.mean(list(description_checks(constant, WINDOWS)["same_sentence"].values())) == 1.0


def test_a_form_that_tracks_the_direction_but_misstates_a_value_is_not_a_template():
    """A form that reads the direction and adds a value that is wrong ("Its highest value is #.") is
    judged a template by its direction, as the bar it is held to is: its wrong values are wrong facts. The same
    form with one direction said of every window, every value right, is flagged."""
    from captionrl.domains.describe import trend_word

    ids = list(WINDOWS)
    tracking = {i: f"Overall, the series {trend_word(WINDOWS[i])}. It starts at {WINDOWS[i][0]:.2f} and ends at "
                   f"{WINDOWS[i][-1]:.2f}. Its highest value is {WINDOWS[i].min() - 1.0:.2f}." for i in ids}
    got = description_checks(tracking, WINDOWS)
    assert all(got["wrong_facts"].values())  # every wrong maximum is counted where it belongs
    assert not any(got["same_sentence"].values())
    constant = {i: f"Overall, the series rises. It starts at {WINDOWS[i][0]:.2f} and ends at {WINDOWS[i][-1]:.2f}. "
                   f"Its highest value is {WINDOWS[i].max():.2f}." for i in ids}
    assert np.mean(list(description_checks(constant, WINDOWS)["same_sentence"].values())) == 1.0


def test_the_describer_is_terse_not_a_template_and_a_constant_direction_is():
    """The describer's wording is fixed but right for every window: not degenerate. The same wording with one
    direction said of every window (our v2 captioner: '..., and is rising overall.') is."""
    honest = {i: describe_series(v) for i, v in WINDOWS.items()}
    assert not any(description_checks(honest, WINDOWS)["same_sentence"].values())
    rising = {i: f"The value starts at {v[0]:.2f}, ends at {v[-1]:.2f}, and is rising overall." for i, v in WINDOWS.items()}
    got = description_checks(rising, WINDOWS)
    assert 0 < np.mean(list(got["direction_right"].values())) < 1  # some windows fall
    assert np.mean(list(got["same_sentence"].values())) == 1.0


def test_flat_said_of_every_window_is_a_template_with_no_skill():
    """A warm-started seed (2026-12-04) said "Overall, the series stays roughly flat. It starts at # and ends
    at #." of all 40 held-out windows. The claim checker accepts "flat" within a tolerance, so it was right
    about more windows than are labelled flat, and a guess counted from the labels gave it a skill of +0.10
    and no template flag. Measured by the checker itself, every direction said of every window is a template
    with no skill, and the honest describer keeps its skill."""
    for word in ("stays roughly flat", "rises", "falls"):
        constant = {i: f"Overall, the series {word}. It starts at {v[0]:.2f} and ends at {v[-1]:.2f}."
                    for i, v in WINDOWS.items()}
        got = description_checks(constant, WINDOWS)
        assert 0 < np.mean(list(got["direction_right"].values())) < 1, word  # a real mix of windows
        assert abs(np.mean(list(got["direction_skill"].values()))) < 1e-9, word
        assert np.mean(list(got["same_sentence"].values())) == 1.0, word
    honest = {i: describe_series(v) for i, v in WINDOWS.items()}
    assert np.mean(list(description_checks(honest, WINDOWS)["direction_skill"].values())) > 0.3


def test_one_direction_said_of_every_window_is_no_skill_whatever_the_wording():
    """A trained seed (2026-12-03, an experiment) said "increases" of every window in varied sentences:
    direction_right rose by 0.55 on held-out windows that mostly rise, and the verdict called it better.
    direction_skill is 0 for it, positive for the honest describer, and the verdict is not fooled."""
    ids = list(WINDOWS)
    wordings = ["Overall, the series is increasing.", "The value keeps increasing over time.",
                "The series increases over the window.", "Looking at the values, the series rises."]
    rising = {i: wordings[k % 4] for k, i in enumerate(ids)}
    silent = {i: "This is a series of monthly values." for i in ids}
    honest = {i: describe_series(v) for i, v in WINDOWS.items()}
    got = {name: description_checks(caps, WINDOWS) for name, caps in
           (("rising", rising), ("silent", silent), ("honest", honest))}
    mean = {name: {k: float(np.mean(list(v.values()))) for k, v in checks.items()} for name, checks in got.items()}
    assert 0 < mean["rising"]["direction_right"] < 1 and mean["rising"]["direction_stated"] == 1.0
    assert abs(mean["rising"]["direction_skill"]) < 1e-9 and mean["silent"]["direction_skill"] == 0.0
    assert mean["honest"]["direction_skill"] > 0.3
    assert not any(got["rising"]["same_sentence"].values())  # varied wording: no template to flag
    for checks in got.values():
        checks["red"] = dict.fromkeys(ids, 0.0)
    v = verdict(got["rising"], got["silent"])
    assert v.outcome != "better", v.line()
    assert verdict(got["honest"], got["silent"]).outcome == "better"


def _fixed_reward(spec: RewardSpec, score: float = 0.9) -> RewardFunction:
    class _Judge:
        name = "fixed"

        def judge(self, captions, columns):
            return [Judgment(score=score, extra={"hard": 1.0, "soft": score}) for _ in captions]

    return RewardFunction(Reward(_Judge(), spec, series_rows=True, instruction=INSTRUCTION))


DESCRIBING = RewardSpec(transcription_penalty=0.0, run_penalty=0.0, coverage_bonus=1.0, coverage_target=4,
                        wrong_fact_penalty=0.5, degenerate_penalty=1.0)


def test_the_description_terms_pay_describing_and_price_every_lazy_optimum():
    """Under a verifier that scores every caption alike (the worst case: it reads nothing), only the
    description terms separate the captions: the honest one must beat every probe by a margin."""
    reward = _fixed_reward(DESCRIBING)
    for v in WINDOWS.values():
        probes = {"honest": describe_series(v), **series_probes(v, INSTRUCTION), "bare": f"{v[0]:.2f}"}
        got = dict(zip(probes, reward(completions=list(probes.values()), series=[v.tolist()] * len(probes)), strict=True))
        assert got["honest"] == pytest.approx(0.9 + 1.0)  # >= 4 correct key facts: the whole bonus
        for probe, value in got.items():
            if probe != "honest":
                assert value <= got["honest"] - 0.5, (probe, value, probes[probe])
        assert got["bare"] == pytest.approx(0.9 - 1.0) and got["echo_values"] < 0.9 - 1.0 + 1e-9


def test_the_description_terms_are_off_by_default_and_logged():
    """The paper's reward (the defaults) is unchanged; the key facts are still measured and logged."""
    v = next(iter(WINDOWS.values()))
    logged: dict[str, float] = {}
    plain = _fixed_reward(RewardSpec(transcription_penalty=0.0, run_penalty=0.0))
    assert plain(completions=[f"{v[0]:.2f}"], series=[v.tolist()], log_metric=logged.__setitem__) == [0.9]
    assert logged["shaping/degenerate"] == 1.0 and logged["shaping/key_facts"] == 0.0


def test_balanced_training_windows_by_direction():
    """data.balance=direction: as many rising, falling and flat training windows as the split allows, so one
    direction said of every window is right a third of the time (the corpus rises in ~57% of its windows)."""
    from collections import Counter

    import numpy as np

    from captionrl.domains.lineup_data import balanced_choice

    labels = ["rises"] * 10 + ["falls"] * 5 + ["stays flat"] * 2
    picked = balanced_choice(labels, 9, np.random.default_rng(0))
    got = Counter(labels[j] for j in picked)
    assert got["stays flat"] == 2 and {got["rises"], got["falls"]} == {3, 4}  # flat has only 2: the rest share
    assert picked == balanced_choice(labels, 9, np.random.default_rng(0)) == sorted(picked)
    assert Counter(labels[j] for j in balanced_choice(labels, None, np.random.default_rng(1))) == \
        {"rises": 2, "falls": 2, "stays flat": 2}
