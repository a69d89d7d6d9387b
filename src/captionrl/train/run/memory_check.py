"""A recipe config -> its GPU memory plan (``captionrl.memory_plan``), for ``captionrl plan`` and for the
check a training run on CUDA makes before anything loads.

The plan's inputs are read from the same config the run reads: the policy (model, dtype, LoRA), the train
section (batch, lengths, KL weight, checkpointing, vLLM share and context) and, per recipe, what makes a
prompt long (LineupRL's chart or printed numbers, an image's tokens, MoCo's momentum and its Generator and
Judge). What the config cannot say is an assumption the plan prints: the image size of an image data set
(``IMAGE_SIZE`` unless given) and the allowances below.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from captionrl.errors import ConfigError
from captionrl.memory_plan import (
    GIB,
    MemoryPlan,
    Momentum,
    Parallel,
    PlanInputs,
    VllmShare,
    model_shape,
    plan,
)

logger = logging.getLogger(__name__)

CONFIG_RECIPES = {"LineupConfig": "lineup", "RubicapConfig": "rubicap", "MocoConfig": "moco",
                  "MocoSFTConfig": "moco-sft", "SFTRunConfig": "sft"}

TEXT_TOKENS = 256
"""Allowance (ours) for a Policy prompt's chat template and instruction: the recipes' instructions are one
or two sentences."""
ROLE_TEXT_TOKENS = 1024
"""Allowance (ours) for the MoCo Generator's and Judge's instructions (appendix A.1.2-A.1.3 prompts, about
a page each)."""
TOKENS_PER_VALUE_EXTRA = 5
"""Printed numbers: sign, up to 3 integer digits, the point, the decimals, comma and space, one token each
(Qwen and SmolLM2 tokenizers split digits): precision + 5 tokens per value (an allowance)."""
JUDGE_BATCH = 8
"""Captions the MoCo Judge decodes at once (``train.moco.momentum_roles``' ``batch_size``)."""
IMAGE_SIZE = (1024, 1024)
"""The image an image recipe's plan assumes when none is given: one megapixel (PixMo-Cap and DenseFusion
images vary; the processors allow up to 16,384 tokens per image, see ``--image-size``)."""


def named_accelerate_config(path: str | Path) -> str | None:
    """The accelerate config a preset's launch line names (``--config_file PATH`` in its comments), found
    relative to the working directory or to the preset's repository; ``None`` when it names none."""
    text = Path(path).read_text(encoding="utf-8")
    m = re.search(r"--config_file\s+(\S+\.ya?ml)", text)
    if not m:
        return None
    for base in (Path.cwd(), Path(path).resolve().parent.parent):
        if (base / m.group(1)).is_file():
            return str(base / m.group(1)) if base != Path.cwd() else m.group(1)
    return m.group(1)


def _image_tokens(shape: Any, size: tuple[int, int]) -> int:
    return shape.image_tokens(*size) if shape.is_vlm else 0


def _policy_model(policy: Any) -> str:
    """The policy's model as the plan reads it: a local folder (tiny and embedded models resolved) or a hub id."""
    from captionrl.backends.hf import resolve_model_path

    if Path(policy.model).expanduser().is_dir() or (policy.model.count("/") == 1 and not Path(policy.model).exists()):
        return policy.model
    return resolve_model_path(policy.model)[0]


def plan_inputs(recipe: str, cfg: Any, *, parallel: Parallel, gpu_gib: float,
                served: Sequence[tuple[str, float]] = (), image_size: tuple[int, int] | None = None,
                in_use_gib: float = 0.0, label: str | None = None) -> PlanInputs:
    """The plan's inputs for ``cfg`` of ``recipe`` on ``parallel``'s GPUs of ``gpu_gib`` each."""
    pol, t = cfg.policy, cfg.train
    model = _policy_model(pol)
    shape = model_shape(model, pol.trust_remote_code)
    notes: list[str] = []
    dtype = pol.dtype if pol.dtype != "auto" else "float32"  # auto keeps trained weights float32 (devices.resolve_dtype)
    bf16 = t.bf16 if t.bf16 is not None else True
    ckpt = t.gradient_checkpointing if t.gradient_checkpointing is not None else True
    targets = pol.lora_target_modules if isinstance(pol.lora_target_modules, str) else tuple(pol.lora_target_modules)
    size = image_size or IMAGE_SIZE
    image_tokens = 0
    longest = 0
    vllm = None
    momentum = None
    role_kv: tuple[tuple[str, int, int], ...] = ()
    if recipe in ("sft", "moco-sft"):
        if shape.is_vlm:
            image_tokens = _image_tokens(shape, size)
            notes.append(f"images assumed {size[0]}x{size[1]} px: {image_tokens:,} tokens each "
                         f"(the processor allows up to {shape.max_image_tokens():,})")
        prompt, completion, reference = t.max_length, 0, False
        notes.append(f"every row taken as train.max_length={t.max_length:,} tokens (a batch is padded to its longest row)")
    else:
        completion, reference = t.max_completion_length, bool(t.beta)
        if recipe == "lineup":
            chart = pol.input == "chart" or (pol.input == "auto" and shape.is_vlm)
            if chart:
                w, h = cfg.data.chart_size
                image_tokens = _image_tokens(shape, (w, h))
                prompt = image_tokens + TEXT_TOKENS
                notes.append(f"chart {w}x{h} px: {image_tokens:,} image tokens; + {TEXT_TOKENS} tokens of instruction (allowance)")
            else:
                prompt = cfg.data.window * (cfg.data.precision + TOKENS_PER_VALUE_EXTRA) + TEXT_TOKENS
                notes.append(f"numbers: {cfg.data.window} values x {cfg.data.precision + TOKENS_PER_VALUE_EXTRA} tokens "
                             f"+ {TEXT_TOKENS} (allowances)")
        else:
            image_tokens = _image_tokens(shape, size)
            prompt = image_tokens + TEXT_TOKENS
            longest = shape.max_image_tokens() + TEXT_TOKENS
            notes.append(f"images assumed {size[0]}x{size[1]} px: {image_tokens:,} tokens each (the processor allows "
                         f"up to {shape.max_image_tokens():,}); + {TEXT_TOKENS} tokens of instruction (allowance)")
        if t.use_vllm:
            spg = t.steps_per_generation or t.gradient_accumulation_steps
            vllm = VllmShare(t.vllm_mode, t.vllm_gpu_memory_utilization, t.vllm_max_model_length,
                             t.vllm_tensor_parallel_size, t.per_device_train_batch_size * spg)
            if t.vllm_mode == "server":
                notes.append("vLLM in server mode: its GPUs are not the training GPUs (plan them as served engines)")
        if recipe == "moco":
            momentum, role_kv = _moco_parts(cfg, pol, image_tokens, completion)
    if reference and pol.lora:
        notes.append("KL reference: the base with the adapter disabled (no copy)")
    return PlanInputs(
        label=label or f"{recipe}: {pol.model}", policy=shape, parallel=parallel, gpu_gib=gpu_gib,
        weights_dtype=dtype, bf16=bf16, lora_r=pol.lora_r if pol.lora else None, lora_targets=targets,
        reference=reference, micro_batch=t.per_device_train_batch_size, accumulation=t.gradient_accumulation_steps,
        prompt_tokens=prompt,
        image_tokens=image_tokens, completion_tokens=completion, longest_prompt_tokens=longest, checkpointing=ckpt, vllm=vllm,
        served=tuple((model_shape(name), share) for name, share in served), momentum=momentum, role_kv=role_kv,
        in_use_gib=in_use_gib, notes=tuple(notes), images_vary=shape.is_vlm and recipe != "lineup")


def _moco_parts(cfg: Any, pol: Any, image_tokens: int, completion: int) -> tuple[Momentum, tuple[tuple[str, int, int], ...]]:
    """MoCo's momentum (``captionrl.momentum``: slots per variant, snapshots of the initial weights) and the
    Generator's and Judge's generation on the training GPU."""
    from captionrl.momentum import EMA, FROZEN, VARIANTS

    mcfg = cfg.momentum
    impl = mcfg.implementation if mcfg.implementation != "auto" else ("lora_adapter" if pol.lora else "full_copy")
    slots = {s for s in VARIANTS[mcfg.variant] if s in (EMA, FROZEN)}
    shared = mcfg.init == "shared"
    snapshots = 0 if (FROZEN in slots and shared) else (1 if shared or FROZEN in slots else 2)
    generator = image_tokens + (2 + cfg.rubric.n_candidates) * completion + ROLE_TEXT_TOKENS + cfg.rubric.max_new_tokens
    judge = cfg.rubric.max_new_tokens + completion + ROLE_TEXT_TOKENS + cfg.judge.max_new_tokens
    return Momentum(impl, len(slots), snapshots), (("Generator", 1, generator), ("Judge", JUDGE_BATCH, judge))


def parse_served(items: Sequence[str]) -> list[tuple[str, float]]:
    """``MODEL@SHARE`` words (a served engine on the training GPUs and its ``--gpu-memory-utilization``)."""
    out = []
    for item in items:
        name, sep, share = str(item).rpartition("@")
        try:
            value = float(share)
        except ValueError:
            value = -1.0
        if not sep or not name or not 0 < value < 1:
            raise ConfigError("served", item, "is not MODEL@SHARE with a share in (0, 1)",
                              "write e.g. served=[Qwen/Qwen2.5-14B-Instruct@0.3]")
        out.append((name, value))
    return out


# ---------------------------------------------------------------------- the run-time check
def recipe_of(cfg: Any) -> str | None:
    return CONFIG_RECIPES.get(type(cfg).__name__) or next(
        (CONFIG_RECIPES[c.__name__] for c in type(cfg).__mro__ if c.__name__ in CONFIG_RECIPES), None)


def parallel_of(args: Any) -> Parallel:
    """The ``Parallel`` of this launch: processes from ``WORLD_SIZE``, DeepSpeed's stage and offload from the
    plugin ``accelerate launch`` configured (TrainingArguments' ``deepspeed_plugin``)."""
    n = int(os.environ.get("WORLD_SIZE", "1") or 1)
    plugin = getattr(args, "deepspeed_plugin", None)
    if plugin is None:
        return Parallel(processes=n, source="this launch")
    opt = str(getattr(plugin, "offload_optimizer_device", "none") or "none")
    par = str(getattr(plugin, "offload_param_device", "none") or "none")
    return Parallel(processes=n, deepspeed=True, zero_stage=int(getattr(plugin, "zero_stage", 2) or 0),
                    offload_optimizer=opt != "none", offload_params=par != "none", source="this launch")


def check_run_memory(cfg: Any, args: Any) -> MemoryPlan | None:
    """Before a CUDA run loads anything: plan its memory on this GPU (total and what other processes
    already hold, from CUDA), log the plan, and refuse one that does not fit (``train.memory_plan: refuse``,
    the default), naming the fix; ``warn`` logs and goes on; ``off`` skips it. Nothing on CPU runs."""
    mode = getattr(cfg.train, "memory_plan", "refuse")
    recipe = recipe_of(cfg)
    if mode == "off" or recipe is None or getattr(args, "use_cpu", False):
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    device = int(os.environ.get("LOCAL_RANK", "0") or 0)
    free, total = torch.cuda.mem_get_info(device)
    inputs = plan_inputs(recipe, cfg, parallel=parallel_of(args), gpu_gib=total / GIB, in_use_gib=(total - free) / GIB,
                         image_size=None, label=f"{recipe} on this GPU")
    result = plan(inputs)
    if os.environ.get("RANK", "0") == "0":
        logger.info("memory plan (captionrl plan; train.memory_plan: refuse | warn | off):\n" + result.table())
    if not result.fits:
        if mode == "warn":
            logger.warning("memory plan: does not fit; going on (train.memory_plan: warn)")
        else:
            result.check()
    return result
