"""``captionrl plan``: the GPU memory plan of a preset, before anything loads.

    captionrl plan --config configs/moco-paper.yaml --gpus 8 --gpu-memory 141
    captionrl plan --gpu-memory 80 --server 'qwen3|Qwen/Qwen3-VL-30B-A3B-Instruct|5|--max-model-len 18432'

Reads the preset as its training command would (every field validated), the accelerate config its launch
line names (ZeRO stage, offload; ``--accelerate`` to choose another, ``--accelerate none`` for one plain
process) and the policy's shape (``captionrl.memory_plan``: a local ``config.json`` or the papers' models
offline), and prints per GPU what the weights, gradients, optimizer states, reference model, momentum,
activations, vLLM's share and KV cache take, each with its formula. A plan that does not fit exits non-zero
with the fix (LoRA, offload, a smaller vLLM share, ``vllm_max_model_length``, ...); a training run on CUDA
makes the same check before it loads anything (``train.memory_plan``).

``--server NAME|MODEL|GPUS|FLAGS`` (repeatable) plans an engine the launch serves on GPUs of its own: its
weights, vLLM's profiling peak and CUDA graphs and one sequence of KV cache at its ``--max-model-len`` inside its
``--gpu-memory-utilization`` share (``memory_plan.plan_server``); the launch scripts plan every server this way
before they start any. With servers only, ``--config`` may be left out.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from captionrl.config import help_field
from captionrl.errors import ConfigError


@dataclass
class PlanConfig:
    """Settings of ``captionrl plan``."""

    preset: str = help_field("", "the run's config (a preset such as configs/lineup-paper.yaml)", flags=("--config",))
    overrides: list[str] = help_field([], "settings of the preset to change, key=value (e.g. --set policy.lora=true --set train.vllm_gpu_memory_utilization=0.2)", flags=("--set",))
    recipe: str = help_field("auto", "auto (from the config's sections), lineup, rubicap, moco, moco-sft or sft")
    gpus: int | None = help_field(None, "training GPUs, one process each (null: the accelerate config's num_processes, or 1)")
    gpu_memory: float = help_field(141.0, "memory of one GPU in GiB (H200: 141, H100: 80)")
    accelerate: str | None = help_field(None, "accelerate config of the launch (null: the one the preset's launch line names; none: one process without DeepSpeed)")
    served: list[str] = help_field([], "engines served on the training GPUs, MODEL@SHARE (vllm serve --gpu-memory-utilization SHARE), e.g. Qwen/Qwen2.5-14B-Instruct@0.3")
    servers: list[str] = help_field([], "engines the launch serves on GPUs of their own, NAME|MODEL|GPUS|FLAGS (the server's flags: --gpu-memory-utilization, --max-model-len, --tensor-parallel-size, --data-parallel-size), each planned against the card", flags=("--server",))
    image_size: list[int] | None = help_field(None, "image recipes: the width and height of a training image the plan assumes (null: 1024 1024)")
    json: bool = help_field(False, "print the plan as one JSON object")

    def __post_init__(self) -> None:
        if not self.preset and not self.servers:
            raise ConfigError("config", self.preset, "plan needs the run's config", "captionrl plan --config configs/lineup-paper.yaml")
        if self.gpus is not None and self.gpus < 1:
            raise ConfigError("gpus", self.gpus, "must be >= 1", "give the number of training GPUs, e.g. --gpus 8")
        if self.gpu_memory <= 0:
            raise ConfigError("gpu_memory", self.gpu_memory, "must be > 0 GiB", "e.g. --gpu-memory 141 (H200) or 80 (H100)")
        if self.image_size is not None and (len(self.image_size) != 2 or min(self.image_size) < 1):
            raise ConfigError("image_size", self.image_size, "must be width and height in pixels", "e.g. --image-size 1024 768")


CONFIG = PlanConfig


RECIPES = {"lineup": "captionrl.train.lineup", "rubicap": "captionrl.train.rubicap", "moco": "captionrl.train.moco",
           "moco-sft": "captionrl.train.moco_sft", "sft": "captionrl.train.sft"}
"""Recipe -> the module whose ``CONFIG`` reads its YAML."""


def detect_recipe(data: Mapping[str, Any]) -> str:
    """Which recipe a YAML mapping configures, from the sections only that recipe has."""
    section = data.get("data")
    data_section: Mapping[str, Any] = section if isinstance(section, Mapping) else {}
    if "momentum" in data or "rubric" in data or str(data.get("method", "")) in ("moco", "evolm"):
        return "moco"
    if "rubrics" in data:
        return "rubicap"
    if {"captions", "rubrics", "judgments"} & set(data_section) or data_section.get("demo"):
        return "moco-sft"
    if "verifier" in data or {"prepared", "corpus", "window"} & set(data_section):
        return "lineup"
    if "path" in data_section and "algorithm" not in (data.get("train") or {}):
        return "sft"
    raise ConfigError("recipe", "auto", "cannot tell the recipe from the config's sections",
                      f"set recipe to one of {', '.join(RECIPES)}")


def load_recipe(path: str | Path, overrides: Sequence[str] = (), recipe: str = "auto") -> tuple[str, Any]:
    """(recipe, validated config) of a preset plus ``key=value`` overrides, as the training command loads it."""
    from captionrl.config import apply_overrides, from_dict, load_yaml

    data = apply_overrides(load_yaml(path), overrides)
    name = detect_recipe(data) if recipe == "auto" else recipe
    if name not in RECIPES:
        raise ConfigError("recipe", recipe, "unknown recipe", f"use auto or one of {', '.join(RECIPES)}")
    cls = importlib.import_module(RECIPES[name]).CONFIG
    return name, from_dict(cls, data)


def make_plan(cfg: PlanConfig):  # -> MemoryPlan
    """The plan ``cfg`` asks for (no printing, no refusal): for the command and the tests."""
    from captionrl.memory_plan import Parallel, plan, read_accelerate_config
    from captionrl.train.run.memory_check import named_accelerate_config, parse_served, plan_inputs

    recipe, run_cfg = load_recipe(cfg.preset, cfg.overrides, cfg.recipe)
    launch = cfg.accelerate if cfg.accelerate is not None else named_accelerate_config(cfg.preset)
    if launch is None or launch == "none":
        parallel = Parallel(processes=cfg.gpus or 1, source="no accelerate config" if launch is None else "--accelerate none")
    else:
        parallel = read_accelerate_config(launch, cfg.gpus)
    size = (cfg.image_size[0], cfg.image_size[1]) if cfg.image_size else None
    label = f"{cfg.preset}" + (f" ({', '.join(cfg.overrides)})" if cfg.overrides else "")
    return plan(plan_inputs(recipe, run_cfg, parallel=parallel, gpu_gib=cfg.gpu_memory, served=parse_served(cfg.served),
                            image_size=size, label=label))


def run_command(cfg: PlanConfig) -> int:
    """Print the plan (with ``json``: one JSON object, the servers' plans under ``servers``); refuse (non-zero,
    with the fix) when it does not fit."""
    servers: list[dict] = []
    if cfg.servers:
        from captionrl.memory_plan import ServerSpec, plan_servers

        plans, shared = plan_servers([ServerSpec.parse(s) for s in cfg.servers], cfg.gpu_memory)
        servers = [{"server": p.spec.name, "model": p.spec.model, "gpus": list(p.spec.gpus), "gpu_gib": p.gpu_gib,
                    "fits": p.fits, "rows": [asdict(r) for r in p.rows],
                    "problems": [{"field": f, "problem": q, "fix": x} for f, q, x in p.problems]} for p in plans]
        problems = [x for p in plans for x in p.problems] + shared
        if cfg.json and (problems or not cfg.preset):
            print(json.dumps({"servers": servers, "problems": [{"field": f, "problem": q, "fix": x}
                                                               for f, q, x in shared]}, indent=2))
        elif not cfg.json:
            print("\n\n".join(p.table() for p in plans))
            for _f, problem, fix in shared:
                print(f"\n**Refused** (server): {problem}. Fix: {fix}")
        if problems:
            raise ConfigError("server", "; ".join(cfg.servers), "does not fit: " + "; ".join(p for _f, p, _x in problems),
                              "; or ".join(dict.fromkeys(x for _f, _p, x in problems)))
        if not cfg.preset:
            return 0
        if not cfg.json:
            print()
    result = make_plan(cfg)
    if cfg.json:
        print(json.dumps({"label": result.inputs.label, "gpu_gib": result.inputs.gpu_gib, "total_gib": round(result.total, 2),
                          "fits": result.fits, "rows": [asdict(r) for r in result.rows],
                          "problems": [{"field": f, "problem": p, "fix": x} for f, p, x in result.problems],
                          **({"servers": servers} if servers else {})}, indent=2))
    else:
        print(result.table())
    result.check()
    return 0
