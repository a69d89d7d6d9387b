"""Every paper config (configs/*-paper.yaml) loads, validates and resolves its TRL trainer arguments,
without loading a model: a renamed field, a dropped setting or a value TRL rejects fails here, not on
the first GPU hour."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from captionrl.errors import ConfigError
from captionrl.train.run.builder import cuda_available, trainer_args
from presets import ON_CPU

ROOT = Path(__file__).resolve().parents[1]
ALL_PAPER = sorted((ROOT / "configs").glob("*-paper.yaml"))
PAPER = [p for p in ALL_PAPER if p.stem != "moco-sft-paper"]  # the RL presets (moco-sft-paper: its own test below)
# Settings that only make sense on the paper's GPUs; on a CPU machine they are switched off to resolve.
CPU_OVERRIDES = [*ON_CPU, "train.gradient_checkpointing=false"]
# TrainConfig fields whose TRL argument has another name or form (checked separately or not a TRL field).
NOT_TRL = {"algorithm", "out_dir", "threads", "resume", "report_to", "seed"}


def _loader(path: Path):
    from captionrl.config import load_config
    from captionrl.train import lineup, moco, rubicap

    module = {"lineup": lineup, "rubicap": rubicap, "moco": moco}[path.stem.split("-")[0]]
    return lambda p, overrides=(): load_config(module.CONFIG, p, overrides)


def test_there_is_a_paper_config_per_recipe():
    assert {p.stem for p in ALL_PAPER} == {"lineup-paper", "rubicap-paper", "moco-paper", "moco-sft-paper"}


def test_moco_sft_paper_config_resolves_the_papers_sft_arguments(monkeypatch, tmp_path):
    """§4.1's SFT settings reach TRL's SFTConfig (cosine, 5% warm-up, 8 x 2), full-parameter bf16 weights
    that only DeepSpeed may train (its float32 masters), and a context long enough for a Generator row."""
    from captionrl.config import load_config
    from captionrl.train.moco_sft import MocoSFTConfig
    from captionrl.train.run.gpu_checks import check_master_weights
    from captionrl.train.sft import sft_args

    monkeypatch.setenv("CAPTIONRL_FORBID_MODEL_CALLS", "1")
    cfg = load_config(MocoSFTConfig, ROOT / "configs" / "moco-sft-paper.yaml", [] if cuda_available() else CPU_OVERRIDES[:2])
    args = sft_args(cfg, tmp_path)
    assert (args.lr_scheduler_type.value, args.warmup_steps) == ("cosine", 0.05)
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (8, 2)
    assert cfg.policy.lora is False and cfg.policy.dtype == "bfloat16" and args.max_length >= 8192
    with pytest.raises(ConfigError, match="master weights"):
        check_master_weights(args, cfg.policy)  # one plain process: refused (DeepSpeed's launch is the way)


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


def _base_urls(node, path=""):
    """(config field, base_url) of every server a preset names (verifier, judge, committee, eval verifiers)."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "base_url" and isinstance(v, str):
                yield path or "(top)", v
            else:
                yield from _base_urls(v, f"{path}.{k}" if path else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _base_urls(v, f"{path}[{i}]")


@pytest.mark.parametrize("path", PAPER, ids=[p.stem for p in PAPER])
def test_paper_config_builds_the_intended_gpu_arguments(path, monkeypatch):
    """vLLM rollouts colocated, a server port no verifier or judge uses, bounded checkpoints, and the
    GPU checks of the run (master weights, vLLM, ports) as a GPU launch under DeepSpeed would meet them."""
    from captionrl.train.run.gpu_checks import check_master_weights, check_vllm_port, server_address

    monkeypatch.setenv("CAPTIONRL_FORBID_MODEL_CALLS", "1")
    raw = yaml.safe_load(path.read_text())
    load = _loader(path)
    cfg = load(path, ["train.use_cpu=true", "train.gradient_checkpointing=false", "train.bf16=false"])
    args = trainer_args(cfg.train, seed=cfg.seed)  # use_vllm stays on: TRL builds the config without vLLM
    # MoCo's full-parameter Policy and full-copy momentum leave no room for a colocated engine (captionrl plan):
    # its rollouts come from a vLLM server on a GPU of its own
    assert args.use_vllm is True and args.vllm_mode == ("server" if path.stem == "moco-paper" else "colocate")
    assert args.vllm_gpu_memory_utilization == 0.3
    assert args.vllm_max_model_length is not None  # never the model's whole context (Qwen3-VL: 262,144 tokens)
    assert args.save_total_limit is not None and 1 <= args.save_total_limit <= 5
    assert args.save_steps == raw["train"]["save_steps"]
    ports = {server_address(url)[1]: field for field, url in _base_urls(raw) if server_address(url)}
    assert args.vllm_server_port == 8010 and args.vllm_server_port not in ports, ports
    if path.stem != "moco-paper":
        assert {8000} <= set(ports)  # TRL's default vLLM port is the one these presets serve a model on

    servers = [(type("S", (), {"base_url": url})(), field) for field, url in _base_urls(raw)]
    server_mode = trainer_args(load(path, ["train.use_cpu=true", "train.gradient_checkpointing=false",
                                           "train.bf16=false", "train.vllm_mode=server"]).train, seed=0)
    check_vllm_port(server_mode, servers)  # switching to server mode keeps clear of every served model
    if not cfg.policy.lora:  # full fine-tune of bf16 weights: DeepSpeed's launch is the only one allowed
        assert cfg.policy.dtype == "bfloat16"
        with pytest.raises(ConfigError, match="master weights"):
            check_master_weights(args, cfg.policy)
        monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")  # what `accelerate launch` with a DEEPSPEED config sets
        if importlib.util.find_spec("deepspeed") is not None:
            check_master_weights(trainer_args(cfg.train, seed=cfg.seed), cfg.policy)
