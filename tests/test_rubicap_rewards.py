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
        load_config(RubicapConfig, CPU, ["reward.family=likert", "reward.likert.mode=vote"])
    assert err.value.field == "scalar.mode"
    assert load_config(RubicapConfig, CPU).reward.family == "rubric"  # default: today's RubiCap
    for family in REWARD_FAMILIES:  # the paper config trains every baseline by the one switch
        assert load_config(RubicapConfig, PAPER, [f"reward.family={family}"]).reward.family == family


def test_each_family_gets_the_columns_its_judge_reads(tmp_path, forbid_models):
    def rows(family):
        cfg = load_config(RubicapConfig, CPU, ["data.items=scenes:3:0", f"reward.family={family}",
                                               f"train.out_dir={tmp_path / family}"])
        return build_data(cfg).rows

    base = rows("rubric")
    assert not {"references", "reference", "questions"} & set(base[0])  # rubric rows unchanged
    cider = rows("cider")
    assert all(r["references"] and isinstance(r["references"][0], str) for r in cider)
    assert [r["reference"] for r in rows("likert")] == [r["references"][0] for r in cider]
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
    for family, field in (("cider", "references"), ("likert", "references"), ("answerability", "qa")):
        cfg = load_config(RubicapConfig, CPU, [f"data.items={tmp_path / 'items.jsonl'}", f"reward.family={family}",
                                               f"train.out_dir={tmp_path / family}"])
        with pytest.raises(DataError) as err:
            build_data(cfg)
        assert err.value.field.endswith(f".{field}") and family in str(err.value)


# ---------------------------------------------------------------------- real training, one step each
def _train(tmp_path, embedded_backend, family, extra=()):
    from captionrl.train.curves import load_metrics
    from captionrl.train.logging import load_samples

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
def test_likert_family_trains_on_the_judges_grade(tmp_path, embedded_backend):
    from captionrl.judges.scalar import ScalarJudge

    # a 135M judge is flattered by self-praise: the preflight runs, saves its table and is overridden
    cfg, samples, checks = _train(tmp_path, embedded_backend, "likert",
                                  ["reward.likert.mode=choose", "train.force_preflight=true"])
    assert checks["held_out"] == ["cider_d", "rubric"]
    assert samples and all(s["family"] == "likert" and "expected_grade" in s["judgment"] for s in samples)
    refs = {r["item_id"]: r["reference"] for r in build_data(cfg).rows}
    again = ScalarJudge(embedded_backend, cfg.reward.likert).judge(
        [s["caption"] for s in samples], {"reference": [refs[s["item_id"]] for s in samples]})
    assert [s["reward"] for s in samples] == pytest.approx([j.score for j in again], abs=2e-3)
    assert [s["reward"] for s in samples] != pytest.approx(_rubric_scores(cfg, embedded_backend, samples, tmp_path / "likert"), abs=1e-3)
