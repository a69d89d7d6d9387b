"""The policy a recipe trains, loaded: its model and processing class, its attention kernel, its LoRA
adapters, and the CPU threads torch may use."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from captionrl.errors import ConfigError

if TYPE_CHECKING:
    from captionrl.train.run.sections import PolicyConfig


def apply_threads(threads: int | None) -> None:
    """Set torch's CPU threads when the user asked for a number (never hard-coded: the user knows the box)."""
    if threads is None:
        return
    import torch

    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)


def load_policy(policy: PolicyConfig) -> tuple[Any, Any, bool]:
    """Load the policy model and its processing class; returns (model, processing_class, is_vlm).

    A tokenizer goes to TRL for language-only policies; a ``ProcessorMixin`` switches TRL into its VLM
    path (images from the ``image`` column).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoProcessor, AutoTokenizer

    from captionrl.backends.base import check_model_calls_allowed
    from captionrl.backends.hf import resolve_model_path

    check_model_calls_allowed(f"policy:{policy.model}")
    path, gguf = resolve_model_path(policy.model)
    kw: dict[str, Any] = {"trust_remote_code": policy.trust_remote_code}
    if gguf:
        kw["gguf_file"] = gguf
    check_attn_implementation(policy.attn_implementation)
    from captionrl.devices import record_dtype, resolve_dtype

    dtype, reason = resolve_dtype(policy.dtype, "cuda" if torch.cuda.is_available() else "cpu", training=True)
    record_dtype(f"policy:{policy.model}", dtype, reason)
    config = AutoConfig.from_pretrained(path, **kw)
    is_vlm = hasattr(config, "vision_config")
    if is_vlm:
        from transformers import AutoModelForImageTextToText

        model = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype, **kw, **attn_kw(policy))
        processing = AutoProcessor.from_pretrained(path, **kw)
        tok = processing.tokenizer
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kw, **attn_kw(policy))
        processing = AutoTokenizer.from_pretrained(path, **kw)
        tok = processing
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model, processing, is_vlm


def attn_kw(policy: PolicyConfig) -> dict[str, Any]:
    """``attn_implementation`` for ``from_pretrained`` when the config names one (else transformers chooses)."""
    return {"attn_implementation": policy.attn_implementation} if policy.attn_implementation else {}


def check_attn_implementation(name: str | None) -> None:
    """FlashAttention needs its package: say so before the weights load, with both ways out."""
    import importlib.util

    if name == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        raise ConfigError("policy.attn_implementation", name, "the flash-attn package is not installed",
                          "pip install flash-attn --no-build-isolation (builds against your CUDA torch), or set "
                          "policy.attn_implementation: sdpa (the same attention; PyTorch's own fused kernels)")


def lora_config(policy: PolicyConfig) -> Any:
    """A PEFT ``LoraConfig`` for the policy, or ``None`` for full fine-tuning."""
    if not policy.lora:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=policy.lora_r, lora_alpha=policy.lora_alpha, lora_dropout=policy.lora_dropout,
        target_modules=policy.lora_target_modules, task_type="CAUSAL_LM",
    )
