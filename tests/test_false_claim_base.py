"""``reward.false_claim_base``: the base score a caption keeps when it states a key fact its series contradicts.

Why: under a lineup whose candidates share the window's start, end and trend, a named interior extreme tells
the true window apart whenever its value was copied from the series, right or wrong (in the main job's RL
samples the training verifier put the same probability on the true window for a wrong named extreme as for a
right one), so the identification term alone pays a false claim about as much as a true one. Capped at
chance (``lam / k``) or withheld, a wrong value earns less than leaving it out, and a right one keeps
everything."""

from __future__ import annotations

import numpy as np
import pytest

from captionrl.config import load_config
from captionrl.errors import ConfigError
from captionrl.rewards.shaping import Shaper, ShapingConfig, terms
from captionrl.rewards.spec import RewardSpec
from captionrl.train.lineup_config import LineupConfig

WINDOW = np.array([1.0, 2.0, 5.0, 3.0, 2.0, 2.5, 3.0, 4.0])
PLAIN = "Overall, the series rises. It starts at 1.0 and ends at 4.0."
RIGHT_EXTREME = PLAIN + " Its highest value is 5.0."
WRONG_EXTREME = PLAIN + " Its highest value is 3.0."  # a series value, but not its highest
WRONG_DIRECTION = "Overall, the series falls. It starts at 1.0 and ends at 4.0."
# the base a lineup (lam 2, K 4) gives each: naming a series value, extreme or not, picks the window out alike
BASE = {PLAIN: 0.6, RIGHT_EXTREME: 1.4, WRONG_EXTREME: 1.4, WRONG_DIRECTION: 0.6}


def rewards(false_claim_base: str) -> dict[str, float]:
    shaper = Shaper(RewardSpec(lam=2.0, k=4, coverage_bonus=1.0, wrong_fact_penalty=0.25, direction_rule="label",
                               false_claim_base=false_claim_base))
    caps = list(BASE)
    shaped = shaper.shape(caps, [BASE[c] for c in caps], [WINDOW] * len(caps))
    return {c: s.reward for c, s in zip(caps, shaped, strict=True)}


def test_kept_in_full_a_wrong_extreme_pays_more_than_saying_nothing_of_it():
    r = rewards("full")
    assert r[WRONG_EXTREME] > r[PLAIN]


@pytest.mark.parametrize("rule", ["chance", "none"])
def test_capped_or_withheld_a_wrong_value_earns_less_than_leaving_it_out(rule):
    r, full = rewards(rule), rewards("full")
    assert r[WRONG_EXTREME] < r[PLAIN] < r[RIGHT_EXTREME]
    assert r[RIGHT_EXTREME] == pytest.approx(full[RIGHT_EXTREME])
    assert r[PLAIN] == pytest.approx(full[PLAIN])


def test_chance_keeps_lam_over_k_and_none_keeps_nothing():
    r, full = rewards("chance"), rewards("full")
    assert r[WRONG_EXTREME] == pytest.approx(full[WRONG_EXTREME] - BASE[WRONG_EXTREME] + 2.0 / 4)
    assert rewards("none")[WRONG_EXTREME] == pytest.approx(full[WRONG_EXTREME] - BASE[WRONG_EXTREME])
    # a base already at or below chance is kept: the cap never raises a score
    assert r[WRONG_DIRECTION] == pytest.approx(full[WRONG_DIRECTION] - 0.6 + 0.5)


def test_the_capped_base_is_logged_and_a_failed_judgment_stays_unscored():
    shaper = Shaper(RewardSpec(lam=2.0, k=4, coverage_bonus=1.0, false_claim_base="chance"))
    shaped = shaper.shape([WRONG_EXTREME, RIGHT_EXTREME, WRONG_EXTREME], [1.4, 1.4, None], [WINDOW] * 3)
    assert [terms(WRONG_EXTREME, s)["base_withheld"] for s in shaped[:2]] == [1.0, 0.0]
    assert terms(WRONG_EXTREME, shaped[0])["base"] == 1.4  # the judge's score itself is kept in the record
    assert shaped[2].reward is None


def test_full_by_default_and_bad_values_are_named():
    assert ShapingConfig().false_claim_base == "full"
    with pytest.raises(ConfigError, match=r"reward\.false_claim_base.*maybe.*full, chance, none"):
        load_config(LineupConfig, None, ["reward.false_claim_base=maybe"])
    with pytest.raises(ConfigError, match=r"reward\.false_claim_base.*lam and k"):
        Shaper(ShapingConfig(false_claim_base="chance"))  # no identification score to take chance from
    with pytest.raises(ConfigError, match=r"reward\.false_claim_base.*family is rubric"):
        RewardSpec(family="rubric", false_claim_base="chance")
