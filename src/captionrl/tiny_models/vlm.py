"""A tiny SmolVLM-shaped vision-language model (``tiny-vlm``) for CPU rehearsals and tests: NOT a trained model.

No package ships vision-language weights offline, yet the image pipeline (VLM chat prompts, image
processors, ``HFBackend`` with images, TRL's GRPO trainer with a ``ProcessorMixin``) must run in tests
and in the CPU rehearsals of the image recipes (``policy.model: tiny-vlm`` in ``configs/rubicap-cpu.yaml``).
This module assembles a real Idefics3 (SmolVLM) architecture locally:

- text model: the real SmolLM2-135M-Instruct weights (the embedded model), so the text side writes
  fluent English and follows the chat template;
- vision tower + connector: a *small, randomly initialised* SigLIP-style encoder (2 layers, 64 wide,
  64x64 images, 16 px patches, pixel shuffle 2 -> 4 image tokens per image). It sees pixels but has
  learned nothing: the captions it writes do not describe the image until it is trained;
- processor: the Idefics3 image processor (no image splitting) + the SmolLM2 tokenizer with the
  image tokens added, and a ChatML template that renders ``{"type": "image"}`` parts as ``<image>``.

It is saved once under ``captionrl.embedded.cache_dir()/models`` so ``HFBackend(tiny_vlm_dir())`` and
``AutoModelForImageTextToText.from_pretrained`` load it like any HF VLM (its config has
``vision_config``). Same seed -> same weights, so tests are reproducible.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from captionrl.tiny_models.save import cached_tiny_model, save_tiny_model

TINY_VLM_VERSION = 1
"""Bump when the recipe changes so stale cached folders are rebuilt, not reused."""

IMAGE_TOKENS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"] + [
    f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)
]
"""Special tokens Idefics3's processor looks up; all are added so none maps to the unknown token."""

SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\n" + SYSTEM_PROMPT + "<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] == 'image' %}{{ '<image>' }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""SmolLM2's own ChatML format (so the text weights see the format they were tuned on), with image parts."""


def tiny_vlm_recipe(
    *, seed: int = 0, image_size: int = 64, patch_size: int = 16, vision_layers: int = 2, vision_hidden: int = 64
) -> dict[str, Any]:
    """The settings that define one tiny VLM; saved beside it as ``captionrl_fixture.json``."""
    from captionrl.errors import ConfigError

    if image_size % patch_size or (image_size // patch_size) % 2:
        raise ConfigError(
            "image_size", image_size, f"must be an even multiple of patch_size={patch_size} (pixel shuffle 2)",
            "use e.g. image_size=64, patch_size=16",
        )
    return {
        "fixture": "captionrl tiny VLM (random vision tower + SmolLM2-135M-Instruct text weights); NOT a model",
        "version": TINY_VLM_VERSION,
        "seed": seed,
        "image_size": image_size,
        "patch_size": patch_size,
        "vision_layers": vision_layers,
        "vision_hidden": vision_hidden,
        "scale_factor": 2,
    }


def tiny_vlm_dir(*, seed: int = 0, image_size: int = 64, rebuild: bool = False, **recipe: Any) -> Path:
    """Folder of the tiny VLM, built on first use (~10 s) and cached; ``HFBackend`` loads it."""
    spec = tiny_vlm_recipe(seed=seed, image_size=image_size, **recipe)
    name = f"tiny-vlm-smollm2-v{TINY_VLM_VERSION}-s{seed}-i{image_size}-p{spec['patch_size']}"
    name += f"-l{spec['vision_layers']}-h{spec['vision_hidden']}"
    return cached_tiny_model(name, lambda target: build_tiny_vlm(target, spec), rebuild)


def build_tiny_vlm(target: Path, spec: dict[str, Any]) -> Path:
    """Assemble, save and return the tiny VLM described by ``spec`` (see ``tiny_vlm_recipe``)."""
    import torch
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoTokenizer,
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3Processor,
    )
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    from captionrl.embedded import embedded_model_dir

    text_dir = embedded_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(text_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": IMAGE_TOKENS})
    tokenizer.chat_template = CHAT_TEMPLATE

    text_config = AutoConfig.from_pretrained(text_dir)
    text_config.vocab_size = len(tokenizer)
    grid = spec["image_size"] // spec["patch_size"]
    image_seq_len = (grid // spec["scale_factor"]) ** 2
    config = Idefics3Config(
        text_config=text_config.to_dict(),
        vision_config={
            "hidden_size": spec["vision_hidden"],
            "intermediate_size": 2 * spec["vision_hidden"],
            "num_hidden_layers": spec["vision_layers"],
            "num_attention_heads": 2,
            "image_size": spec["image_size"],
            "patch_size": spec["patch_size"],
        },
        scale_factor=spec["scale_factor"],
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    config.architectures = ["Idefics3ForConditionalGeneration"]
    config.text_config.tie_word_embeddings = True

    torch.manual_seed(spec["seed"])
    model = Idefics3ForConditionalGeneration(config)
    text = AutoModelForCausalLM.from_pretrained(text_dir, dtype=torch.float32)
    text_state = text.model.state_dict()
    old_vocab = text_state["embed_tokens.weight"].shape[0]
    with torch.no_grad():
        emb = text_state["embed_tokens.weight"]
        # New image tokens start at the mean embedding, so they do not derail the text model.
        grown = torch.cat([emb, emb.mean(0, keepdim=True).repeat(len(tokenizer) - old_vocab, 1)], 0)
        text_state["embed_tokens.weight"] = grown
        model.model.text_model.load_state_dict(text_state, strict=True)
    model.tie_weights()

    image_processor = Idefics3ImageProcessorPil(
        do_image_splitting=False,
        size={"longest_edge": spec["image_size"]},
        max_image_size={"longest_edge": spec["image_size"]},
    )
    processor = Idefics3Processor(
        image_processor=image_processor, tokenizer=tokenizer, image_seq_len=image_seq_len,
        chat_template=CHAT_TEMPLATE,
    )
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id

    return save_tiny_model(target, model, processor, spec)
