"""A tiny, randomly initialised SmolLM2-shaped policy for training-mechanics tests: a fixture, NOT a model.

The training tests check mechanics (every trainable parameter moves, resume continues the run, logged
rewards are the reward function's, a patched pass gives TRL's update, a timing breakdown adds up). None of
that needs a model that writes English, yet on the real 135M policy each such test writes ~2 GB of
checkpoints and spends most of its time in the policy's forward and backward passes. As TRL's own tests
do with ``trl-internal-testing/tiny-*`` models, this module builds a tiny model of the same family:

- tokenizer: the embedded SmolLM2-135M-Instruct tokenizer, unchanged (chat template, special tokens and
  digit-by-digit tokenisation stay real, so prompts and completions tokenise as in a real run);
- model: ``LlamaForCausalLM`` with SmolLM2's own config (vocabulary, rotary base, tied embeddings, special
  token ids) shrunk to 2 layers of width 64, randomly initialised from ``seed``: it writes random tokens.

Saved once under ``captionrl.embedded.cache_dir()/models`` (~13 MB), it loads from its folder like any HF
checkpoint (``policy.model=<folder>``). Same seed -> same weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from captionrl.tiny_models.save import cached_tiny_model, save_tiny_model

TINY_LLAMA_VERSION = 1
"""Bump when the recipe changes so stale cached folders are rebuilt, not reused."""


def tiny_llama_recipe(*, seed: int = 0, hidden: int = 64, layers: int = 2, heads: int = 4,
                      kv_heads: int = 2) -> dict[str, Any]:
    """The settings that define one tiny policy; saved beside it as ``captionrl_fixture.json``."""
    from captionrl.errors import ConfigError

    if hidden % heads or heads % kv_heads:
        raise ConfigError("hidden/heads/kv_heads", (hidden, heads, kv_heads),
                          "hidden must be a multiple of heads, and heads a multiple of kv_heads",
                          "use e.g. hidden=64, heads=4, kv_heads=2")
    return {
        "fixture": "captionrl tiny Llama (SmolLM2 tokenizer, randomly initialised 2-layer model); NOT a model",
        "version": TINY_LLAMA_VERSION,
        "seed": seed,
        "hidden": hidden,
        "layers": layers,
        "heads": heads,
        "kv_heads": kv_heads,
    }


def tiny_llama_dir(*, seed: int = 0, rebuild: bool = False, **recipe: Any) -> Path:
    """Folder of the tiny policy, built on first use (about a second after the embedded model) and cached."""
    spec = tiny_llama_recipe(seed=seed, **recipe)
    name = (f"tiny-llama-smollm2-v{TINY_LLAMA_VERSION}-s{seed}-h{spec['hidden']}-l{spec['layers']}"
            f"-a{spec['heads']}-kv{spec['kv_heads']}")
    return cached_tiny_model(name, lambda target: build_tiny_llama(target, spec), rebuild)


def build_tiny_llama(target: Path, spec: dict[str, Any]) -> Path:
    """Assemble, save and return the tiny policy described by ``spec`` (see ``tiny_llama_recipe``)."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

    from captionrl.embedded import embedded_model_dir

    source = embedded_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(source)
    config = AutoConfig.from_pretrained(source)  # SmolLM2's own: vocabulary, rotary base, tied embeddings
    h = spec["hidden"]
    config.hidden_size, config.intermediate_size = h, 2 * h
    config.num_hidden_layers, config.num_attention_heads = spec["layers"], spec["heads"]
    config.num_key_value_heads, config.head_dim = spec["kv_heads"], h // spec["heads"]
    config.dtype = "float32"
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(spec["seed"])
    model = LlamaForCausalLM(config)
    return save_tiny_model(target, model, tokenizer, spec)
