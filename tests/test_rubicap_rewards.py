"""``train rubicap`` with every reward family (``reward.family``): the paper's baselines through one recipe.

Config and data checks load no model. The two training runs (1 GRPO step of the tiny random Qwen2.5-VL on 4 scenes)
show that the reward really came from the family's judge: re-scoring the logged captions with that judge
gives the logged rewards back, and those differ from what the rubric judge says about the same captions;
the preflight ran, and the end-of-run check holds a judge that did not produce the reward.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from captionrl.config import load_config
from captionrl.errors import ConfigError, DataError
from captionrl.train import rubicap
from captionrl.train.rubicap import REWARD_FAMILIES, RubicapConfig, build_data

ROOT = Path(__file__).resolve().parents[1]
CPU = ROOT / "configs" / "rubicap-cpu.yaml"
PAPER = ROOT / "configs" / "rubicap-paper.yaml"

ONE_STEP = [
    "data.items=scenes:4:0", "train.num_generations=2", "train.per_device_train_batch_size=2",
    "train.max_completion_length=8", "train.max_steps=1", "train.save_steps=100", "train.report_to=[]",
    "train.threads=1", "train.learning_rate=1.0e-5", "train.preflight_items=4",
    # where the reward came from, not what the policy writes: the 2-layer random Qwen2.5-VL, not the tiny VLM
    # (whose language model is the whole 135M)
    "policy.model=tiny-qwen2.5-vl",
]


@pytest.fixture
def forbid_models(monkeypatch):
    monkeypatch.setenv("CAPTIONRL_FORBID_MODEL_CALLS", "1")


# ---------------------------------------------------------------------- config and data (no model)
def test_unknown_family_names_field_value_and_choices(forbid_models):
    with pytest.raises(ConfigError) as err:
        load_config(RubicapConfig, CPU, ["reward.family=bleu"])
    assert err.value.field == "reward.family" and "bleu" in str(err.value)
    assert all(f in str(err.value) for f in REWARD_FAMILIES)
    with pytest.raises(ConfigError) as err:  # a family's own settings are checked too
        load_config(RubicapConfig, CPU, ["reward.family=judge", "reward.judge.mode=vote"])
    assert err.value.field == "reward.judge.mode"
    assert load_config(RubicapConfig, CPU).reward.family == "rubric"  # default: today's RubiCap
    for family in REWARD_FAMILIES:  # the paper config trains every baseline by the one switch
        assert load_config(RubicapConfig, PAPER, [f"reward.family={family}"]).reward.family == family


def test_the_reward_section_is_the_one_reward_spec(forbid_models):
    """RubiCap's ``reward:`` is the reward spec every face reads: it round-trips through the service's and
    adapters' ``RewardSpec``, ``build_reward`` builds each family's judge from it, the families go by their one
    names, and RubiCap's older spellings fail naming the new ones."""
    import dataclasses

    from captionrl.config import from_dict
    from captionrl.judges.ngram import NgramJudge
    from captionrl.judges.qa import QAJudge
    from captionrl.judges.rubric import RubricJudge
    from captionrl.judges.scalar import ScalarConfig, ScalarJudge
    from captionrl.rewards.reward import Reward
    from captionrl.rewards.spec import IMAGE_FAMILIES, RewardSpec

    assert REWARD_FAMILIES == IMAGE_FAMILIES == ("rubric", "cider", "judge", "answerability")
    backend = object()  # building a judge calls no model
    rows = [{"references": ["a red circle", "a circle"]}, {"references": ["a blue square", "a square"]}]
    built = {}
    for family in REWARD_FAMILIES:
        cfg = load_config(RubicapConfig, PAPER, [f"reward.family={family}"])
        assert isinstance(cfg.reward, RewardSpec)
        spec = from_dict(RewardSpec, dataclasses.asdict(cfg.reward), prefix="reward.")  # the service's spelling
        assert dataclasses.asdict(spec) == dataclasses.asdict(cfg.reward)
        reward = rubicap.make_reward(cfg, backend, rows)
        assert isinstance(reward, Reward) and reward.family == reward.name == family
        assert reward.shaping.transcription_penalty == 0.0 and not reward.needed_columns()  # image captions: no shaping
        built[family] = reward.base
    assert isinstance(built["cider"], NgramJudge) and built["cider"].scorer.n_docs == 2
    assert isinstance(built["judge"], ScalarJudge) and built["judge"].cfg == ScalarConfig(mode="choose", subject="an image")
    assert isinstance(built["answerability"], QAJudge) and built["answerability"].cfg.subject == "image"
    rubric, paper = built["rubric"], load_config(RubicapConfig, PAPER).reward.rubric
    assert isinstance(rubric, RubricJudge) and (rubric.mode, rubric.decision, rubric.max_new_tokens, rubric.name) == (
        paper.mode, paper.decision, paper.max_new_tokens, "rubric-generate")
    for old, field, new in ((["reward.family=likert"], "reward.family", "judge"),
                            (["reward.likert.mode=choose"], "reward.likert", "reward.judge"),
                            (["reward.decision=hard"], "reward.decision", "reward.rubric"),
                            (["reward.mode=generate"], "reward.mode", "reward.rubric.mode")):
        with pytest.raises(ConfigError) as err:
            load_config(RubicapConfig, CPU, old)
        assert err.value.field == field and new in str(err.value)
    with pytest.raises(ConfigError, match="binary decisions only") as err:  # the one decision-rule check
        load_config(RubicapConfig, CPU, ["reward.rubric.mode=generate", "reward.rubric.decision=soft"])
    assert err.value.field == "reward.rubric.decision"


def test_each_family_gets_the_columns_its_judge_reads(tmp_path, forbid_models):
    def rows(family):
        cfg = load_config(RubicapConfig, CPU, ["data.items=scenes:3:0", f"reward.family={family}",
                                               f"train.out_dir={tmp_path / family}"])
        return build_data(cfg).rows

    base = rows("rubric")
    assert not {"references", "reference", "questions"} & set(base[0])  # rubric rows unchanged
    cider = rows("cider")
    assert all(r["references"] and isinstance(r["references"][0], str) for r in cider)
    assert [r["reference"] for r in rows("judge")] == [r["references"][0] for r in cider]
    qa = rows("answerability")
    q = qa[0]["questions"][0]
    assert set(q) == {"question", "options", "answer"} and isinstance(q["answer"], int) and len(q["options"]) == 4


def test_family_without_its_data_fails_before_models(tmp_path, forbid_models):
    from captionrl.domains.scenes import generate_scenes

    lines = []
    for s in generate_scenes(2, seed=1):
        s.render().save(tmp_path / f"{s.id}.png")
        lines.append(json.dumps({"id": s.id, "image": f"{s.id}.png", "facts": s.facts}))  # no captions, no qa
    (tmp_path / "items.jsonl").write_text("\n".join(lines) + "\n")
    for family, field in (("cider", "references"), ("judge", "references"), ("answerability", "qa")):
        cfg = load_config(RubicapConfig, CPU, [f"data.items={tmp_path / 'items.jsonl'}", f"reward.family={family}",
                                               f"train.out_dir={tmp_path / family}"])
        with pytest.raises(DataError) as err:
            build_data(cfg)
        assert err.value.field.endswith(f".{field}") and family in str(err.value)


# ---------------------------------------------------------------------- real training, one step each
def _train(tmp_path, embedded_backend, family, extra=()):
    from captionrl.train.run.curves import load_metrics
    from captionrl.train.run.logging import load_samples

    out = tmp_path / family
    cfg = load_config(RubicapConfig, CPU, [*ONE_STEP, f"reward.family={family}", f"train.out_dir={out}", *extra])
    t0 = time.perf_counter()
    result = rubicap.run(cfg, judge_backend=embedded_backend)
    seconds = time.perf_counter() - t0
    metrics = load_metrics(out / "metrics.jsonl")
    samples = load_samples(out)
    saved = json.loads((out / "result.json").read_text())
    assert saved["reward_family"] == family and result["reward_family"] == family
    assert metrics and metrics[0][f"rewards/{family}/mean"] == pytest.approx(metrics[0]["reward"])
    assert f"{family}/caption_chars" in metrics[0] and "rubric/criteria_met" not in metrics[0]
    assert (out / "preflight.json").is_file()  # the reward preflight ran on this family's reward
    checks = json.loads((out / "eval" / "final_checks.json").read_text())
    assert checks["reward_family"] == family and "rubric" in checks["held_out"]
    assert isinstance(checks["rows"][0]["rubric"], float)  # the rubric judge scored the trained captions
    print(f"\n{family}: {seconds:.1f}s, rewards {[s['reward'] for s in samples]}")
    return cfg, samples, checks


def _rubric_scores(cfg, embedded_backend, samples, out):
    from captionrl.judges.rubric import RubricStore

    store = RubricStore(out / "rubrics" / "rubrics.jsonl")
    rubrics = {i: store.get(i) for i in store.ids()}
    store.close()
    judged = rubicap.make_judge(cfg, embedded_backend).judge([s["caption"] for s in samples],
                                                             {"rubric": [rubrics[s["item_id"]] for s in samples]})
    return [j.score for j in judged]


@pytest.mark.slow
def test_cider_family_trains_on_cider_d(tmp_path, embedded_backend):
    from captionrl.judges.ngram import NgramJudge

    cfg, samples, checks = _train(tmp_path, embedded_backend, "cider")
    assert checks["held_out"] == ["rubric"]  # CIDEr-D produced this reward: it is not a held-out check
    assert samples and all(s["method"] == "cider-d" and s["family"] == "cider" for s in samples)
    refs = {r["item_id"]: r["references"] for r in build_data(cfg).rows}
    again = NgramJudge(cfg.reward.cider, corpus=list(refs.values())).judge(
        [s["caption"] for s in samples], {"references": [refs[s["item_id"]] for s in samples]})
    assert [s["reward"] for s in samples] == pytest.approx([j.score for j in again], abs=1e-9)
    assert [s["reward"] for s in samples] != pytest.approx(_rubric_scores(cfg, embedded_backend, samples, tmp_path / "cider"), abs=1e-3)
    # a random policy's captions share no n-gram with the references (every reward above is 0, with any
    # policy tried), so the nonzero check is the preflight's: the training reward gave each item's first
    # reference exactly its CIDEr-D against the item's references, with the training corpus's frequencies
    pre = json.loads((tmp_path / "cider" / "preflight.json").read_text())
    honest = NgramJudge(cfg.reward.cider, corpus=list(refs.values())).judge(
        [refs[i][0] for i in pre["items"]], {"references": [refs[i] for i in pre["items"]]})
    assert pre["honest_mean"] == pytest.approx(sum(j.score for j in honest) / len(honest), abs=1e-6)
    assert pre["honest_mean"] > 0


@pytest.mark.slow
def test_judge_family_trains_on_the_judges_grade(tmp_path, embedded_backend):
    from captionrl.judges.scalar import ScalarConfig, ScalarJudge

    # a 135M judge is flattered by self-praise: the preflight runs, saves its table and is overridden
    cfg, samples, checks = _train(tmp_path, embedded_backend, "judge",
                                  ["reward.judge.mode=choose", "train.force_preflight=true"])
    assert checks["held_out"] == ["cider_d", "rubric"]
    assert samples and all(s["family"] == "judge" and "expected_grade" in s["judgment"] for s in samples)
    refs = {r["item_id"]: r["reference"] for r in build_data(cfg).rows}
    # the grade as the scalar judge gives it on its own (the settings the family had before the one spec)
    again = ScalarJudge(embedded_backend, ScalarConfig(mode="choose", subject="an image")).judge(
        [s["caption"] for s in samples], {"reference": [refs[s["item_id"]] for s in samples]})
    assert [s["reward"] for s in samples] == pytest.approx([j.score for j in again], abs=2e-3)
    assert [s["reward"] for s in samples] != pytest.approx(_rubric_scores(cfg, embedded_backend, samples, tmp_path / "judge"), abs=1e-3)
