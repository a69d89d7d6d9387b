"""Rehearsal of LineupRL's paper path on CPU: every joint of the GPU path, with tiny models.

``configs/lineup-paper.yaml`` as the README's numbered paper path runs it, with only the sizes and the
models replaced: the policy is a tiny, randomly initialised Qwen2.5-VL (real processor and chat template,
reading rendered charts), the verifier is served over HTTP by the llama.cpp test server in letter mode (the
paper serves Qwen2.5-14B with vLLM), and the data is a small slice of a real benchmark layout (Saugeen
river flows, written by the test) prepared by ``captionrl data prepare``. Stages: prepare -> train 2 RLOO
steps on charts -> checkpoint selection on validation items -> caption the test split with the selected
checkpoint -> the paper's evaluation -> tables.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from captionrl.cli import main
from presets import ON_CPU
from servers import requires_llama_cpp
from test_prepare import write_saugeen
from test_tiny_qwen_vl import vision_calls  # noqa: F401  (fixture: pixels reached the policy)

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.server
@requires_llama_cpp
def test_lineup_paper_path_rehearsal(tmp_path, llama_server, vision_calls):  # noqa: F811
    # 1. prepare: a real-format benchmark slice -> a prepared dataset folder with a manifest
    prep = tmp_path / "prepared"
    assert main(["data", "prepare", "source=saugeen", f"path={write_saugeen(tmp_path / 'raw', rows=1200)}",
                 f"out={prep}", "length=16", "horizon=4", "k=2", "quiet=true"]) == 0
    manifest = json.loads((prep / "manifest.json").read_text())
    assert manifest["candidates"]["k"] == 2 and manifest["counts"]["test"]["prepared"] >= 2

    # 2. train: the paper config, models and sizes replaced; the verifier is served over HTTP in letter mode
    run = tmp_path / "run"
    served_id = httpx.get(f"{llama_server.base_url}/models").json()["data"][0]["id"]
    served = [f"verifier.base_url={llama_server.base_url}", f"verifier.model={served_id}"]
    assert main(["train", "lineup", "--config", str(ROOT / "configs" / "lineup-paper.yaml"), *served,
                 "policy.model=tiny-qwen2.5-vl", "policy.dtype=float32", f"data.prepared={prep}",
                 "data.n_train=4", "data.n_val=1", "data.n_test=2", "reward.k=2",
                 "train.num_generations=2", "train.per_device_train_batch_size=2", "train.max_completion_length=8",
                 "train.max_steps=2", "train.save_steps=1", "train.report_to=[]", "train.threads=1",
                 *ON_CPU, "train.gradient_checkpointing=false",
                 "eval.enabled=false",
                 "train.preflight_items=0",  # 14 served requests; the preflight's own tests: test_preflight.py
                 f"train.out_dir={run}"]) == 0
    result = json.loads((run / "result.json").read_text())
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "loss" in m] == [1, 2]
    assert all(m["identification/unscored_frac"] == 0.0 for m in metrics if "loss" in m)  # the server scored all

    # 3. checkpoint selection by the training reward on the validation items
    assert set(result["selection"]["scores"]) == {"checkpoint-1", "checkpoint-2"}
    best = Path(result["selection"]["checkpoint"])
    assert best.is_dir()
    assert sum(vision_calls) >= 4  # training and selection captioned charts, not numbers

    # 4. caption the test split with the selected checkpoint (charts, the training prompt) and the untrained model
    caps = {"lineuprl": tmp_path / "caps" / "lineuprl.jsonl", "untuned": tmp_path / "caps" / "untuned.jsonl"}
    assert main(["caption", f"captioner={best}", "max_new_tokens=8", f"out={caps['lineuprl']}", "limit=null"]) == 0
    assert main(["caption", "captioner=tiny-qwen2.5-vl", "input=chart", f"prepared={prep}", "max_new_tokens=8",
                 f"out={caps['untuned']}", "limit=null"]) == 0
    written = [json.loads(line) for line in caps["lineuprl"].read_text().splitlines()]
    assert len(written) == manifest["counts"]["test"]["prepared"] and all(r["input"] == "chart" for r in written)
    assert all(len(r["next"]) == 4 for r in written)  # the forecasting target travels with the caption

    # 5. the paper's evaluation: held-out verifiers (code-checked claims + the served model), the training
    #    verifier in its own column, entailment, Table 3, bottleneck with p-values -> tables
    paper = tmp_path / "paper"
    served_spec = f"openai:{llama_server.base_url}#{served_id}"
    assert main(["eval", "paper", f"prepared={prep}", f"captions=[lineuprl={caps['lineuprl']},untuned={caps['untuned']}]",
                 f"verifiers=[claims=claims:rules,smol={served_spec}]", f"train_verifier={served_spec}", "k=2",
                 "reference=lineuprl", "identify.modes=[letter]", f"entail.backend={served_spec}",
                 "bottleneck.seeds=[0,1]", "bottleneck.max_epochs=30", "bottleneck.tasks=[forecast]",
                 f"reward.runs=[{run}]", "limit=2", "identify.controls=false", f"--out={paper}"]) == 0
    ident = json.loads((paper / "identification" / "summary.json").read_text())
    row = next(r for r in ident["rows"] if r["system"] == "lineuprl")
    held_out = [row[f"c2s[{v}]"] for v in ("claims", "smol")]
    assert row["c2s"] == pytest.approx(sum(held_out) / 2, abs=1e-3)  # the training verifier is not in the mean
    assert "c2s[train]" in row
    for table in ("entailment", "reward-accuracy", "bottleneck", "bottleneck-pvalues"):
        assert (paper / table / "table.md").is_file(), table
    assert (paper / "paper.md").is_file()
    assert main(["report", str(paper), f"--out={tmp_path / 'report'}"]) == 0
