"""``captionrl eval paper`` and ``captionrl train sweep`` on the embedded corpus, with real
verifiers: the embedded SmolLM2 under two evaluation names and a tiny random Qwen2.5-VL as the training
verifier, whose column must stay out of the held-out mean."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from captionrl.records import dumps

ROOT = Path(__file__).resolve().parents[1]


def caption_files(tmp_path: Path, n: int = 24) -> tuple[Path, Path]:
    """Two captioners of the embedded corpus's test windows, in the JSONL ``captionrl caption`` writes: the
    deterministic describer, and a terse one keeping only the describer's first sentence (less information)."""
    from captionrl.domains.datasets import eval_windows
    from captionrl.domains.describe import describe_series

    items = eval_windows("embedded", 12, "test", n, 0, next_length=4)
    full, terse = [], []
    for it in items:
        cap = describe_series(it)
        base = {"id": it.id, "series": it.values.tolist(), "domain": it.domain, "corpus": "embedded", "next": list(it.meta["next"])}
        full.append({**base, "caption": cap})
        terse.append({**base, "caption": cap.split(". ")[0] + "."})
    a, b = tmp_path / "describer.jsonl", tmp_path / "terse.jsonl"
    a.write_text("".join(dumps(r) + "\n" for r in full))
    b.write_text("".join(dumps(r) + "\n" for r in terse))
    return a, b


def test_config_errors_name_the_field(tmp_path):
    from captionrl.errors import ConfigError
    from captionrl.eval.paper import PaperEvalConfig, PaperReward, verifier_names

    with pytest.raises(ConfigError, match="captions"):
        PaperEvalConfig()
    with pytest.raises(ConfigError, match=r"reward\.rules"):
        PaperEvalConfig(captions=["x.jsonl"], reward=PaperReward(rules=["closest"]))
    with pytest.raises(ConfigError, match="train_verifier"):
        verifier_names(["train=hf:embedded"])
    # a bare spec keeps its ,key=value options; NAME=SPEC names it; repeats get unique names
    assert verifier_names(["hf:embedded,dtype=float32", "glm=openai:http://h:1/v1#glm", "hf:embedded"]) == [
        ("hf:embedded", "hf:embedded,dtype=float32"), ("glm", "openai:http://h:1/v1#glm"), ("hf:embedded#2", "hf:embedded")]


@pytest.mark.long  # the same assertions close test_rehearsal_lineup.py (step 5) in the default tier
@pytest.mark.slow
def test_paper_eval_keeps_the_training_verifier_out_of_the_mean(tmp_path, embedded_backend):
    from captionrl.eval.paper import (
        PaperBottleneck,
        PaperEntail,
        PaperEvalConfig,
        PaperIdentify,
        PaperReward,
        run,
    )
    from captionrl.eval.report import build

    a, b = caption_files(tmp_path)
    cfg = PaperEvalConfig(
        captions=[f"describer={a}", f"terse={b}"], out=str(tmp_path / "paper"),
        verifiers=["glm=hf:embedded", "phi=hf:embedded"], train_verifier="tiny-qwen2.5-vl", k=2, limit=2,
        reference="describer",
        identify=PaperIdentify(modes=["letter", "likelihood"], controls=False),
        entail=PaperEntail(batch=8), reward=PaperReward(mode="likelihood"),
        bottleneck=PaperBottleneck(seeds=[0, 1, 2], head="mlp", max_epochs=40, patience=10),
    )
    results = run(cfg, backends={"hf:embedded": embedded_backend})
    assert set(results) == {"identification", "entailment", "reward-accuracy", "bottleneck", "bottleneck-pvalues"}

    # 1. identification: the mean is over glm and phi only, by hand from the per-verifier columns
    ident = results["identification"]
    changed = False
    for row in ident.rows:
        for d in ("c2s", "s2c"):
            held_out = [row[f"{d}[glm]"], row[f"{d}[phi]"]]
            assert row[d] == pytest.approx(np.mean(held_out), abs=1e-4)
            assert f"{d}[train]" in row
            with_train = np.mean([*held_out, row[f"{d}[train]"]])
            changed |= abs(with_train - row[d]) > 1e-3
        assert row["s2c_uncaptioned"] == 0  # the files' own items are the pool: every distractor is captioned
    assert changed, "the training verifier agrees everywhere with the held-out ones: the test cannot tell"
    assert {(r["system"], r["mode"]) for r in ident.rows} == {(s, m) for s in ("describer", "terse")
                                                             for m in ("letter", "likelihood")}
    assert any("held-out verifiers" in n for n in ident.notes)

    # 2. entailment per captioner, Table 3 rows for both distractor rules
    assert [r["system"] for r in results["entailment"].rows] == ["describer", "terse"]
    reward = {r["system"]: r for r in results["reward-accuracy"].rows}
    assert set(reward) == {"nearest distractors", "random distractors"}
    for r in reward.values():
        assert r["reward_above_chance"] == pytest.approx((r["reward_acc"] - 0.5) / 0.5, abs=1e-3)

    # 3. p-values of the reference row against every other row with seeds: rows x MSE columns
    bn, pv = results["bottleneck"], results["bottleneck-pvalues"]
    mse_cols = [c for c in bn.columns if not c.endswith("Rel.")]
    assert any(c.endswith("Rel.") for c in bn.columns)
    others = [r["system"] for r in bn.rows if r["system"] != "describer" and r.get("per_seed")]
    assert sorted(r["system"] for r in pv.rows) == sorted(others) == ["empty caption", "shuffled caption", "terse"]
    assert pv.columns == mse_cols and mse_cols
    for r in pv.rows:
        assert all(0.0 <= r[c] <= 1.0 for c in mse_cols)

    # 4. every table reads back through captionrl report
    rep = build([cfg.out], tmp_path / "report")
    assert {"identification", "entailment", "reward-accuracy", "bottleneck", "bottleneck-pvalues"} <= set(rep["tables"])
    summary = json.loads((tmp_path / "paper" / "identification" / "summary.json").read_text())
    assert summary["held_out_verifiers"] == ["glm", "phi"]


def test_uncaptioned_distractors_are_counted_not_skipped(tmp_path, embedded_backend):
    """s->c with distractors from outside the captioned items: the count is a column and a note."""
    from captionrl.domains.datasets import eval_windows
    from captionrl.eval.identification import CaptionSet, IdentifyEvalConfig, run_identification

    items = eval_windows("embedded", 8, "test", 4, 0)
    pool = {it.id: it for it in items}
    caps = {it.id: f"A series starting at {it.values[0]:.2f}." for it in items[:2]}
    distractors = {items[0].id: [items[1].id], items[1].id: [items[2].id]}  # items[2] has no caption
    cfg = IdentifyEvalConfig(modes=["likelihood"], directions=["s2c"], ks=[2], controls=False, captioner="none")
    res = run_identification(items[:2], [CaptionSet("sys", caps)], distractors, pool, {"v": embedded_backend}, cfg,
                             tmp_path / "ident")
    assert res.rows[0]["s2c_uncaptioned"] == 1
    assert any("1 item(s) of sys not judged" in n for n in res.notes)


SWEEP_TINY = [
    "data.window=8", "data.n_train=4", "data.n_test=2", "data.series=[nile,sunspots]", "reward.signal=soft",
    "train.algorithm=rloo", "train.num_generations=2", "train.per_device_train_batch_size=4",
    "train.max_completion_length=8", "train.max_steps=1", "train.save_steps=1", "train.learning_rate=1.0e-5",
    "train.beta=0.0", "train.report_to=[]", "train.threads=1", "train.preflight_items=0",
    "eval.compare_initial=false", "eval.bottleneck=false", "eval.final_checks=false", "warm_start.epochs=0", "train.freeze_layers=0",
]
SWEEP_EVAL = {"verifiers": ["hf:embedded"], "k": 2, "identify": {"modes": ["likelihood"], "directions": ["c2s"], "controls": False},
              "entail": {"enabled": False}, "reward": {"enabled": False}, "bottleneck": {"enabled": False}}


def test_sweep_config_errors_before_training(tmp_path, monkeypatch):
    from captionrl.errors import ConfigError
    from captionrl.train.sweep import SweepConfig, settings_of

    monkeypatch.setenv("CAPTIONRL_FORBID_MODEL_CALLS", "1")
    with pytest.raises(ConfigError, match="no knob"):
        SweepConfig(out=str(tmp_path))
    with pytest.raises(ConfigError, match="rules"):
        SweepConfig(out=str(tmp_path), rules=["farthest"])
    with pytest.raises(ConfigError, match=r"eval\.k"):
        SweepConfig(out=str(tmp_path), ks=[2], eval={"k": "four"})
    plan = settings_of(SweepConfig(out=str(tmp_path), ks=[4, 6], rules=["nearest", "random"], eval=SWEEP_EVAL))
    assert [s.name for s in plan["k"]] == ["verifier=base,k=4,rule=nearest", "verifier=base,k=6,rule=nearest"]
    assert [s.name for s in plan["rule"]] == ["verifier=base,k=4,rule=nearest", "verifier=base,k=4,rule=random"]


@pytest.mark.slow
def test_sweep_trains_evaluates_and_resumes(tmp_path, embedded_backend, tiny_llama, monkeypatch):
    """The sweep's bookkeeping (settings, tables, figures, resume): each setting trains the tiny random Llama."""
    from captionrl.train import sweep
    from captionrl.train.run.curves import load_metrics

    overrides = [*SWEEP_TINY, f"policy.model={tiny_llama}"]
    cfg = sweep.SweepConfig(lineup=str(ROOT / "configs" / "lineup-cpu.yaml"), overrides=overrides, out=str(tmp_path / "sweep"),
                            ks=[2], rules=["nearest", "random"], eval=SWEEP_EVAL)
    result = sweep.run(cfg, backends={"hf:embedded": embedded_backend})
    out = Path(cfg.out)
    assert sorted(result["settings"]) == ["verifier=base,k=2,rule=nearest", "verifier=base,k=2,rule=random"]
    for name, rec in result["settings"].items():
        run_dir = out / "settings" / name / "run"
        assert rec["rule"] == name.rsplit("=", 1)[1] and rec["k"] == 2
        logged = [m["identification/hard"] for m in load_metrics(run_dir / "metrics.jsonl")]
        assert rec["reward"]["reward_above_chance"] == pytest.approx((np.mean(logged) - 0.5) / 0.5, abs=1e-3)
        ident = rec["tables"]["identification"]["rows"][0]
        assert ident["system"] == "trained" and "c2s[train]" in ident and ident["c2s"] == ident["c2s[hf:embedded]"]
    table = result["tables"]["rule"]
    assert [r["system"] for r in table.rows] == ["rule=nearest (base)", "rule=random"]
    assert table.rows[1]["c2s"] == result["settings"]["verifier=base,k=2,rule=random"]["tables"]["identification"]["rows"][0]["c2s"]
    assert (out / "figure3-rule.png").stat().st_size > 0 and (out / "figure3-reward.png").stat().st_size > 0
    assert json.loads((out / "table-rule" / "summary.json").read_text())["protocol"] == "sweep-rule"

    # resumable: a finished setting is read back, never retrained
    from captionrl.train import lineup

    monkeypatch.setattr(lineup, "run", lambda *a, **k: pytest.fail("a finished setting was trained again"))
    again = sweep.run(cfg, backends={"hf:embedded": embedded_backend})
    assert again["tables"]["rule"].rows == table.rows


def test_shipped_paper_eval_and_sweep_configs_load(monkeypatch):
    """configs/paper-eval.yaml and configs/paper-sweep.yaml validate without any model or server."""
    from captionrl.config import load_config
    from captionrl.eval.paper import PaperEvalConfig, verifier_names
    from captionrl.train.sweep import SweepConfig, settings_of

    monkeypatch.setenv("CAPTIONRL_FORBID_MODEL_CALLS", "1")
    monkeypatch.chdir(ROOT)
    paper = load_config(PaperEvalConfig, ROOT / "configs" / "paper-eval.yaml")
    assert [n for n, _ in verifier_names(paper.verifiers)] == ["glm", "phi"] and paper.train_verifier
    sweep = load_config(SweepConfig, ROOT / "configs" / "paper-sweep.yaml")
    plan = settings_of(sweep)
    assert {k: len(v) for k, v in plan.items()} == {"verifier": 3, "k": 3, "rule": 2}
