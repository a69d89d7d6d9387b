"""``reward.truthful_base``: a caption that states a key fact its series contradicts keeps no base score.

Why: under a lineup whose candidates share the window's start, end and trend, a named interior extreme tells
the true window apart whether its value is right or not (in the main job's RL samples the training verifier
put the same probability on the true window for a wrong named extreme as for a right one), so the
identification term alone pays a false claim as much as a true one. With the base withheld, a wrong value
earns less than leaving it out, and a right one keeps everything."""

from __future__ import annotations

import numpy as np
import pytest

from captionrl.errors import ConfigError
from captionrl.rewards.shaping import Shaper, ShapingConfig, terms

WINDOW = np.array([1.0, 2.0, 5.0, 3.0, 2.0, 2.5, 3.0, 4.0])
PLAIN = "Overall, the series rises. It starts at 1.0 and ends at 4.0."
RIGHT_EXTREME = PLAIN + " Its highest value is 5.0."
WRONG_EXTREME = PLAIN + " Its highest value is 9.0."
WRONG_DIRECTION = "Overall, the series falls. It starts at 1.0 and ends at 4.0."
# the base a lineup gives each: naming an extreme, right or wrong, picks the window out alike
BASE = {PLAIN: 0.6, RIGHT_EXTREME: 1.4, WRONG_EXTREME: 1.4, WRONG_DIRECTION: 0.6}


def rewards(truthful: bool) -> dict[str, float]:
    shaper = Shaper(ShapingConfig(coverage_bonus=1.0, wrong_fact_penalty=0.25, direction_rule="label",
                                  truthful_base=truthful))
    caps = list(BASE)
    shaped = shaper.shape(caps, [BASE[c] for c in caps], [WINDOW] * len(caps))
    return {c: s.reward for c, s in zip(caps, shaped, strict=True)}


def test_without_it_a_wrong_extreme_pays_more_than_saying_nothing_of_it():
    r = rewards(truthful=False)
    assert r[WRONG_EXTREME] > r[PLAIN]


def test_with_it_a_wrong_value_or_direction_earns_less_than_leaving_it_out():
    r = rewards(truthful=True)
    assert r[WRONG_EXTREME] < r[PLAIN] < r[RIGHT_EXTREME]
    assert r[WRONG_DIRECTION] < r[PLAIN]
    assert r[RIGHT_EXTREME] == pytest.approx(rewards(truthful=False)[RIGHT_EXTREME])


def test_the_withheld_base_is_logged_and_a_failed_judgment_stays_unscored():
    shaper = Shaper(ShapingConfig(coverage_bonus=1.0, truthful_base=True))
    shaped = shaper.shape([WRONG_EXTREME, RIGHT_EXTREME, WRONG_EXTREME], [1.4, 1.4, None], [WINDOW] * 3)
    assert [terms(WRONG_EXTREME, s)["base_withheld"] for s in shaped[:2]] == [1.0, 0.0]
    assert terms(WRONG_EXTREME, shaped[0])["base"] == 1.4  # the judge's score itself is kept in the record
    assert shaped[2].reward is None


def test_off_by_default_and_a_wrong_type_is_named():
    assert ShapingConfig().truthful_base is False
    from captionrl.config import load_config
    from captionrl.train.lineup_config import LineupConfig

    with pytest.raises(ConfigError, match=r"reward\.truthful_base"):
        load_config(LineupConfig, None, ["reward.truthful_base=maybe"])
