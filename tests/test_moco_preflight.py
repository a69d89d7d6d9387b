"""MoCo's reward preflight through its own reward path: the tiny VLM Policy's momentum adapter
writes the rubric of each probe's item (facts fallback) and judges the probe caption, before step 1.

The CPU config's likelihood Judge passes: the exact-facts reference beats every probe. The same Policy as a
``choose``/``hard`` Judge says yes to every criterion for self-praise as well (it cannot discriminate): the
run is refused, with the table and MoCo's config keys (``train.force_preflight`` is the generic path of
``test_preflight``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from captionrl.config import load_config
from captionrl.preflight import PreflightError
from captionrl.train.moco import MocoConfig, MocoJudgeConfig, MocoRecipe
from captionrl.train.run.skeleton import prepare

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["data.n_train=2", "train.max_completion_length=12", "rubric.max_new_tokens=8", "rubric.max_attempts=1",
         "train.threads=1", "train.preflight_items=2"]


@pytest.mark.slow
def test_moco_preflight_passes_the_cpu_config_refuses_a_judge_that_cannot_discriminate_and_final_checks(tmp_path):
    out = tmp_path / "run"
    cfg = load_config(MocoConfig, ROOT / "configs" / "moco-cpu.yaml", [*SMALL, f"train.out_dir={out}"])
    recipe = MocoRecipe(cfg)
    run = prepare(recipe)
    run.trainer = recipe.build_trainer(run)  # the momentum exists from here on

    recipe.preflight(run)
    saved = json.loads((out / "preflight.json").read_text())
    means = {r["probe"]: r["mean"] for r in saved["rows"]}
    assert saved["passed"] and all(means[p] < means["honest"] for p in means if p != "honest"), means
    assert (out / "preflight.md").read_text().startswith("# Reward preflight: passed")
    assert not (out / "rubrics.rank0.jsonl").exists() or not (out / "rubrics.rank0.jsonl").read_text(), \
        "probe groups are not training groups"

    recipe.reward.judge.judge_factory = MocoJudgeConfig(mode="choose", decision="hard").factory
    with pytest.raises(PreflightError, match=r"(?s)self_praise.*judge\.mode.*train\.force_preflight=true"):
        recipe.preflight(run)
    md = (out / "preflight.md").read_text()
    assert md.startswith("# Reward preflight: FAILED\n") and "| self_praise |" in md and "YES" in md

    # the end of a MoCo run: a check that did not produce its reward (CIDEr-D against the two references)
    checks = recipe.final_evaluation(run)["final_checks"]
    rows = {r["system"]: r for r in checks["rows"]}
    assert rows["trained"]["cider_d"] is not None and rows["trained"]["n"] == 2
    assert rows["reference (first vs the others)"]["cider_d"] > 0  # the yardstick: one reference vs the other
    md = (out / "eval" / "final_checks.md").read_text()
    assert "cider_d" in md and "did not produce" in md
