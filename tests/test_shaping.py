"""The shaping settings have one declaration (``rewards.shaping.ShapingConfig``) that every consumer reads."""

from __future__ import annotations

import dataclasses

import pytest

from captionrl.config import from_dict, load_config
from captionrl.errors import ConfigError
from captionrl.rewards.shaping import ShapingConfig


@pytest.mark.parametrize("key", ShapingConfig.WEIGHTS)
def test_a_negative_weight_is_named_by_its_own_key(key):
    """Each weight's error names that weight (an older check named length_penalty for all of them), as the
    reward section spells it everywhere: ``reward.<key>``."""
    from captionrl.train.lineup import LineupConfig

    with pytest.raises(ConfigError) as err:
        load_config(LineupConfig, None, [f"reward.{key}=-0.5"])
    assert err.value.field == f"reward.{key}"
    with pytest.raises(ConfigError) as err:
        ShapingConfig(**{key: -0.5})
    assert err.value.field == f"reward.{key}"


def test_training_adapters_and_service_read_one_reward_section():
    """One spelling: ``train lineup``'s ``reward`` section, the service's and the adapters' are the same class,
    so the same YAML mapping gives the same reward in all three."""
    from captionrl.rewards.spec import RewardSetup, RewardSpec
    from captionrl.serve.config import RewardServiceConfig
    from captionrl.train.lineup import LineupConfig

    section = {"mode": "likelihood", "k": 3, "transcription_run": 4, "factuality_penalty": 1.0, "masked_weight": 0.5}
    trained = load_config(LineupConfig, None, [f"reward.{k}={v}" for k, v in section.items()]).reward
    served = from_dict(RewardServiceConfig, {"reward": section}).reward
    adapted = from_dict(RewardSetup, {"reward": section}).reward
    assert type(trained) is type(served) is type(adapted) is RewardSpec
    assert trained == served == adapted
    assert served.guard().min_run == 4 and served.factuality_term().weight == 1.0
    assert ShapingConfig().guard() is not None  # the transcription guard is on unless switched off
    names = [f.name for f in dataclasses.fields(ShapingConfig)]
    assert {n: getattr(RewardSpec(), n) for n in names} == dataclasses.asdict(ShapingConfig())


def test_unknown_keys_get_close_matches():
    from captionrl.rewards.spec import RewardSetup

    with pytest.raises(ConfigError, match="transcription_run") as err:
        from_dict(RewardSetup, {"reward": {"transcription_runs": 3}})
    assert err.value.field == "reward.transcription_runs"


def test_guard_and_factuality_term_follow_the_settings():
    off = ShapingConfig(transcription_penalty=0.0, run_penalty=0.0)
    assert off.guard() is None and off.counting().min_run == 3
    g = ShapingConfig(max_copied_values=2, transcription_run=5, transcription_penalty=0.3, run_penalty=0.7).guard()
    assert (g.max_copied_values, g.min_run, g.value_penalty, g.run_penalty) == (2, 5, 0.3, 0.7)
    term = ShapingConfig(factuality_penalty=0.4, factuality_bonus=0.2, factuality_tolerance=0.5).factuality_term()
    assert (term.weight, term.bonus, term.tolerance, term.extractor) == (0.4, 0.2, 0.5, "rules")
    with pytest.raises(ConfigError) as err:
        ShapingConfig(transcription_run=1)
    assert err.value.field == "reward.transcription_run"
