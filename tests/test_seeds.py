"""Results over seeds: parsing, the per-seed folders, the interval arithmetic and the resume rule."""

from __future__ import annotations

import json

import pytest
from scipy import stats

from captionrl.errors import ConfigError
from captionrl.eval.stats import mean_interval
from captionrl.train.run.seeds import aggregate, markdown, parse_seeds, run_seeds, seed_config


def test_parse_seeds_accepts_lists_strings_and_counts():
    assert parse_seeds("0,1,2") == [0, 1, 2]
    assert parse_seeds([3, 5]) == [3, 5]
    assert parse_seeds(3) == [0, 1, 2]
    assert parse_seeds(None) == []
    with pytest.raises(ConfigError, match="seeds"):
        parse_seeds("0,a")
    with pytest.raises(ConfigError, match="repeated"):
        parse_seeds("1,1")


def test_mean_interval_is_the_student_t_interval():
    xs = [0.2, 0.5, 0.4, 0.1]
    m, lo, hi = mean_interval(xs)
    half = stats.t.ppf(0.975, 3) * stats.tstd(xs) / 2
    assert m == pytest.approx(0.3) and lo == pytest.approx(0.3 - half) and hi == pytest.approx(0.3 + half)
    assert mean_interval([0.7]) == (0.7, 0.7, 0.7)
    assert mean_interval([None, float("nan")]) is None  # unscored items are dropped, not zeros


def _seed(seed, trained_red, initial_red):
    return {"seed": seed, "systems": {"trained": {"red": trained_red}, "initial": {"red": initial_red}},
            "rewards": [0.1, 0.2], "reward_first": 0.1, "reward_last": 0.2}


def test_aggregate_pairs_trained_and_initial_seed_by_seed():
    summary = aggregate([_seed(0, 0.2, 0.5), _seed(1, 0.3, 0.5), _seed(2, 0.1, 0.4)])
    rows = {r["system"]: r for r in summary["rows"]}
    assert rows["trained"]["red"]["mean"] == pytest.approx(0.2)
    diff = rows["trained - initial"]["red"]
    m, lo, hi = mean_interval([-0.3, -0.2, -0.3])
    assert (diff["mean"], diff["lo"], diff["hi"]) == pytest.approx((m, lo, hi), abs=1e-4) and diff["n"] == 3
    table = markdown(summary)
    assert "| trained - initial |" in table and "0.1 -> 0.2" not in table and "0.100 -> 0.200" in table


def test_a_warm_started_run_also_reports_what_rl_added_to_the_warm_start():
    seeds = [_seed(0, 0.2, 0.5), _seed(1, 0.3, 0.5), _seed(2, 0.1, 0.4)]
    assert "warm start" not in {r["system"] for r in aggregate(seeds)["rows"]}  # no warm start, no such rows
    for s, warm in zip(seeds, (0.25, 0.25, 0.2), strict=True):
        s["systems"]["warm start"] = {"red": warm}
    rows = {r["system"]: r for r in aggregate(seeds)["rows"]}
    assert rows["warm start"]["red"]["mean"] == pytest.approx(0.2333, abs=1e-4)
    assert rows["trained - warm start"]["red"]["mean"] == pytest.approx(-0.0333, abs=1e-4)
    assert rows["trained - initial"]["red"]["mean"] == pytest.approx(-0.2667, abs=1e-4)


def test_run_seeds_gives_each_seed_its_folder_and_skips_finished_ones(tmp_path):
    from captionrl.train.lineup import LineupConfig

    cfg = LineupConfig(seeds="0,1")
    cfg.train.out_dir = str(tmp_path)
    assert seed_config(cfg, 1).train.out_dir == str(tmp_path / "seed-1") and seed_config(cfg, 1).train.seed == 1
    done = tmp_path / "seed-0"
    done.mkdir()
    (done / "result.json").write_text(json.dumps({"reward_first": 0.0, "reward_last": 1.0}))
    ran = []

    def run_one(c):
        ran.append(c.seed)
        return {"reward_first": 0.5, "reward_last": 0.6}

    summary = run_seeds(cfg, run_one)
    assert ran == [1]  # seed 0 had finished: resumed, not rerun
    assert summary["reward_first_last"] == [(0.0, 1.0), (0.5, 0.6)]
    assert (tmp_path / "seeds.md").is_file()
    assert not (tmp_path / "seeds.png").exists()  # no metrics were logged: no curve to draw
