"""RubiCap on TRL: bad configs fail before any model loads; rubric stores are checked; a shrunk CPU run of
``configs/rubicap-cpu.yaml`` is interrupted after its first checkpoint, resumes, and trains for real.

The training test checks (1) every parameter of the tiny VLM policy changed (full fine-tuning), (2) the
resumed run continued from the checkpoint and kept the interrupted run's log, (3) TRL's logged step reward
is the mean of the per-caption rewards our reward returned, and re-judging the logged captions with the
rubric judge gives those rewards back.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
import pytest

from captionrl.cli import main as cli_main
from captionrl.config import load_config
from captionrl.errors import ConfigError, DataError
from captionrl.train import rubicap
from captionrl.train.rubicap import RubicapConfig, RubricReward, build_data, to_dataset

ROOT = Path(__file__).resolve().parents[1]
CPU = ROOT / "configs" / "rubicap-cpu.yaml"
PAPER = ROOT / "configs" / "rubicap-paper.yaml"

TINY = [
    "data.items=scenes:4:0", "train.num_generations=2", "train.per_device_train_batch_size=2",
    "train.max_completion_length=8", "train.max_steps=2", "train.save_steps=1", "train.report_to=[]",
    "train.threads=1", "train.learning_rate=1.0e-5",
]


@pytest.fixture
def forbid_models(monkeypatch):
    """Any model load raises ModelCallsForbiddenError, so a ConfigError proves validation came first."""
    monkeypatch.setenv("CAPTIONRL_FORBID_MODEL_CALLS", "1")


# ---------------------------------------------------------------------- config errors (fast, no model)
@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("train.algorithm=rloo", "train.algorithm"),
        ("train.num_generations=1", "train.num_generations"),
        ("train.per_device_train_batch_size=3", "train.per_device_train_batch_size"),
        ("reward.rubric.mode=vote", "reward.rubric.mode"),
        ("reward.rubric.mode=generate", "reward.rubric.decision"),  # the CPU config's soft decisions need a graded mode
        ("reward.mode=choose", "reward.mode"),  # the rubric judge's mode is reward.rubric.mode
        ("rubrics.source=store", "rubrics.store"),
        ("rubrics.source=build", "rubrics.committee"),
        ("rubrics.committee=[{kind: openai, model: m}]", "backend.base_url"),
        ("rubrics.missing=ignore", "rubrics.missing"),
        ("policy.input=numbers", "policy.input"),
        ("data.n_train=0", "data.n_train"),
        ("judge.kind=tgi", "backend.kind"),
        ("train.lerning_rate=1e-6", "train.lerning_rate"),
    ],
)
def test_bad_config_fails_on_load(override, field, forbid_models):
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        load_config(RubicapConfig, CPU, [override])
    assert err.value.field == field
    assert err.value.fix
    assert time.perf_counter() - t0 < 2.0


def test_configs_load_and_resolve_grpo_explicitly(forbid_models):
    cpu = load_config(RubicapConfig, CPU)
    assert (cpu.train.algorithm, cpu.train.beta, cpu.train.loss_type, cpu.policy.model) == ("grpo", 0.0, "dapo", "tiny-vlm")
    paper = load_config(RubicapConfig, PAPER)
    assert paper.train.algorithm == "grpo" and paper.train.beta > 0 and not paper.policy.lora
    assert paper.rubrics.source == "build" and len(paper.rubrics.committee) >= 3 and paper.rubrics.writer
    bare = load_config(RubicapConfig, None, [])  # no train section: GRPO and its own run folder, not LineupRL's
    assert (bare.train.algorithm, bare.train.out_dir) == ("grpo", "runs/rubicap")


def test_openai_judge_that_does_not_answer_fails_before_policy_loads(tmp_path, forbid_models):
    cfg = load_config(RubicapConfig, CPU, [
        *TINY, "judge.kind=openai", "judge.base_url=http://127.0.0.1:9/v1", "judge.model=Qwen2.5-72B-Instruct",
        "judge.startup_timeout_s=0",  # one probe (training waits 600 s by default: tests/test_server_startup.py)
        f"train.out_dir={tmp_path / 'run'}",
    ])
    with pytest.raises(ConfigError) as err:
        rubicap.run(cfg)
    assert err.value.field == "judge.base_url" and "does not answer" in str(err.value)


def test_building_rubrics_probes_the_build_servers_not_the_judge(tmp_path, forbid_models, monkeypatch):
    """``--build-rubrics`` talks to the committee, the writer and the student only: on one node the judge takes
    the committee's GPUs after the build, so it is not up yet and must not be probed."""
    cfg = load_config(RubicapConfig, PAPER, ["build_rubrics=true", "judge.startup_timeout_s=0",
                                             f"train.out_dir={tmp_path / 'run'}"])
    fields = [f for _, f in rubicap.build_servers(cfg)]
    assert fields == [f"rubrics.committee[{i}]" for i in range(5)] + ["rubrics.writer", "rubrics.student"]
    assert [f for _, f in rubicap.servers(cfg)] == ["judge", *fields]
    store = load_config(RubicapConfig, PAPER, ["rubrics.source=store", "rubrics.store=s.jsonl"])
    assert rubicap.build_servers(store) == [] and [f for _, f in rubicap.servers(store)] == ["judge"]
    seen = []

    def probe(servers):
        seen.extend(f for _, f in servers)
        raise ConfigError("probed", "x", "stop here", "none")

    monkeypatch.setattr(rubicap, "probe_servers", probe)
    with pytest.raises(ConfigError, match="stop here"):
        rubicap.run_command(cfg)
    assert seen == fields  # the committee, writer and student: not the judge


# ---------------------------------------------------------------------- rubric stores (no model)
def _manifest(tmp_path: Path, n: int) -> Path:
    """A JSONL manifest of real scene images saved as PNG files (paths, so the dataset decodes lazily)."""
    from captionrl.domains.scenes import generate_scenes

    lines = []
    for s in generate_scenes(n, seed=2):
        path = tmp_path / f"{s.id}.png"
        s.render().convert("RGBA").save(path)  # RGBA on disk: the dataset must hand RGB to the policy
        lines.append(json.dumps({"id": s.id, "image": path.name}))
    manifest = tmp_path / "items.jsonl"
    manifest.write_text("\n".join(lines) + "\n")
    return manifest


def test_store_rubrics_feed_the_dataset_and_gaps_are_named(tmp_path, forbid_models):
    from captionrl.domains.scenes import generate_scenes, rubric_from_facts
    from captionrl.judges.rubric import RubricStore

    manifest = _manifest(tmp_path, 4)
    scenes = generate_scenes(4, seed=2)
    store = RubricStore(tmp_path / "store" / "rubrics.jsonl")
    store.put(scenes[0].id, rubric_from_facts(scenes[0]), source="facts")
    store.put(scenes[1].id, rubric_from_facts(scenes[1]), source="facts")
    store.put(scenes[2].id, None, error="writer gave no valid rubric in 3 attempts")
    store.close()
    base = [f"data.items={manifest}", "rubrics.source=store", f"rubrics.store={tmp_path / 'store' / 'rubrics.jsonl'}",
            f"train.out_dir={tmp_path / 'run'}"]

    with pytest.raises(DataError) as err:  # scene 3 is not in the store at all
        build_data(load_config(RubicapConfig, CPU, base))
    assert "1 of 4" in str(err.value) and scenes[3].id in str(err.value) and "rubrics.missing: skip" in err.value.fix

    data = build_data(load_config(RubicapConfig, CPU, [*base, "rubrics.missing=skip"]))
    assert [r["item_id"] for r in data.rows] == [scenes[0].id, scenes[1].id]
    assert data.skipped == {"not in store": [scenes[3].id], "rubric unscored": [scenes[2].id]}
    ds = to_dataset(data)
    img = ds[0]["image"]
    assert img.mode == "RGB" and img.size == (192, 192)
    assert ds[1]["rubric"] == [r.to_dict() for r in rubric_from_facts(scenes[1])]
    assert ds[0]["prompt"][0]["content"][0]["type"] == "image"  # TRL fills this placeholder from the column

    with pytest.raises(ConfigError) as err:
        build_data(load_config(RubicapConfig, CPU, [*base[:2], f"rubrics.store={tmp_path / 'nope.jsonl'}"]))
    assert err.value.field == "rubrics.store" and "captionrl rubrics build" in err.value.fix


def test_facts_source_needs_facts(tmp_path, forbid_models):
    manifest = _manifest(tmp_path, 2)  # a manifest without facts
    cfg = load_config(RubicapConfig, CPU, [f"data.items={manifest}", f"train.out_dir={tmp_path / 'run'}"])
    with pytest.raises(DataError, match="no known facts"):
        build_data(cfg)


def test_check_command_validates_without_models(tmp_path, capsys, forbid_models):
    assert cli_main(["train", "rubicap", "--config", str(CPU), "data.items=scenes:5:1",
                     f"train.out_dir={tmp_path / 'run'}", "--check"]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert got["items"] == 5 and got["skipped"] == {}

    from captionrl.judges.rubric import RubricStore

    assert cli_main(["train", "rubicap", "--config", str(CPU), "data.items=scenes:6:1",
                     f"train.out_dir={tmp_path / 'run'}", "--build-rubrics"]) == 0  # writes the store, trains nothing
    assert "rubrics:" in capsys.readouterr().out
    store = RubricStore(tmp_path / "run" / "rubrics" / "rubrics.jsonl")
    assert len(store) == 6 and all(store.get(i) for i in store.ids())
    assert not (tmp_path / "run" / "checkpoints").exists()


# ---------------------------------------------------------------------- reward error path (fake backend)
class _DeadJudgeBackend:
    """A judge backend whose server is down: every log-likelihood comes back ``None``."""

    name = "dead"

    def loglikelihood(self, pairs):
        return [None for _ in pairs]


def test_judge_outage_is_unscored_not_zero(tmp_path):
    from captionrl.judges.rubric import RubricJudge
    from captionrl.rewards.reward import Reward
    from captionrl.train.run.logging import SampleLog, load_samples

    cfg = load_config(RubicapConfig, None, ["data.items=scenes:2:0", f"train.out_dir={tmp_path / 'run'}"])
    rows = build_data(cfg).rows
    samples = SampleLog(tmp_path)
    reward = RubricReward(Reward(RubricJudge(_DeadJudgeBackend(), mode="likelihood"), family="rubric"), samples)
    logged: dict[str, float] = {}
    out = reward(prompts=[r["prompt"] for r in rows], completions=[[{"role": "assistant", "content": "A red circle."}]] * 2,
                 rubric=[r["rubric"] for r in rows], item_id=[r["item_id"] for r in rows],
                 log_metric=lambda k, v: logged.__setitem__(k, v))
    samples.close()
    assert out == [None, None]
    assert logged["rubric/unscored_frac"] == 1.0 and "rubric/criteria_met" not in logged
    recs = load_samples(tmp_path)
    assert [r["reward"] for r in recs] == [None, None] and all("loglikelihood failed" in r["error"] for r in recs)


# ---------------------------------------------------------------------- real training
class _Interrupt(Exception):
    pass


def _interrupt_after_first_checkpoint():
    from transformers import TrainerCallback

    class Stop(TrainerCallback):
        def on_save(self, args, state, control, **kw):  # the checkpoint is complete when on_save runs
            raise _Interrupt(f"interrupted after checkpoint-{state.global_step}")

    return Stop()


@pytest.mark.long  # RubiCap trains every parameter and resumes exactly: the rubicap-zero3 rehearsal in the default tier
@pytest.mark.slow
def test_rubicap_cpu_run_interrupts_resumes_trains_every_parameter_and_logs_the_judges_rewards(
        tmp_path, embedded_backend, caplog):
    import torch
    from transformers import AutoModelForImageTextToText

    from captionrl.judges.rubric import RubricStore
    from captionrl.tiny_models.vlm import tiny_vlm_dir
    from captionrl.train.run.curves import load_metrics
    from captionrl.train.run.logging import load_samples

    out = tmp_path / "run"
    cfg = load_config(RubicapConfig, CPU, [*TINY, f"train.out_dir={out}"])

    # 1. a run interrupted right after its first checkpoint ...
    with pytest.raises(_Interrupt):
        rubicap.run(cfg, judge_backend=embedded_backend, callbacks=[_interrupt_after_first_checkpoint()])
    assert (out / "checkpoints" / "checkpoint-1" / "trainer_state.json").exists()
    assert not (out / "model").exists()
    before = json.loads((out / "checkpoints" / "checkpoint-1" / "trainer_state.json").read_text())["log_history"]

    # ... is resumed by rerunning the same config, and finishes
    caplog.set_level(logging.INFO, logger="captionrl")
    t0 = time.perf_counter()
    result = rubicap.run(load_config(RubicapConfig, CPU, [*TINY, f"train.out_dir={out}"]), judge_backend=embedded_backend)
    assert f"resuming from {out / 'checkpoints' / 'checkpoint-1'}" in "\n".join(caplog.messages)
    final = json.loads((out / "checkpoints" / "checkpoint-2" / "trainer_state.json").read_text())
    assert final["global_step"] == 2
    assert [h["step"] for h in final["log_history"] if "reward" in h] == [1, 2]
    assert all(h in final["log_history"] for h in before if "reward" in h)  # the first run's log is kept

    # 2. every parameter of the policy moved (full fine-tuning; vision tower and connector included)
    base = AutoModelForImageTextToText.from_pretrained(tiny_vlm_dir())
    trained = AutoModelForImageTextToText.from_pretrained(result["model"])
    pairs = list(zip(base.named_parameters(), trained.named_parameters(), strict=True))
    unchanged = [n for (n, p0), (_, p1) in pairs if torch.equal(p0, p1)]
    assert not unchanged, f"parameters that did not move: {unchanged[:5]}"
    assert any(n.startswith("model.vision_model") for (n, _), _ in pairs)

    # 3. TRL's logged reward is the mean of our per-caption rewards, logged alongside the run's diagnostics
    metrics = load_metrics(out / "metrics.jsonl")
    samples = load_samples(out)
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        rows = [s for s in samples if s["step"] == m["step"] - 1]  # generated before the step's update
        assert len(rows) == 2 and all(r["reward"] is not None for r in rows)
        assert m["reward"] == pytest.approx(np.mean([r["reward"] for r in rows]), abs=1e-5)
        assert m["rubric/unscored_frac"] == 0.0 and "frac_reward_zero_std" in m and m["completions/mean_length"] > 0
        assert m["rubric/caption_chars"] == pytest.approx(np.mean([len(r["caption"]) for r in rows]))

    # 4. ... and those rewards are what the rubric judge says about the logged captions
    store = RubricStore(result["rubrics"])
    rubrics = {i: store.get(i) for i in store.ids()}
    judge = rubicap.make_judge(cfg, embedded_backend)
    again = judge.judge([s["caption"] for s in samples], {"rubric": [rubrics[s["item_id"]] for s in samples]})
    assert [j.score for j in again] == pytest.approx([s["reward"] for s in samples], abs=2e-3)
    assert len({round(s["reward"], 4) for s in samples}) > 1  # a real, varying signal

    assert Path(result["curves"]).stat().st_size > 0 and result["step_seconds"] > 0
    print(f"\nrubicap resume+2 steps: {time.perf_counter() - t0:.1f}s; step {result['step_seconds']}s; "
          f"rewards {[round(m['reward'], 4) for m in metrics]}")
