"""`captionrl preflight`: the reward's probes scored without a policy, each term switched off in turn, and a
captioner's own captions (does the lineup still pay at RL's start point)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from captionrl.commands.preflight import shaped_means, switchable_terms
from captionrl.config import load_config
from captionrl.domains.lineup_data import build_lineup_data
from captionrl.judges.claims_verifier import parse_claims_spec
from captionrl.preflight import series_extra_probes, series_references
from captionrl.probes import probe_captions, winning_probes
from captionrl.rewards.reward import Reward
from captionrl.train.lineup_config import LineupConfig


def _setup():
    cfg = load_config(LineupConfig, "configs/lineup-cpu.yaml", ["data.n_train=6", "data.n_test=0"])
    rows = build_lineup_data(cfg.data, cfg.reward.k, 0).rows["train"]
    honest, dumps = series_references(rows)
    captions = probe_captions(honest, dumps, series_extra_probes(rows, cfg.instruction()))
    judge = parse_claims_spec("claims:rules").identification_judge(cfg.identify_config())  # a real judge, no model
    reward = Reward(judge, cfg.reward, instruction=cfg.instruction(), series_rows=True)
    return cfg, rows, captions, reward


def test_reshaping_from_judge_scores_computed_once_reproduces_the_reward_and_switches_terms_off():
    cfg, rows, captions, reward = _setup()
    cols = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"}
    full, base = {}, {}
    for probe, caps in captions.items():
        judged = reward.score(caps, cols)
        full[probe] = float(np.mean([j.score for j in judged]))
        base[probe] = [j.extra["base"] for j in judged]
    assert shaped_means(reward, cfg.reward, captions, base, None, rows) == pytest.approx(full)
    lam0 = shaped_means(reward, dataclasses.replace(cfg.reward, lam=0.0), captions, base, None, rows)
    for probe in captions:  # the identification term is lam x the judge's accuracy, nothing else moves
        assert lam0[probe] == pytest.approx(full[probe] - float(np.mean(base[probe])))
    no_guard = dataclasses.replace(cfg.reward, degenerate_penalty=0.0, coverage_bonus=0.0, no_fact_penalty=0.0)
    assert shaped_means(reward, no_guard, captions, base, None, rows)["honest"] < full["honest"]
    assert switchable_terms(cfg.reward)[0] == "lam" and "coverage_bonus" in switchable_terms(cfg.reward)
    assert "factuality_bonus" not in switchable_terms(cfg.reward)  # 0 in the config: nothing to switch off


def test_winners_are_probes_within_the_margin_never_the_honest_reference_or_a_captioner():
    means = {"honest": 1.0, "dump": 0.8, "empty": 0.5, "captioner[0]": 2.0, "other_item": None}
    assert winning_probes(means, 0.25) == ["dump"]
    assert winning_probes(means, 0.1) == []
    assert winning_probes({"dump": 1.0}, 0.0) == []  # no honest reference scored: nothing to beat


@pytest.mark.slow
def test_command_scores_probes_a_captioners_samples_and_every_term_switched_off(tmp_path, capsys, tiny_llama):
    from captionrl.cli import main

    rc = main(["preflight", "--config", "configs/lineup-cpu.yaml", "data.window=8", "data.n_train=6",
               "data.n_test=0", "train.preflight_items=2", "verifier.dtype=float32", f"captioner={tiny_llama}",
               "samples=2", "data.pin_endpoints=true"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "pinned distractors: True" in out
    for row in ("| honest |", "| dump |", "| captioner[0] |", "| captioner[1] |", "| lam |", "| coverage_bonus |"):
        assert row in out, out
    honest = next(line for line in out.splitlines() if line.startswith("| honest |"))
    assert 0.0 <= float(honest.split("|")[3]) <= 1.0  # the verifier's probability on the true series


def test_minimal_terms_keeps_only_what_a_probe_needs_given_the_others_off():
    from captionrl.commands.preflight import minimal_terms

    def means_without(off):  # the dump wins once both guards are off; the hedge once coverage is off
        return {"honest": 1.0, "dump": 1.0 if {"transcription", "degenerate"} <= set(off) else 0.0,
                "hedge": 1.0 if "coverage" in off else 0.0}

    kept, steps = minimal_terms(means_without, ["transcription", "length", "degenerate", "coverage"], 0.25)
    assert kept == ["degenerate", "coverage"]
    assert [t for t, _ in steps] == ["transcription", "length (with transcription)",
                                     "degenerate (with transcription, length)", "coverage (with transcription, length)"]


def test_nothing_to_score_or_no_samples_is_a_named_error():
    from captionrl.commands.preflight import PreflightCommandConfig
    from captionrl.errors import ConfigError

    with pytest.raises(ConfigError, match=r"probes.*captioner="):
        PreflightCommandConfig(probes=False)
    with pytest.raises(ConfigError, match=r"samples"):
        PreflightCommandConfig(captioner="runs/x/warm_start/model", samples=0)
