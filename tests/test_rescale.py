"""RL's lineups shown rescaled (``data.rl_rescale_share``, ``domains.rescale``): one map per lineup, so the
answer and what tells the true window apart stay; the true window is shown exactly as the warm start shows
it; the reward reads the rescaled lineup; and the setting refuses what it cannot do."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from captionrl.config import load_config
from captionrl.domains.describe import overall_direction
from captionrl.domains.lineup_data import build_lineup_data
from captionrl.domains.rescale import rescale_candidates, rescaled, rescaled_lineup_rows
from captionrl.domains.timeseries import render_numbers
from captionrl.errors import ConfigError
from captionrl.train.lineup import LineupConfig
from captionrl.train.warm_start import warm_start_records

ROOT = Path(__file__).resolve().parents[1]
CPU = ROOT / "configs" / "lineup-cpu.yaml"


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    cfg = load_config(LineupConfig, CPU, ["data.n_train=48", "data.n_test=4"])
    return build_lineup_data(cfg.data, cfg.reward.k, cfg.seed).rows["train"]


def test_every_candidate_gets_the_true_windows_map(rows):
    """Each rescaled lineup is one affine map of the printed lineup (slope the same sign for all, mirrored for
    about half the lineups): candidates keep their order at every step, pinned endpoints stay shared, the true
    window stays first, the prompt shows the rescaled true window and nothing else changes."""
    out = rescaled_lineup_rows(rows, 1.0, seed=1, precision=2)
    mirrored = 0
    flip = {"up": "down", "down": "up", "flat": "flat"}
    for before, after in zip(rows, out, strict=True):
        assert after["item_id"] == before["item_id"] and after["candidate_ids"] == before["candidate_ids"]
        old = np.array([[float(x) for x in before["series_text"].split(",")], *before["candidates"][1:]])
        new = np.array(after["candidates"])
        assert new.shape == old.shape and after["series"] == after["candidates"][0]
        assert after["series_text"] == render_numbers(np.array(after["series"]), precision=2)[0]
        assert after["prompt"][-1]["content"].replace(after["series_text"], before["series_text"]) == before["prompt"][-1]["content"]
        if np.ptp(old) == 0:
            continue
        line = np.polyfit(old.ravel(), new.ravel(), 1)  # one map for the whole lineup, up to both roundings
        slope = line[0]
        assert np.abs(np.polyval(line, old) - new).max() <= 0.0075 * (1 + abs(slope)) and slope != 0
        mirrored += slope < 0
        assert np.allclose(new[1:, 0], new[0, 0]) and np.allclose(new[1:, -1], new[0, -1])  # still pinned
        d_old, d_new = overall_direction(old[0]), overall_direction(new[0])
        assert d_new == (d_old if slope > 0 else flip[d_old])
    assert 0.25 * len(rows) < mirrored < 0.75 * len(rows)


def test_the_true_window_is_shown_as_the_warm_start_shows_it(rows):
    """At the same seed RL's rescaled prompt is the warm start's rescaled prompt of that window, to the
    character, so a warm start taught on rescaled windows meets the same windows in RL."""
    for seed in (0, 3):
        lineups = rescaled_lineup_rows(rows, 1.0, seed=seed, precision=2)
        records = warm_start_records(rows, 2, rescale_share=1.0, seed=seed)
        assert [r["prompt"] for r in lineups] == [r["prompt"] for r in records]


def test_the_share_draws_per_window_and_nests(rows):
    none = rescaled_lineup_rows(rows, 0.0, seed=1, precision=2)
    assert none == rows
    half = rescaled_lineup_rows(rows, 0.5, seed=1, precision=2)
    changed = [h["item_id"] for h, r in zip(half, rows, strict=True) if h != r]
    assert 0.25 * len(rows) < len(changed) < 0.75 * len(rows)
    assert changed == [r["item_id"] for r in rows if rescaled(r["item_id"], 1, 0.5)]
    assert all(rescaled(i, 1, 0.8) for i in changed)  # a higher share rescales these and more
    assert rescaled_lineup_rows(rows[::-1], 0.5, seed=1, precision=2)[::-1] == half  # order-independent
    assert rows[0]["series_text"] != rescaled_lineup_rows(rows, 1.0, seed=1, precision=2)[0]["series_text"]


def test_a_flat_true_window_maps_every_candidate_to_its_level():
    values, texts = rescale_candidates([[2.0, 2.0, 2.0], [1.0, 2.0, 3.0]], "w", 0, 2)
    assert values[0][0] == values[0][1] == values[0][2] and values[1] == values[0] and texts[0] == texts[1]


def test_rl_reads_the_rescaled_lineups_and_the_warm_start_the_windows_as_they_are(rows):
    """The runner's training rows (what TRL's dataset and the preflight read) are rescaled; the warm start's
    rows (``run.data``) and the held-out ones are not. Their code-checked facts follow what is shown: the
    describer's caption of the shown window is right about it, the caption of the window as it was is not."""
    from types import SimpleNamespace

    from captionrl.domains.describe import short_description
    from captionrl.judges.key_facts import key_facts
    from captionrl.train.lineup import LineupRecipe

    cfg = load_config(LineupConfig, CPU, ["data.rl_rescale_share=1", "data.n_train=48", "data.n_test=4"])
    data = build_lineup_data(cfg.data, cfg.reward.k, cfg.seed)
    runner = LineupRecipe(cfg)
    runner.use_chart = False
    run = SimpleNamespace(data=data)
    shown = runner.rows(run)
    assert shown == rescaled_lineup_rows(data.rows["train"], 1.0, cfg.seed, cfg.data.precision) != data.rows["train"]
    assert runner.rows(run, "test") == data.rows["test"]
    wrong = 0
    for row, original in zip(shown, data.rows["train"], strict=True):
        facts = key_facts(short_description(row["series"], 2), row["series"])
        assert facts.wrong_facts == 0 and facts.correct_facts >= 3
        as_was = key_facts(short_description([float(x) for x in original["series_text"].split(",")], 2), row["series"])
        wrong += as_was.wrong_facts >= 2
    assert wrong > 0.9 * len(shown)


@pytest.mark.parametrize(("overrides", "problem"), [
    (["data.rl_rescale_share=1.5"], "within"),
    (["data.rl_rescale_share=-0.5"], "within"),
    (["data.rl_rescale_share=1", "data.normalise=zscore"], "normalise"),
])
def test_bad_rescale_settings_name_the_field(overrides, problem):
    with pytest.raises(ConfigError, match=problem) as err:
        load_config(LineupConfig, CPU, overrides)
    assert err.value.field == "data.rl_rescale_share"
