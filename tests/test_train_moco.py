"""MoCo Rubric and EvoLM on TRL: config checks (H against the reward interval, GRPO only, G), and CPU smoke
runs of both methods with a tiny Policy, the tiny VLM for MoCo and the random Qwen2.5-VL for EvoLM (its Generator
fails the schema: recorded, facts fallback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from captionrl.config import load_config
from captionrl.errors import ConfigError
from captionrl.records import read_jsonl
from captionrl.train.moco import MocoConfig, build_rows, run

ROOT = Path(__file__).resolve().parents[1]
CPU = ROOT / "configs" / "moco-cpu.yaml"
PAPER = ROOT / "configs" / "moco-paper.yaml"
SMALL = ["data.n_train=2", "train.max_completion_length=12", "rubric.max_new_tokens=16", "rubric.max_attempts=1",
         "train.threads=1"]


def test_configs_load_and_paper_settings():
    cpu = load_config(MocoConfig, CPU)
    assert cpu.method == "moco" and cpu.train.algorithm == "grpo" and cpu.rubric.group_size == 4
    paper = load_config(MocoConfig, PAPER)
    assert (paper.train.num_generations, paper.momentum.m, paper.momentum.interval, paper.train.max_steps) == (
        16, 0.99, 1, 600)
    assert paper.rubric.n_candidates == 4 and paper.rubric.fallback == "none" and paper.judge.mode == "generate"
    assert (paper.evolm.policy_steps, paper.evolm.generator_steps, paper.evolm.judge_weight,
            paper.evolm.format_weight) == (50, 50, 0.7, 0.3)


def test_interval_must_be_a_multiple_of_the_reward_interval():
    with pytest.raises(ConfigError, match=r"momentum\.interval"):
        load_config(MocoConfig, CPU, ["train.num_iterations=2", "momentum.interval=3"])
    assert load_config(MocoConfig, CPU, ["train.num_iterations=2", "momentum.interval=4"]).reward_interval() == 2


@pytest.mark.parametrize(("overrides", "field"), [
    (["train.algorithm=rloo"], "train.algorithm"),
    (["momentum.variant=jont"], "momentum.variant"),
    (["rubric.group_size=8"], "rubric.group_size"),
    (["method=evolm2"], "method"),
    (["momentum.implementation=copy"], "momentum.implementation"),
    (["rubric.temperature=-0.5"], "rubric.temperature"),
])
def test_bad_settings_name_the_field(overrides, field):
    with pytest.raises(ConfigError) as exc:
        load_config(MocoConfig, CPU, overrides)
    assert exc.value.field == field


def test_rows_carry_two_references_and_facts():
    rows = build_rows(load_config(MocoConfig, CPU, ["data.n_train=3"]))
    assert len(rows) == 3 and len({r["item_id"] for r in rows}) == 3
    for r in rows:
        assert len(r["references"]) == 2 and r["references"][0] != r["references"][1]
        assert json.loads(r["facts"]) and r["image"].size == (96, 96)
        assert r["prompt"][0]["content"][0] == {"type": "image"}


def test_the_reward_is_the_rubric_family_of_the_one_reward():
    """MoCo's reward is built through the reward spec and ``build_reward``: the rubric family (its one name),
    decided under ``judge.*`` by MoCo's Judge on rubrics the served Generator writes, no shaping; the one
    decision-rule check refuses generate with soft decisions when the config loads."""
    from captionrl.judges.online_rubric import MocoRubricJudge, OnlineRubricJudge, fixed_roles
    from captionrl.rewards.reward import Reward
    from captionrl.rewards.spec import RewardSpec
    from captionrl.train.moco import online_rubric_reward

    cfg = load_config(MocoConfig, PAPER, ["reward.max_fallback_frac=0.25"])
    spec = cfg.reward_spec()
    assert isinstance(spec, RewardSpec) and (spec.family, spec.subject) == ("rubric", "image")
    assert (spec.rubric.mode, spec.rubric.decision, spec.rubric.max_new_tokens) == (
        cfg.judge.mode, cfg.judge.decision, cfg.judge.max_new_tokens)
    assert spec.max_fallback_frac == 0.25 and spec.transcription_penalty == spec.run_penalty == 0.0
    backend = object()  # building the reward calls no model
    reward = online_rubric_reward(cfg, fixed_roles(backend, backend))
    assert isinstance(reward.reward, Reward) and reward.reward.family == "rubric" and reward.__name__ == "moco_rubric"
    assert isinstance(reward.judge, OnlineRubricJudge) and reward.judge.cfg is cfg.rubric
    judge = reward.judge.judge_factory(backend)
    assert type(judge) is MocoRubricJudge and (judge.mode, judge.decision, judge.max_new_tokens, judge.name) == (
        "generate", "hard", cfg.judge.max_new_tokens, "moco-judge-generate")
    assert type(cfg.judge.factory(backend)) is MocoRubricJudge  # EvoLM's fixed Judge: the same factory
    with pytest.raises(ConfigError, match="binary decisions only") as exc:
        load_config(MocoConfig, PAPER, ["judge.decision=soft"])
    assert exc.value.field == "judge.decision"


@pytest.mark.long  # MoCo training and resume: test_rehearsal_moco.py and the moco-zero3 rehearsal in the default tier
@pytest.mark.slow
def test_moco_smoke_trains_with_momentum_judge_and_resumes(tmp_path):
    out = tmp_path / "run"
    cfg = load_config(MocoConfig, CPU, [*SMALL, f"train.out_dir={out}", "train.max_steps=2", "train.save_steps=2"])
    res = run(cfg)
    metrics = [r for r in read_jsonl(out / "metrics.jsonl") if "reward" in r]
    assert [r["step"] for r in metrics] == [1, 2]
    dist = [r["momentum/distance"] for r in metrics]
    assert 0 < dist[0] < dist[1] < 0.5, "the EMA follows the Policy with a lag"
    for key in ("frac_reward_zero_std", "rubric/size", "rubric/weight3_frac", "rubric/fallback_frac"):
        assert all(key in r for r in metrics), key
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert res["curve_points"]["momentum/distance"] == 2
    groups = list(read_jsonl(out / "rubrics.rank0.jsonl"))
    assert len(groups) == 2 and all(g["source"] == "facts-fallback" for g in groups)
    assert all(g["raws"][0] and g["errors"] for g in groups), "the tiny Generator's failed replies are kept"
    assert all(len(g["subset"]) == 4 and all(s is not None for s in g["scores"]) for g in groups)
    assert (out / "checkpoints" / "checkpoint-2" / "momentum.pt").exists()
    assert res["momentum"]["implementation"] == "LoraAdapterMomentum" and res["momentum"]["updates"] == 2
    assert res["seconds_per_step"] > 0

    # interrupted after step 2: the rerun resumes from the checkpoint, momentum included
    res2 = run(load_config(MocoConfig, CPU, [*SMALL, f"train.out_dir={out}", "train.max_steps=3", "train.save_steps=2"]))
    assert res2["steps"] == 3 and res2["momentum"]["updates"] == 3
    steps = [r["step"] for r in read_jsonl(out / "metrics.jsonl") if "reward" in r]
    assert steps == [1, 2, 3]


@pytest.mark.slow
def test_evolm_smoke_alternates_policy_and_generator_phases(tmp_path):
    out = tmp_path / "evo"
    # EvoLM's phase bookkeeping, not a model's captions: the tiny random Qwen2.5-VL policy (2 layers) stands in
    # for the tiny VLM, whose language model is the whole 135M
    cfg = load_config(MocoConfig, CPU, [*SMALL, "policy.model=tiny-qwen2.5-vl", "method=evolm", f"train.out_dir={out}", "train.max_steps=1",
                                 "evolm.policy_steps=1", "evolm.generator_steps=1", "evolm.n_captions=2",
                                 "evolm.generator_num_generations=2", "train.num_generations=2",
                                 "train.per_device_train_batch_size=2"])
    res = run(cfg)
    assert res["phases"] == 1
    assert [r["phase"] for r in read_jsonl(out / "evolm" / "phases.jsonl")] == [1]
    caps = list(read_jsonl(out / "evolm" / "captions.jsonl"))
    assert sorted({c["phase"] for c in caps}) == [0, 1] and len(caps) == 2 * 2 * 2
    rows = list(read_jsonl(out / "metrics.jsonl"))
    pol = [r for r in rows if r["role"] == "policy"]
    gen = [r for r in rows if r["role"] == "generator" and "generator/reward" in r]
    assert pol and gen
    # the untrained Generator writes no valid rubric: format term 0, so its reward is exactly 0, not None
    assert gen[0]["generator/evolm/format_valid"] == 0 and gen[0]["generator/reward"] == 0
    assert (out / "curves.png").exists() and (out / "evolm" / "state.pt").exists()
