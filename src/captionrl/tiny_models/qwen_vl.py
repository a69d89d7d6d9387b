"""Tiny Qwen2.5-VL and Qwen3-VL models for CPU rehearsals of the paper configs and tests: NOT trained models.

The paper configs train Qwen2.5-VL / Qwen3-VL policies, whose processors (dynamic resolution: an image
becomes ``(h/patch) * (w/patch) / merge**2`` ``<|image_pad|>`` tokens), chat templates and multimodal
rotary positions differ from the SmolVLM-shaped ``tiny-vlm`` (``captionrl.tiny_models.vlm``). No package ships their weights
offline, so this module assembles both families locally from transformers' own classes:

- tokenizer: a real ``Qwen2Tokenizer`` (Qwen's byte-level BPE with its pre-tokenizer regex) whose merges are
  trained here, with ``tokenizers``, on a few KB of generated caption-like text, plus the family's special
  tokens (``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, ``<|vision_start|>``, ``<|image_pad|>``, ...);
- processor: the real ``Qwen2_5_VLProcessor`` / ``Qwen3VLProcessor`` with the family's image processor
  (``Qwen2VLImageProcessorPil``: patch 14 for Qwen2.5-VL, 16 for Qwen3-VL, merge 2, temporal patch 2, as in
  the released models) limited to small images (``max_pixels``), so a 64x64 image yields 4 image tokens; the
  family's chat template (below, as a string constant). The family's video processor needs torchvision;
  where torchvision does not import (this project's CPU machines) the processor is the real class without
  its video sub-processor, see ``processor_class``;
- model: ``Qwen2_5_VLForConditionalGeneration`` / ``Qwen3VLForConditionalGeneration`` with 2 text layers,
  hidden 64 and a 2-block vision tower of width 32, randomly initialised (seeded): it writes random tokens,
  and is only meant to prove that every joint (processor, template, TRL collation, generation) works.

Each is saved once under ``captionrl.embedded.cache_dir()/models`` and loads with ``AutoProcessor`` and
``AutoModelForImageTextToText`` like a released checkpoint (``hf`` backend and policy names
``tiny-qwen2.5-vl`` / ``tiny-qwen3-vl``). Same seed -> same weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from captionrl.tiny_models.save import cached_tiny_model, save_tiny_model

TINY_QWEN_VL_VERSION = 2
"""Bump when the recipe changes so stale cached folders are rebuilt, not reused."""

FAMILIES = ("qwen2.5-vl", "qwen3-vl")
"""The families this module builds; ``tiny-<family>`` is the backend / policy name of each."""

SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
]
"""Qwen2.5's special tokens, in the family's order (ids follow the BPE vocabulary, as in the released ones)."""

EXTRA_TOKENS = {
    "qwen2.5-vl": ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                   "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"],
    "qwen3-vl": ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                 "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
                 "<think>", "</think>"],
}
"""The family's added (non-special) tokens, so tool/thinking markup tokenizes as in the released models."""

# Follows the family's published chat template (Qwen2-VL / Qwen2.5-VL Instruct ``chat_template.json``):
# a default system turn, ChatML turns, and ``<|vision_start|><|image_pad|><|vision_end|>`` per image part
# (the processor expands the one ``<|image_pad|>`` to the image's token count).
QWEN2_5_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}"
    "{% endif %}"
    "{% endfor %}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Follows the family's published chat template (Qwen3-VL Instruct ``chat_template.json``): no default
# system turn, content parts rendered by one macro (images and videos as vision_start/pad/end), tool
# declarations in the system turn, tool calls and tool responses in ChatML turns.
QWEN3_VL_CHAT_TEMPLATE = (
    "{%- set image_count = namespace(value=0) %}"
    "{%- set video_count = namespace(value=0) %}"
    "{%- macro render_content(content, do_vision_count) %}"
    "{%- if content is string %}{{- content }}"
    "{%- else %}{%- for item in content %}"
    "{%- if 'image' in item or 'image_url' in item or item.type == 'image' %}"
    "{%- if do_vision_count %}{%- set image_count.value = image_count.value + 1 %}{%- endif %}"
    "{%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif 'video' in item or item.type == 'video' %}"
    "{%- if do_vision_count %}{%- set video_count.value = video_count.value + 1 %}{%- endif %}"
    "{%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{%- elif 'text' in item %}{{- item.text }}"
    "{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{%- endmacro %}"
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- render_content(messages[0].content, false) + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- else %}"
    "{%- if messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + render_content(messages[0].content, false) + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + render_content(message.content, true) + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + render_content(message.content, true) }}"
    "{%- if message.tool_calls %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if (loop.first and message.content) or (not loop.first) %}{{- '\\n' }}{%- endif %}"
    "{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + tool_call.name + '\", \"arguments\": ' }}"
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}"
    "{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + render_content(message.content, true) + '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

CHAT_TEMPLATES = {"qwen2.5-vl": QWEN2_5_VL_CHAT_TEMPLATE, "qwen3-vl": QWEN3_VL_CHAT_TEMPLATE}

PATCH_SIZE = {"qwen2.5-vl": 14, "qwen3-vl": 16}
"""The released models' vision patch size; merge size 2 and temporal patch 2 are the same in both."""


def _tokenizer_corpus() -> list[str]:
    """~40 KB of deterministic caption-like text (shapes, colours, counts, chart words, digits, chat roles)."""
    colours = ["red", "green", "blue", "yellow", "purple", "orange", "black", "white", "grey", "brown"]
    shapes = ["circle", "square", "triangle", "star", "line", "bar", "dot", "curve", "peak", "trough"]
    places = ["top left", "top right", "bottom left", "bottom right", "centre", "middle", "edge"]
    verbs = ["rises", "falls", "stays flat", "peaks", "drops", "grows", "shrinks", "repeats", "spikes"]
    lines = [
        "system user assistant You are a helpful assistant. Describe this image. Describe the chart in one "
        "paragraph. Write a caption. Which series does the caption describe? Answer with one letter.",
    ] * 20
    for i in range(240):
        c, s, p, v = colours[i % 10], shapes[(i * 3) % 10], places[(i * 5) % 7], verbs[(i * 7) % 9]
        lines.append(
            f"The image shows {i % 7 + 1} {c} {s}s in the {p}. The series {v} from {i * 13 % 100}.{i % 10} "
            f"to {i * 29 % 1000} at step {i % 64}, then {verbs[(i + 4) % 9]}. "
            f"A chart with a {c} {shapes[(i + 1) % 10]} and the word '{s.upper()}'."
        )
    return lines


def build_tokenizer(family: str, *, vocab_size: int = 1024) -> Any:
    """A real ``Qwen2Tokenizer`` for ``family``: byte-level BPE merges trained here, the family's specials.

    The BPE is trained with Qwen's own pre-tokenizer (regex split + byte-level), so text splits exactly as
    the released tokenizer splits it (digits one by one); only the merges differ (~280 learned on generated
    text, so ~530 BPE tokens: the corpus runs out before ``vocab_size``). Special tokens follow the
    vocabulary in the family's order.
    """
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    bpe.train_from_iterator(_tokenizer_corpus(), trainer=trainer)
    state = json.loads(bpe.to_str())["model"]
    vocab: dict[str, int] = state["vocab"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["merges"]]
    # <|endoftext|> first (the constructor adds it), then the other specials in the family's order; the
    # Instruct models end a turn with <|im_end|>, so that is the eos token (as in their tokenizer config).
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=None, bos_token=None,
                         eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[1:]})
    tok.add_tokens(EXTRA_TOKENS[family])
    tok.eos_token = "<|im_end|>"
    tok.chat_template = CHAT_TEMPLATES[family]
    tok.model_max_length = 32768
    return tok


def tiny_qwen_vl_recipe(
    family: str, *, seed: int = 0, hidden: int = 64, layers: int = 2, vision_hidden: int = 32,
    vision_layers: int = 2, max_image_tokens: int = 16,
) -> dict[str, Any]:
    """The settings that define one tiny model; saved beside it as ``captionrl_fixture.json``.

    ``max_image_tokens`` bounds an image's ``<|image_pad|>`` count (the processor's ``max_pixels`` is
    ``max_image_tokens * (patch * merge)**2``); the floor is the family's ``min_pixels`` rule at 4 tokens.
    """
    from captionrl.errors import ConfigError

    if family not in FAMILIES:
        raise ConfigError("family", family, f"is not one of {', '.join(FAMILIES)}", "use qwen2.5-vl or qwen3-vl")
    if hidden % 16 or hidden < 32:
        raise ConfigError("hidden", hidden, "must be a multiple of 16 and >= 32 (4 heads, rotary sections)",
                          "use e.g. hidden=64")
    if vision_hidden % 16 or max_image_tokens < 4:
        raise ConfigError("vision_hidden/max_image_tokens", (vision_hidden, max_image_tokens),
                          "vision_hidden must be a multiple of 16 and max_image_tokens >= 4",
                          "use e.g. vision_hidden=32, max_image_tokens=16")
    return {
        "fixture": f"captionrl tiny {family} (randomly initialised, offline tokenizer); NOT a model",
        "family": family,
        "version": TINY_QWEN_VL_VERSION,
        "seed": seed,
        "hidden": hidden,
        "layers": layers,
        "vision_hidden": vision_hidden,
        "vision_layers": vision_layers,
        "patch_size": PATCH_SIZE[family],
        "merge_size": 2,
        "temporal_patch_size": 2,
        "max_image_tokens": max_image_tokens,
    }


def tiny_qwen_vl_dir(family: str = "qwen2.5-vl", *, seed: int = 0, rebuild: bool = False, **recipe: Any) -> Path:
    """Folder of the tiny ``family`` model, built on first use (a few seconds) and cached; loads like a hub one."""
    spec = tiny_qwen_vl_recipe(family, seed=seed, **recipe)
    name = (f"tiny-{family}-v{TINY_QWEN_VL_VERSION}-s{seed}-h{spec['hidden']}-l{spec['layers']}"
            f"-vh{spec['vision_hidden']}-vl{spec['vision_layers']}-t{spec['max_image_tokens']}")
    return cached_tiny_model(name, lambda target: build_tiny_qwen_vl(target, spec), rebuild)


def _model_config(spec: dict[str, Any], tok: Any) -> Any:
    """The family's composite config at tiny sizes; special-token ids are those of our tokenizer."""
    family, h, vh = spec["family"], spec["hidden"], spec["vision_hidden"]
    ids = {
        "image_token_id": tok.convert_tokens_to_ids("<|image_pad|>"),
        "video_token_id": tok.convert_tokens_to_ids("<|video_pad|>"),
        "vision_start_token_id": tok.convert_tokens_to_ids("<|vision_start|>"),
        "vision_end_token_id": tok.convert_tokens_to_ids("<|vision_end|>"),
    }
    head_dim = h // 4
    # Multimodal rotary sections (temporal, height, width) must sum to head_dim / 2, as 16+24+24 of 128 do
    # in the released models; at head_dim 16 this gives 2+3+3.
    quarter = head_dim // 8
    mrope = [head_dim // 2 - 2 * quarter * 3 // 2, quarter * 3 // 2, quarter * 3 // 2]
    text = {
        "vocab_size": len(tok), "hidden_size": h, "intermediate_size": 2 * h, "num_hidden_layers": spec["layers"],
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": mrope},
        "bos_token_id": tok.convert_tokens_to_ids("<|endoftext|>"), "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id, "tie_word_embeddings": True,
    }
    vision = {
        "depth": spec["vision_layers"], "hidden_size": vh, "intermediate_size": 2 * vh, "num_heads": 2,
        "patch_size": spec["patch_size"], "spatial_merge_size": spec["merge_size"],
        "temporal_patch_size": spec["temporal_patch_size"], "out_hidden_size": h,
    }
    if family == "qwen2.5-vl":
        from transformers import Qwen2_5_VLConfig

        vision["fullatt_block_indexes"] = [spec["vision_layers"] - 1]  # the released models: every 8th block
        vision["window_size"] = 2 * spec["patch_size"] * spec["merge_size"]
        config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True, **ids)
        config.architectures = ["Qwen2_5_VLForConditionalGeneration"]
    else:
        from transformers import Qwen3VLConfig

        text["head_dim"] = head_dim
        vision["num_position_embeddings"] = 64  # an 8x8 learned grid, interpolated to each image's patch grid
        vision["deepstack_visual_indexes"] = [0]
        config = Qwen3VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True, **ids)
        config.architectures = ["Qwen3VLForConditionalGeneration"]
    return config


def processor_class(family: str) -> Any:
    """The family's processor class: the real one, or (without torchvision) its image-only subclass.

    transformers 5 gives ``Qwen2_5_VLProcessor`` / ``Qwen3VLProcessor`` a video sub-processor that needs
    torchvision; without it neither class can be built nor loaded by ``AutoProcessor`` ("type object
    'VIDEO_PROCESSOR_MAPPING' has no attribute '_extra_content'"), even for images only. torchvision's
    PyPI wheels are CUDA builds that fail to import next to a CPU torch ("operator torchvision::nms does
    not exist"), so a CPU-only machine gets ``<Class>ImageOnly``: the real class with the video
    sub-processor left out (same ``__name__``, so what it saves names the real class). Every image and
    text method (chat template, ``<|image_pad|>`` expansion by ``image_grid_thw``, ``model_input_names``)
    is the real class's own; a call with videos raises ``DataError``.
    """
    from transformers import Qwen2_5_VLProcessor, Qwen3VLProcessor

    real = Qwen2_5_VLProcessor if family == "qwen2.5-vl" else Qwen3VLProcessor
    if _torchvision_works():
        return real
    register_image_only_processors()
    return _IMAGE_ONLY[real.__name__]


def _torchvision_works() -> bool:
    """True when torchvision imports (installed is not enough: a CUDA wheel next to CPU torch fails)."""
    from transformers.utils import is_torchvision_available

    if not is_torchvision_available():
        return False
    try:
        import torchvision  # noqa: F401
    except (ImportError, RuntimeError, OSError):  # pragma: no cover - a CUDA wheel beside CPU torch fails here
        return False
    return True


_IMAGE_ONLY: dict[str, Any] = {}


def register_image_only_processors() -> None:
    """Make ``AutoProcessor`` load Qwen-VL folders without torchvision (see ``processor_class``).

    Registers the image-only subclasses for the Qwen2.5-VL and Qwen3-VL configs, so a folder whose
    ``processor_class`` names the real class (a released checkpoint) or the subclass (this module's
    tiny models, checkpoints trained from them) loads. Does nothing where torchvision works. Idempotent.
    """
    if _IMAGE_ONLY or _torchvision_works():
        return
    from transformers import (
        AutoProcessor,
        Qwen2_5_VLConfig,
        Qwen2_5_VLProcessor,
        Qwen3VLConfig,
        Qwen3VLProcessor,
    )

    for config_class, real in ((Qwen2_5_VLConfig, Qwen2_5_VLProcessor), (Qwen3VLConfig, Qwen3VLProcessor)):

        def __init__(self: Any, image_processor: Any = None, tokenizer: Any = None, chat_template: Any = None,
                     _real: Any = real, **kwargs: Any) -> None:
            # The real __init__ passes (image_processor, tokenizer, None); ProcessorMixin pairs positional
            # arguments with this signature's sub-processors, so the absent video processor is dropped.
            _real.__init__(self, image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

        def __call__(self: Any, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            if kwargs.get("videos") is not None:  # ProcessorMixin would skip them silently, unexpanded
                from captionrl.errors import DataError

                raise DataError("videos", f"{len(kwargs['videos'])} video(s)", f"{_real.__name__} is loaded "
                                "without its video processor (torchvision does not import here)",
                                "pass images (e.g. frames as images), or install a torchvision that imports")
            return _real.__call__(self, *args, **kwargs)

        # Same __name__ as the real class: saved folders name the real class (processor_config.json,
        # tokenizer_config.json), so they load as released checkpoints do wherever torchvision works.
        image_only = type(real.__name__, (real,), {
            "__init__": __init__, "__call__": __call__, "__module__": __name__,
            "__qualname__": f"{real.__name__}ImageOnly",
        })
        _IMAGE_ONLY[real.__name__] = image_only
        AutoProcessor.register(config_class, image_only, exist_ok=True)
    # A folder that names the real class (released checkpoints) resolves by name before the config mapping:
    # point those names at the image-only classes too.
    import transformers.models.auto.processing_auto as processing_auto

    original = processing_auto.processor_class_from_name
    if not getattr(original, "_captionrl_image_only", False):

        def processor_class_from_name(class_name: str) -> Any:
            return _IMAGE_ONLY.get(class_name) or original(class_name)

        processor_class_from_name._captionrl_image_only = True  # type: ignore[attr-defined]
        processing_auto.processor_class_from_name = processor_class_from_name


def _processor(spec: dict[str, Any], tok: Any) -> Any:
    """The family's real processor class with its image (and, for Qwen3-VL, video) processor, small images."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    factor = spec["patch_size"] * spec["merge_size"]
    sizes: dict[str, Any] = {
        "patch_size": spec["patch_size"], "merge_size": spec["merge_size"],
        "temporal_patch_size": spec["temporal_patch_size"],
        "min_pixels": 4 * factor * factor, "max_pixels": spec["max_image_tokens"] * factor * factor,
    }
    if spec["family"] == "qwen3-vl":  # Qwen3-VL normalises with mean = std = 0.5, Qwen2.5-VL with CLIP's
        sizes.update(image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    image_processor = Qwen2VLImageProcessorPil(**sizes)
    cls = processor_class(spec["family"])
    kwargs: dict[str, Any] = {}
    if _torchvision_works():  # the real class requires its video processor (torchvision-based)
        from transformers import Qwen2VLVideoProcessor, Qwen3VLVideoProcessor

        video_class = Qwen2VLVideoProcessor if spec["family"] == "qwen2.5-vl" else Qwen3VLVideoProcessor
        kwargs["video_processor"] = video_class(**sizes)
    return cls(image_processor=image_processor, tokenizer=tok, chat_template=CHAT_TEMPLATES[spec["family"]],
               **kwargs)


def build_tiny_qwen_vl(target: Path, spec: dict[str, Any]) -> Path:
    """Assemble, save and return the tiny model described by ``spec`` (see ``tiny_qwen_vl_recipe``)."""
    import torch

    tok = build_tokenizer(spec["family"])
    config = _model_config(spec, tok)
    torch.manual_seed(spec["seed"])
    if spec["family"] == "qwen2.5-vl":
        from transformers import Qwen2_5_VLForConditionalGeneration as Model
    else:
        from transformers import Qwen3VLForConditionalGeneration as Model
    model = Model(config)
    processor = _processor(spec, tok)
    gen = model.generation_config
    gen.eos_token_id = [tok.eos_token_id, tok.pad_token_id]  # <|im_end|>, <|endoftext|>, as released
    gen.pad_token_id = tok.pad_token_id
    gen.bos_token_id = config.text_config.bos_token_id

    return save_tiny_model(target, model, processor, spec)
