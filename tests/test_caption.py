"""``captionrl caption``: every captioner training supports, asked exactly what training asked, on a prepared
folder or the embedded corpus, resumable, and read back by ``eval bottleneck`` / ``eval identify``.

Real parts: the tiny random Qwen2.5-VL (chart input, its real processor and chat template), the embedded
SmolLM2 (numbers input), prepared folders written by ``captionrl data prepare`` from the layouts of
``test_prepare``. The backend's ``generate`` is wrapped (not replaced) to see the requests it received.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from captionrl.cli import main
from captionrl.domains.captioning import series_caption_messages
from captionrl.domains.lineup_data import LineupDataConfig, add_charts, lineup_row
from captionrl.domains.prepare import load_prepared
from captionrl.errors import ConfigError
from captionrl.types import Series
from test_prepare import run_prepare, write_saugeen


@pytest.fixture()
def seen(monkeypatch):
    """The requests every HF backend's ``generate`` receives (the real generate still runs)."""
    from captionrl.backends.hf import HFBackend

    requests: list = []
    real = HFBackend.generate

    def spy(self, reqs):
        requests.extend(reqs)
        return real(self, reqs)

    monkeypatch.setattr(HFBackend, "generate", spy)
    return requests


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _prepared(tmp_path: Path) -> Path:
    _, out = run_prepare(tmp_path, "saugeen", write_saugeen(tmp_path / "s"), length=24, horizon=6)
    return out


def _text_and_images(messages: list[dict]) -> tuple[str, list]:
    content = messages[0]["content"]
    if isinstance(content, str):
        return content, []
    return ("".join(p.get("text", "") for p in content if p.get("type") == "text"),
            [p["image"] for p in content if p.get("type") == "image"])


# ---------------------------------------------------------------------- the prompt is training's
def test_prompts_equal_the_training_rows():
    """Numbers: the very prompt of ``lineup_row``; chart: ``add_charts``' text with the chart as an image."""
    values = np.linspace(1.0, 3.0, 16) ** 2
    cfg = LineupDataConfig(window=16, normalise="zscore", precision=3, instruction="Say it in one sentence.")
    item = Series(id="x", values=values)
    row = lineup_row(cfg, item, [Series(id=f"d{i}", values=values + i) for i in range(1, 4)], k=4)
    assert series_caption_messages(values, precision=3, normalise="zscore", instruction=cfg.instruction) == row["prompt"]
    chart_row = add_charts([row], cfg.instruction)[0]
    text, images = _text_and_images(series_caption_messages(values, chart=True, instruction=cfg.instruction))
    assert text == chart_row["prompt"][0]["content"] and "Say it in one sentence." in text
    assert len(images) == 1 and images[0].size == chart_row["image"].size
    assert np.array_equal(np.asarray(images[0]), np.asarray(chart_row["image"]))  # the same rendering


def test_chart_size_is_the_configured_one_in_training_and_captioning():
    """The LineupRL authors draw 600x300 charts: training rows and `captionrl caption` draw the same size."""
    values = np.linspace(1.0, 3.0, 16)
    assert add_charts([{"series": values}], None, [600, 300])[0]["image"].size == (600, 300)
    _text, images = _text_and_images(series_caption_messages(values, chart=True, chart_size=[600, 300]))
    assert images[0].size == (600, 300)
    with pytest.raises(ConfigError) as err:
        LineupDataConfig(chart_size=[600])
    assert err.value.field == "data.chart_size"


# ---------------------------------------------------------------------- runs
@pytest.mark.slow
def test_chart_captions_with_tiny_qwen_vl_on_a_prepared_folder(tmp_path, seen):
    prep = _prepared(tmp_path)
    out = tmp_path / "vl.jsonl"
    assert main(["caption", "captioner=tiny-qwen2.5-vl", f"prepared={prep}", f"out={out}", "limit=3",
                 "max_new_tokens=6", "batch_size=2"]) == 0
    recs = _records(out)
    test = {it.id: it for it in load_prepared(prep).items["test"]}
    assert len(recs) == 3 and {r["id"] for r in recs} <= set(test)
    for r in recs:
        assert r["input"] == "chart" and r["captioner"] == "tiny-qwen2.5-vl"
        assert r["next"] == pytest.approx(test[r["id"]].meta["next"]) and len(r["next"]) == 6
        assert r["series"] == pytest.approx(test[r["id"]].values.tolist())
    assert len(seen) == 3
    for req in seen:  # every request carried a chart and no numbers (the VLM policy's training input)
        text, images = _text_and_images(req.messages)
        assert len(images) == 1 and text.startswith("The chart shows a time series of 24 values.")
        assert "," not in text.split("values.")[0]


@pytest.mark.slow
def test_numbers_run_resumes_and_feeds_bottleneck_and_identify(tmp_path, seen, monkeypatch):
    """hf:embedded on 2 embedded-corpus windows (numbers input, next written); a rerun captions nothing new
    (model calls forbidden); a bigger rerun adds only the new item; both eval loaders read the file."""
    out = tmp_path / "llm.jsonl"
    args = ["caption", "captioner=hf:embedded,dtype=float32", f"out={out}", "length=16", "horizon=4",
            "max_new_tokens=12"]
    assert main([*args, "limit=2"]) == 0
    first = _records(out)
    assert len(first) == 2 and all(r["input"] == "numbers" and len(r["next"]) == 4 and r["caption"] for r in first)
    assert len(seen) == 2
    text, images = _text_and_images(seen[0].messages)
    assert not images and text.startswith("Time series of 16 values:\n")
    monkeypatch.setenv("CAPTIONRL_FORBID_MODEL_CALLS", "1")
    assert main([*args, "limit=2"]) == 0  # nothing left to caption: no model call at all
    assert _records(out) == first
    monkeypatch.delenv("CAPTIONRL_FORBID_MODEL_CALLS")
    assert main([*args, "limit=3"]) == 0
    third = _records(out)
    new = {r["id"] for r in third} - {r["id"] for r in first}
    assert third[:2] == first and len(third) == 2 + len(new) and len(seen) == 2 + len(new) and new

    from captionrl.eval.bottleneck import BottleneckConfig, load_caption_files
    from captionrl.eval.identification import _load_caption_files

    study = load_caption_files([("llm", out)], BottleneckConfig(out=str(tmp_path / "b")))
    assert len(study.items) == len(third) and all(it.next is not None and len(it.next) == 4 for it in study.items)
    assert study.captions["llm"] == {r["id"]: r["caption"] for r in third}
    items, systems = _load_caption_files([f"llm={out}"])
    assert {it.id for it in items} == {r["id"] for r in third} and systems[0].captions == study.captions["llm"]


@pytest.mark.slow
def test_run_folders_full_weights_and_lora(tmp_path, seen):
    """A trained run's ``model/`` (full weights) and ``checkpoints/checkpoint-N`` (LoRA adapters on the run's
    base): the run's prepared folder, chart input and instruction are used without being repeated."""
    import shutil

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    from captionrl.backends.hf import resolve_model_path
    from captionrl.config import save_config
    from captionrl.train.lineup import LineupConfig

    prep = _prepared(tmp_path)
    run = tmp_path / "run"
    base = resolve_model_path("tiny-qwen2.5-vl")[0]
    shutil.copytree(base, run / "model")
    lora = get_peft_model(AutoModelForImageTextToText.from_pretrained(base),
                          LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    lora.save_pretrained(str(run / "checkpoints" / "checkpoint-1"))
    cfg = LineupConfig()
    cfg.policy.model, cfg.policy.lora = "tiny-qwen2.5-vl", True
    cfg.data.prepared, cfg.data.instruction = str(prep), "Name the peak."
    save_config(cfg, run / "config.yaml")
    outs = {}
    for name in ("model", "checkpoints/checkpoint-1"):
        outs[name] = tmp_path / f"{name.replace('/', '-')}.jsonl"
        assert main(["caption", f"captioner={run / name}", f"out={outs[name]}", "limit=2", "max_new_tokens=8",
                     "device=cpu"]) == 0
        recs = _records(outs[name])
        assert len(recs) == 2 and all(r["input"] == "chart" and len(r["next"]) == 6 for r in recs)
    assert all(_text_and_images(r.messages)[0].endswith("Name the peak.") for r in seen)
    assert all(len(_text_and_images(r.messages)[1]) == 1 for r in seen)
    a, b = (_records(p) for p in outs.values())
    assert [r["caption"] for r in a] != [r["caption"] for r in b]  # the adapters were applied
    from captionrl.commands.caption import CaptionConfig, chart_input, load_captioner

    llm = CaptionConfig(out=str(tmp_path / "x.jsonl"), captioner="hf:embedded", input="chart")
    with pytest.raises(ConfigError, match="language-only"):
        chart_input(llm, load_captioner(llm))
