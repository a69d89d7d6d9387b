"""Every paper config (configs/*-paper.yaml) loads, validates and resolves its TRL trainer arguments,
without loading a model: a renamed field, a dropped setting or a value TRL rejects fails here, not on
the first GPU hour."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from captionrl.train.common import cuda_available, trainer_args

ROOT = Path(__file__).resolve().parents[1]
PAPER = sorted((ROOT / "configs").glob("*-paper.yaml"))
# Settings that only make sense on the paper's GPUs; on a CPU machine they are switched off to resolve.
CPU_OVERRIDES = ["train.use_cpu=true", "train.bf16=false", "train.gradient_checkpointing=false", "train.use_vllm=false"]
# TrainConfig fields whose TRL argument has another name or form (checked separately or not a TRL field).
NOT_TRL = {"algorithm", "out_dir", "threads", "resume", "report_to", "seed"}


def _loader(path: Path):
    from captionrl.config import load_config
    from captionrl.train import lineup, moco, rubicap

    module = {"lineup": lineup, "rubicap": rubicap, "moco": moco}[path.stem.split("-")[0]]
    return lambda p, overrides=(): load_config(module.CONFIG, p, overrides)


def test_there_is_a_paper_config_per_recipe():
    assert {p.stem for p in PAPER} == {"lineup-paper", "rubicap-paper", "moco-paper"}


@pytest.mark.parametrize("path", PAPER, ids=[p.stem for p in PAPER])
def test_paper_config_loads_validates_and_resolves_trainer_args(path, monkeypatch):
    monkeypatch.setenv("CAPTIONRL_FORBID_MODEL_CALLS", "1")  # resolving must not touch a model
    raw = yaml.safe_load(path.read_text())
    load = _loader(path)
    cfg = load(path)  # as written: every field known and valid
    for key, value in raw["train"].items():
        assert getattr(cfg.train, key) == value, key
    gpu_only = [] if cuda_available() else CPU_OVERRIDES
    resolved = load(path, gpu_only).train
    args = trainer_args(resolved, seed=cfg.seed)
    expected_cls = {"rloo": "RLOOConfig", "grpo": "GRPOConfig"}[raw["train"]["algorithm"]]
    assert type(args).__name__ == expected_cls
    changed = {o.split("=")[0].removeprefix("train.") for o in gpu_only}
    for key, value in raw["train"].items():  # every paper setting reaches TRL unchanged
        if key in NOT_TRL or key in changed:
            continue
        assert getattr(args, key) == value, (key, getattr(args, key), value)
    assert args.beta == resolved.beta and args.num_generations == raw["train"]["num_generations"]
    assert Path(args.output_dir) == Path(raw["train"]["out_dir"]) / "checkpoints"
    assert args.seed == (raw["train"].get("seed") or raw.get("seed", 0))
