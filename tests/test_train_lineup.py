"""LineupRL on TRL: bad configs fail before any model loads; a shrunk CPU run trains for real.

The training test runs RLOO for two steps of a tiny random SmolLM2-shaped policy (the embedded tokenizer
and chat template: ``captionrl.testing.tiny_llama``) with the real embedded verifier (likelihood mode) and
checks (1) every trainable parameter changed, (2) the rewards TRL logged are the ones the
verifier gave: the per-caption sample records average to TRL's logged step reward, and re-judging the
logged captions with the same judge gives the recorded identification scores.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from captionrl.config import load_config
from captionrl.domains.lineup_data import build_lineup_data, validate_candidate_set
from captionrl.errors import ConfigError, DataError
from captionrl.rewards import RewardFunction
from captionrl.rewards.reward import Reward
from captionrl.rewards.spec import RewardSpec
from captionrl.train import lineup
from captionrl.train.lineup import LineupConfig, LineupEvalConfig
from captionrl.types import Judgment

ROOT = Path(__file__).resolve().parents[1]

TINY = [
    "data.window=8", "data.n_train=4", "data.n_test=2", "data.series=[nile,sunspots]",
    "reward.k=2", "reward.signal=soft",
    "train.algorithm=rloo", "train.num_generations=2", "train.per_device_train_batch_size=4",
    "train.max_completion_length=8", "train.max_steps=2", "train.save_steps=2", "train.learning_rate=1.0e-5",
    "train.beta=0.0", "train.report_to=[]", "train.threads=1",
    "eval.compare_initial=false", "eval.bottleneck=false", "train.preflight_items=2",
    "warm_start.epochs=0", "train.freeze_layers=0",  # the warm start: tests/test_warm_start.py
]


@pytest.fixture
def forbid_models(monkeypatch):
    """Any model load raises ModelCallsForbiddenError, so a ConfigError proves validation came first."""
    monkeypatch.setenv("CAPTIONRL_FORBID_MODEL_CALLS", "1")


# ---------------------------------------------------------------------- config errors (fast, no model)
@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("reward.k=1", "reward.k"),
        ("train.num_generations=1", "train.num_generations"),
        ("verifier.kind=tgi", "backend.kind"),
        ("train.algorithm=ppo", "train.algorithm"),
        ("train.lerning_rate=1e-6", "train.lerning_rate"),
        ("train.loss_type=dapo", "train.loss_type"),  # a GRPO knob on RLOO
        ("train.per_device_train_batch_size=3", "train.per_device_train_batch_size"),
        ("policy.input=video", "policy.input"),
        ("reward.factuality_bonus=-0.5", "reward.factuality_bonus"),  # the offending weight is named, not a wildcard
    ],
)
def test_bad_config_fails_on_load(override, field, forbid_models):
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        load_config(LineupConfig, ROOT / "configs" / "lineup-cpu.yaml", [override])
    assert err.value.field == field
    assert err.value.fix  # every message carries a fix
    assert time.perf_counter() - t0 < 2.0


def test_unknown_key_suggests_close_match(forbid_models):
    with pytest.raises(ConfigError, match="learning_rate"):
        load_config(LineupConfig, None, ["train.lerning_rate=1e-6"])


def test_openai_verifier_that_does_not_answer_fails_before_policy_loads(tmp_path, forbid_models):
    cfg = load_config(LineupConfig, ROOT / "configs" / "lineup-cpu.yaml", [
        "verifier.kind=openai", "verifier.base_url=http://127.0.0.1:9/v1", "verifier.model=Qwen2.5-14B-Instruct",
        "verifier.startup_timeout_s=0",  # one probe (training waits 600 s by default: tests/test_server_startup.py)
        f"train.out_dir={tmp_path / 'run'}",
    ])
    with pytest.raises(ConfigError) as err:
        lineup.run(cfg)
    assert err.value.field == "verifier.base_url"
    assert "does not answer" in str(err.value) and "vllm serve" in err.value.fix


def test_candidate_length_mismatch_fails_before_models(tmp_path, forbid_models):
    """A file whose windows are not data.window long, and a candidate set of mixed lengths, both fail
    before any model loads and name what to fix."""
    bad = tmp_path / "sets.jsonl"
    base = {"rule": "nearest", "seed": 0, "stats": ["mean"], "max_overlap": 0.0, "split": "train"}
    rows = [
        {**base, "key": "a", "item_id": "a", "distractor_ids": ["b"], "series": [1, 2, 3, 4]},
        {**base, "key": "b", "item_id": "b", "distractor_ids": ["a"], "series": [1, 2, 3]},
    ]
    bad.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = load_config(LineupConfig, None, ["reward.k=2", "data.window=4", f"data.candidates_file={bad}",
                                    f"train.out_dir={tmp_path / 'run'}"])
    with pytest.raises(DataError) as err:
        lineup.run(cfg)
    assert err.value.field == "data.candidates_file" and "length [3, 4]" in str(err.value)
    with pytest.raises(DataError) as err:
        validate_candidate_set([[1, 2, 3, 4], [1, 2, 3]], 2, "candidates[b]")
    assert err.value.field == "candidates[b]" and "length mismatch" in str(err.value)


def test_candidates_command_output_feeds_the_lineup_data_build(tmp_path, forbid_models):
    """What `captionrl candidates` writes is what data.candidates_file reads: with the same window, stride,
    seed and rule, the rows built from the file are the rows built by mining (K=3 from a K=4 file: a prefix)."""
    from captionrl.cli import main as cli_main

    out = tmp_path / "cands"
    args = ["candidates", "--corpus", "embedded", "--length", "16", "--stride", "16", "--k", "4", "--seed", "3",
            "--out", str(out), "--quiet"]
    assert cli_main(args) == 0
    common = ["data.window=16", "data.n_train=6", "data.n_val=2", "data.n_test=3", "reward.k=3", "seed=3"]
    mined = load_config(LineupConfig, None, common)
    read = load_config(LineupConfig, None, [*common, f"data.candidates_file={out / 'candidates.jsonl'}"])
    from_mining = build_lineup_data(mined.data, mined.reward.k, mined.seed)
    from_file = build_lineup_data(read.data, read.reward.k, read.seed)
    assert {k: len(v) for k, v in from_file.rows.items()} == {"train": 6, "val": 2, "test": 3}
    assert from_file.rows == from_mining.rows
    for r in from_file.rows["test"]:
        assert len(r["candidates"]) == 3 and all(from_file.pool[c].split == "test" for c in r["candidate_ids"])


def test_resume_refuses_a_different_config(tmp_path, forbid_models):
    out = tmp_path / "run"
    first = load_config(LineupConfig, None, [f"train.out_dir={out}", "train.learning_rate=1.0e-6"])
    from captionrl.train.run.run_folder import prepare_run_dir

    assert prepare_run_dir(first, out, "auto") is None  # fresh folder: nothing to resume
    ckpt = out / "checkpoints" / "checkpoint-5"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text("{}")
    assert prepare_run_dir(first, out, "auto") == ckpt  # same config: resumes
    changed = load_config(LineupConfig, None, [f"train.out_dir={out}", "train.learning_rate=3.0e-6", "train.threads=1"])
    with pytest.raises(ConfigError) as err:
        prepare_run_dir(changed, out, "auto")
    assert "train.learning_rate: saved 1e-06, now 3e-06" in str(err.value)
    assert "threads" not in str(err.value)  # threads may change on resume
    with pytest.raises(ConfigError, match="resume is off"):
        prepare_run_dir(first, out, "off")


def test_a_copied_run_folder_resumes_and_a_changed_setting_still_refuses(tmp_path, forbid_models):
    """A run folder copied elsewhere (a warm start reused by a run with another verifier dtype) holds the same
    run: paths inside it are compared relative to it. A path outside it, or any other setting, still counts."""
    import shutil

    from captionrl.train.run.run_folder import prepare_run_dir

    first = tmp_path / "a" / "run"
    cfg = load_config(LineupConfig, None, [f"train.out_dir={first}", f"data.corpus={first}/data.jsonl"])
    prepare_run_dir(cfg, first, "auto")
    (first / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    (first / "checkpoints" / "checkpoint-2" / "trainer_state.json").write_text("{}")
    copy = tmp_path / "b" / "run"
    shutil.copytree(first, copy)
    moved = load_config(LineupConfig, None, [f"train.out_dir={copy}", f"data.corpus={copy}/data.jsonl"])
    assert prepare_run_dir(moved, copy, "auto") == copy / "checkpoints" / "checkpoint-2"
    other_data = load_config(LineupConfig, None, [f"train.out_dir={copy}", f"data.corpus={first}/data.jsonl"])
    with pytest.raises(ConfigError, match=r"data\.corpus: saved '<run folder>/data\.jsonl'"):
        prepare_run_dir(other_data, copy, "auto")


def test_a_run_saved_before_a_setting_existed_resumes_at_its_default(tmp_path, forbid_models):
    """A config saved by an older captionrl lacks the settings added since: at their defaults they keep the
    behaviour the run started with, so it resumes; set to something else, the run is a different one."""
    import yaml

    from captionrl.train.run.run_folder import prepare_run_dir

    out = tmp_path / "run"
    cfg = load_config(LineupConfig, None, [f"train.out_dir={out}"])
    prepare_run_dir(cfg, out, "auto")
    (out / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    (out / "checkpoints" / "checkpoint-2" / "trainer_state.json").write_text("{}")
    saved = yaml.safe_load((out / "config.yaml").read_text())
    del saved["train"]["preflight_margin"]  # as an older captionrl wrote it
    (out / "config.yaml").write_text(yaml.safe_dump(saved))
    assert prepare_run_dir(cfg, out, "auto") is not None
    (out / "config.yaml").write_text(yaml.safe_dump(saved))
    moved = load_config(LineupConfig, None, [f"train.out_dir={out}", "train.preflight_margin=0.3"])
    with pytest.raises(ConfigError, match=r"train\.preflight_margin: saved '\(absent\)', now 0\.3"):
        prepare_run_dir(moved, out, "auto")


def test_algorithm_defaults_are_explicit():
    rloo = load_config(LineupConfig, None, []).train
    grpo = load_config(LineupConfig, None, ["train.algorithm=grpo"]).train
    assert (rloo.beta, rloo.normalize_advantages, rloo.loss_type) == (0.05, False, None)
    assert (grpo.beta, grpo.loss_type, grpo.scale_rewards) == (0.0, "dapo", "group")
    from captionrl.train.run.builder import trainer_args

    args = trainer_args(grpo, seed=3)
    assert (args.num_generations, args.beta, args.loss_type, args.seed) == (4, 0.0, "dapo", 3)
    assert args.use_cpu and not args.bf16 and not args.gradient_checkpointing  # no GPU here


# ---------------------------------------------------------------------- shaping (no model)
class _FixedJudge:
    """A stand-in identification judge (parse path only): fixed scores, one verifier failure."""

    name = "fixed"

    def __init__(self, scores):
        self.scores = scores

    def judge(self, captions, columns):
        return [Judgment(score=s, error=None if s is not None else "verifier down") for s in self.scores]


def test_shaping_penalises_scored_captions_and_keeps_failures_unscored():
    cfg = RewardSpec(max_caption_chars=20, length_penalty=1.0, max_copied_values=1, transcription_penalty=0.1,
                     transcription_run=3, run_penalty=1.0)
    shaped = RewardFunction(Reward(_FixedJudge([1.0, 1.0, None]), cfg))
    logged = {}
    caps = ["short one", "1.50, 2.25, 3.00, 4.75 copied", "anything"]
    out = shaped(prompts=[None] * 3, completions=caps, series_text=["1.50, 2.25, 3.00, 4.75"] * 3,
                 series=[[1.5, 2.25, 3.0, 4.75]] * 3, log_metric=lambda k, v: logged.__setitem__(k, v))
    assert out[0] == 1.0
    # 4 copied values: 3 beyond the allowance of 1 (0.1 each), and a run of 4 consecutive values (1.0)
    assert out[1] == pytest.approx(1.0 - (len(caps[1]) - 20) / 100 - 0.3 - 1.0)
    assert out[2] is None  # a failed verification is never turned into a penalty-only score
    assert logged["verifier_failures"] == 1.0 and logged["shaping/transcription_frac"] == pytest.approx(1 / 3)
    assert logged["shaping/copied_values"] == pytest.approx(4 / 3)


def test_factuality_penalises_contradicted_claims_and_masked_pass_mixes_scores():
    cfg = RewardSpec(factuality_penalty=0.5, masked_weight=0.5, transcription_penalty=0.0, run_penalty=0.0)

    class _Masked:
        name = "masked"

        def judge(self, captions, columns):
            return [Judgment(score=0.2 if "#" in c else 1.0) for c in captions]

    shaped = RewardFunction(Reward(_Masked(), cfg))
    series = [[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]]
    logged = {}
    true, false = shaped(completions=["It rises and ends at 6.", "It falls and ends at 1."], series=series * 2,
                         log_metric=lambda k, v: logged.__setitem__(k, v))
    # masked: numbers become '#', scored 0.2; base (1.0 + 0.2) / 2 = 0.6; the false caption's two claims are red
    assert true == pytest.approx(0.6)
    assert false == pytest.approx(0.6 - 0.5)
    assert logged["shaping/red_share"] == pytest.approx(0.5) and logged["shaping/masked_base"] == pytest.approx(0.2)


def test_an_evaluation_without_any_verifier_is_refused_before_training():
    with pytest.raises(ConfigError, match=r"eval\.train_verifier.*eval\.verifiers"):
        LineupEvalConfig(train_verifier=False, verifiers={})
    assert LineupEvalConfig(train_verifier=False, verifiers={"claims": "claims:rules"}).verifiers
    LineupEvalConfig(enabled=False, train_verifier=False)  # nothing to score: nothing to refuse


def test_llm_claims_need_a_backend():
    with pytest.raises(ConfigError, match="claims_backend"):
        RewardSpec(claims_extractor="llm")


# ---------------------------------------------------------------------- real training
@pytest.mark.slow
def test_lineup_trains_for_real_and_logs_the_verifiers_rewards(tmp_path, embedded_backend, tiny_llama):
    from captionrl.judges.identification import IdentificationJudge
    from captionrl.train.run.curves import load_metrics
    from captionrl.train.run.logging import load_samples
    from checks import unchanged_between_folders

    out = tmp_path / "run"
    cfg = load_config(LineupConfig, ROOT / "configs" / "lineup-cpu.yaml",
                      [*TINY, f"policy.model={tiny_llama}", f"train.out_dir={out}"])
    result = lineup.run(cfg, verifier=embedded_backend)

    # 1. every trainable parameter changed (full fine-tuning: all of them)
    unchanged = unchanged_between_folders(tiny_llama, result["model"])
    assert not unchanged, f"parameters that did not move: {unchanged[:5]}"

    # 2. TRL's logged step reward is the mean of the rewards our reward function returned
    metrics = load_metrics(out / "metrics.jsonl")
    samples = load_samples(out)
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        rows = [s for s in samples if s["step"] == m["step"] - 1]  # generated before the step's update
        assert len(rows) == 4
        assert m["reward"] == pytest.approx(np.mean([r["reward"] for r in rows]), abs=1e-5)
        assert m["identification/soft"] == pytest.approx(np.mean([r["soft"] for r in rows]), abs=1e-5)

    # 3. ... and those rewards are what the verifier says about the logged captions
    data = build_lineup_data(cfg.data, cfg.reward.k, cfg.seed)
    by_id = {r["item_id"]: r for r in data.rows["train"]}
    judge = IdentificationJudge(embedded_backend, cfg.identify_config())
    judged = judge.judge([s["caption"] for s in samples], {"candidates": [by_id[s["item_id"]]["candidates"] for s in samples]})
    got = [j.score for j in judged]
    assert got == pytest.approx([s["base"] for s in samples], abs=2e-3)
    assert len({round(s["base"], 4) for s in samples}) > 1  # a real, varying signal

    # 4. the run ends with curves, a model and an evaluation table in the run folder
    assert Path(result["curves"]).stat().st_size > 0
    summary = json.loads(Path(result["eval"]["summary"]).read_text())
    assert summary["protocol"] and any(r["system"] == "trained" for r in summary["rows"])
    # the main config scores the held-out claims verifier only: no controls, no training-verifier column
    assert {r["system"] for r in summary["rows"]} == {"trained"}
    assert summary["config"]["verifier_names"] == ["claims"] and summary["config"]["train_verifier_name"] is None
    assert (out / "config.yaml").exists() and (out / "checkpoints" / "checkpoint-2").is_dir()
    # 5. ... preceded by the reward preflight and followed by checks it was not trained on
    assert json.loads((out / "preflight.json").read_text())["passed"] is True
    checks = json.loads((out / "eval" / "final_checks.json").read_text())
    trained = next(r for r in checks["rows"] if r["system"] == "trained")
    assert {"green", "red", "transcription", "ends_with_stop", "clipped_ratio", "c2s[claims]"} <= set(trained)
    assert "c2s[train]" not in trained  # eval.train_verifier: false
    assert trained["clipped_ratio"] == 1.0  # 8 tokens cut every caption, and the table says so
