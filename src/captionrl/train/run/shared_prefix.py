"""Exact shared-prompt forward for GRPO/RLOO groups: each group's prompt runs once, with gradient.

The G completions of one prompt share it, yet TRL's loss pass (``_get_per_token_logps_and_entropies``)
runs every row's prompt again: in the LineupRL CPU job most of each row's tokens are prompt. Here the
batch is split one token before the completions start:

1. the distinct prompt prefixes (``input_ids[:, :P-1]`` with their attention mask) run once each through
   the model, each layer's key/value states recorded into a cache;
2. each row reads its group's recorded states (``index_select`` on the batch dimension: autograd sums each
   row's gradient back into its group's single prompt pass);
3. the last prompt token and the completions (``input_ids[:, P-1:]``) run on that cache through TRL's own
   fused LM head (``fused_lm_head=True``), so temperature, logit scaling and the entropy are TRL's.

Positions are the ones TRL's full pass uses (the cache length plus ``arange``), the attention mask is the
full row's, and the first completion token's log-prob comes from the last prompt token as before, so the
per-token log-probs and the parameter gradients equal TRL's up to float rounding (``tests/test_shared_prefix.py``
checks both on the embedded model). The idea is Prefix Grouper's (verl ``use_prefix_grouper``), which packs a
group into one sequence and splits the attention (prefix self-attention, then each completion over the prefix
and itself) inside a patched model file, one forward call; here an unmodified transformers model runs two calls
joined by its own cache argument.

Gradient checkpointing. transformers drops the cache under it: ``GradientCheckpointingLayer`` sets a
checkpointed layer's ``cache`` to ``None`` (and ``merge_with_config_defaults`` turns ``use_cache`` off),
because ``DynamicLayer.update`` appends and the layer's replay in the backward pass would append a second
time. The two caches here (:func:`_cache_layers`) are pure: the prompt pass's records the first states each
layer gives it and hands back what it is given, the completions pass's returns the recorded states joined to
the new ones and stores nothing, so a replay computes what the forward did. For the two calls the layers
get transformers' own ``_can_checkpoint_with_cache`` flag, which exists for caches a replay only reads. The
recorded states keep their autograd graph under non-reentrant checkpointing (transformers' default since 5.0);
reentrant checkpointing runs a layer under ``no_grad`` and would cut it, so it keeps TRL's pass.

Distributed runs. Each process computes its own rows' prompts, so the pass needs nothing across ranks: DDP
and DeepSpeed ZeRO-2/3 see two forward calls before one backward, which they allow (ZeRO-3 gathers a layer's
weights for each call and again for the backward). ``tests/test_shared_prefix_ranks.py`` checks equal
log-probs and every reduced, gathered gradient on 2 CPU processes under ZeRO-3 (and, in the long tier,
ZeRO-2 and DDP), with checkpointing on. Whether a loss pass holds whole groups is TRL's batching
(:func:`micro_batch_sharing`): rows are grouped by equal prompt within each call, so the pass is exact
however TRL distributes them; only what it saves changes.

Generation gets the same treatment (:func:`share_generation_prefill`): each distinct prompt is prefilled
once and its cache indexed out to the G rows, and ``generate`` continues from there.

Qwen-VL policies (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) take the same path with their images: their 3-D rope
positions depend on the whole row, so they are computed once for the full rows exactly as the model's own
full pass computes them (``compute_3d_position_ids``) and sliced for the two parts; rows are grouped by
prompt tokens *and* pixels (two charts under one instruction have the same placeholder tokens), and the
prompt part carries only the groups' images, so the vision tower also runs once per group. Generation of
VLM policies keeps ``generate``'s own prefill.

Where it is not exact or not known to be, the trainer keeps TRL's pass and the reason is recorded
(:func:`shared_prefix_reason`): vision-language models outside the Qwen-VL family, MoE aux losses,
reentrant checkpointing (TRL forces it for LoRA under ZeRO-3), FSDP, Megatron-LM and XLA runs, and one-row
loss passes. A single call goes to TRL's pass when no two of its rows share a prompt, or when the model
turns out not to take the split (a cache layout with sliding-window, linear or shared attention layers, a
layer that ran without the cache): checked before the result is used, never a wrong log-prob.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator
from typing import Any

from captionrl.compat import cache_argument, cache_kwargs, output_cache

logger = logging.getLogger(__name__)

MULTIMODAL_KEYS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes",
                   "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")
QWEN_VL_KEYS = ("pixel_values", "image_grid_thw", "num_images", "mm_token_type_ids")
"""The multimodal inputs the Qwen-VL path handles; any other one sends the call to TRL's pass."""


def shared_prefix_logps(model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int,
                        compute_entropy: bool = False, only_if_shared: bool = False) -> tuple[Any, Any, int]:
    """Per-token log-probs (and entropies) of the last ``logits_to_keep`` tokens of every row, each distinct
    prompt computed once. ``model`` must carry TRL's fused LM head (TRL adds it to the policy).

    Returns ``(logps, entropies or None, distinct prompts)``; shapes are ``(rows, logits_to_keep)``. Raises
    :class:`NotShared` where the pass cannot run (see :func:`_two_part_forward`), and with ``only_if_shared``
    before any forward when no two rows share a prompt (nothing to save).
    """
    import torch

    split = input_ids.size(1) - logits_to_keep - 1     # the prefix ends one token before the completions
    key = torch.cat([input_ids[:, :split], attention_mask[:, :split].to(input_ids.dtype)], dim=1)
    uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
    if only_if_shared and uniq.size(0) == input_ids.size(0):
        raise NotShared(NO_SHARED_PROMPT)
    tail = input_ids[:, split:]
    labels = tail.masked_fill(attention_mask[:, split:] == 0, -100)
    labels[:, 0] = -100                                  # the last prompt token is context, not a label
    out = _two_part_forward(model, inverse,
                            prefix={"input_ids": uniq[:, :split], "attention_mask": uniq[:, split:]},
                            tail={"input_ids": tail, "attention_mask": attention_mask, "labels": labels})
    entropies = out.entropy[:, -logits_to_keep:] if compute_entropy else None
    return out.log_probs[:, -logits_to_keep:], entropies, int(uniq.size(0))


NO_SHARED_PROMPT = "no two rows of the call share a prompt"


class NotShared(Exception):
    """The two-part pass cannot run on this model or call; ``reason`` says why (the caller runs TRL's pass)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _unwrap(model: Any) -> Any:
    """The model inside DDP's or DeepSpeed's wrapper (``module``)."""
    return model.module if hasattr(model, "module") else model


@functools.cache
def _cache_layers() -> tuple[type, type]:
    """The two key/value cache layers of the two-part pass (built on first use: transformers loads lazily).

    Both are pure functions of what they are given, so a gradient-checkpointed decoder layer that runs again in
    the backward pass (its replay calls ``update`` a second time) computes exactly what it computed forward:

    - ``Recorded`` keeps the first key/value states each layer hands it (the prompt pass) and returns the states
      it is given; a replay gets its own recomputed states back and changes nothing;
    - ``ReadOnly`` holds the recorded states (one row per group) and returns them indexed out to every row and
      joined to the states it is given, storing nothing (transformers' ``DynamicLayer`` appends, so a replay would
      append twice). The indexing happens inside the layer, so under checkpointing the rows' copies are recomputed
      in the backward pass, not kept: what the cache holds is one prompt per group.
    """
    import torch
    from transformers.cache_utils import DynamicLayer

    class Recorded(DynamicLayer):
        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            if not self.is_initialized:
                self.device = key_states.device
                self.keys, self.values = key_states, value_states
                self.is_initialized = True
            return key_states, value_states

    class ReadOnly(DynamicLayer):
        def __init__(self, keys: Any, values: Any, rows: Any) -> None:
            super().__init__()
            self.device = keys.device
            self.keys, self.values, self.rows = keys, values, rows
            self.is_initialized = True
            self.reads = 0

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            self.reads += 1   # index_select: autograd sums each row's gradient back into its group's prompt pass
            return (torch.cat([self.keys.index_select(0, self.rows), key_states], dim=-2),
                    torch.cat([self.values.index_select(0, self.rows), value_states], dim=-2))

    return Recorded, ReadOnly


def _recording_cache(model: Any) -> Any:
    """An empty cache of :func:`_cache_layers`' ``Recorded`` layers, one per decoder layer of ``model``."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    cache = DynamicCache(config=_unwrap(model).config)
    kinds = {type(layer).__name__ for layer in cache.layers if type(layer) is not DynamicLayer}
    if kinds or not cache.layers:
        raise NotShared(f"the model's key/value cache has {', '.join(sorted(kinds)) or 'no'} layers (sliding-window, "
                        "linear or shared attention), which the split pass does not handle")
    recorded, _ = _cache_layers()
    cache.layers = [recorded() for _ in cache.layers]
    return cache


def _read_only_cache(recording: Any, inverse: Any) -> Any:
    """The recorded prompt states, each row reading its group's (``inverse``), in a cache that the completions
    pass only reads."""
    from transformers.cache_utils import DynamicCache

    if not all(layer.is_initialized for layer in recording.layers):
        raise NotShared("the prompt pass left the key/value cache empty (the model dropped it), so the split pass "
                        "cannot run")
    _, read_only = _cache_layers()
    cache = DynamicCache()
    cache.layers = [read_only(layer.keys, layer.values, inverse) for layer in recording.layers]
    return cache


def checkpointing_reason(model: Any) -> str | None:
    """Why ``model``'s gradient checkpointing rules the split pass out, or ``None`` when it does not.

    Non-reentrant checkpointing (transformers' default since 5.0) keeps the autograd graph of everything a layer
    computes, the states it hands the cache included, and replays the layer in the backward pass: the caches of
    :func:`_cache_layers` give the replay the same states. Reentrant checkpointing runs each layer under
    ``no_grad`` and passes gradients only through the layer's positional inputs, so the prompt's cached states
    would get no gradient: the split pass is not used there."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    for module in _unwrap(model).modules():
        if isinstance(module, GradientCheckpointingLayer) and module.gradient_checkpointing:
            func = getattr(module, "_gradient_checkpointing_func", None)
            if getattr(func, "keywords", {}).get("use_reentrant") is not False:
                return ("gradient checkpointing is reentrant (use_reentrant is not False), which runs each layer "
                        "under no_grad: the prompt's cached key/value states would get no gradient")
    return None


@contextlib.contextmanager
def _cache_kept_under_checkpointing(model: Any) -> Iterator[None]:
    """Let the decoder layers keep the cache under gradient checkpointing for the two calls of the split pass.

    transformers (``GradientCheckpointingLayer``) replaces a checkpointed layer's ``cache`` with ``None`` because
    ``DynamicLayer.update`` appends and the backward replay would append again; its ``_can_checkpoint_with_cache``
    flag is for caches a replay leaves unchanged, which the two caches of :func:`_cache_layers` are. The flag is
    set on the layers' instances for these calls only (the backward replay does not consult it)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in _unwrap(model).modules() if isinstance(m, GradientCheckpointingLayer)]
    for layer in layers:
        layer._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for layer in layers:
            layer.__dict__.pop("_can_checkpoint_with_cache", None)


def _two_part_forward(model: Any, inverse: Any, prefix: dict[str, Any], tail: dict[str, Any]) -> Any:
    """The prompt pass (``prefix``: one row per group) recorded into a cache, then the completions pass (``tail``,
    every row, through TRL's fused LM head) reading it, each row on its group's states (``inverse``).

    Raises :class:`NotShared` where checkpointing is reentrant, the cache layout is not plain full attention, or
    a layer did not use the cache (a transformers version that drops it regardless): each checked before the
    result is returned, so a caller that falls back to TRL's pass never trains on a wrong log-prob."""
    reason = checkpointing_reason(model)
    if reason is not None:
        raise NotShared(reason)
    cache_arg = cache_argument(_unwrap(model))
    recording = _recording_cache(model)
    with _cache_kept_under_checkpointing(model):
        model(**prefix, use_cache=False, logits_to_keep=1, **{cache_arg: recording})
        cache = _read_only_cache(recording, inverse)
        out = model(**tail, fused_lm_head=True, **{cache_arg: cache})
    if not all(layer.reads for layer in cache.layers):
        raise NotShared("a decoder layer ran without the prompt's key/value cache (the model dropped it), so the "
                        "split pass cannot run")
    return out


def qwen_vl_backbone(model: Any) -> Any:
    """The inner Qwen-VL model whose ``compute_3d_position_ids`` the full forward calls, or ``None`` for any
    other architecture (DDP's ``module`` and PEFT's wrapper are looked through)."""
    target = model.module if hasattr(model, "module") else model
    if hasattr(target, "get_base_model"):
        target = target.get_base_model()
    inner = getattr(target, "model", None)
    return inner if hasattr(inner, "compute_3d_position_ids") else None


def _full_row_positions(backbone: Any, input_ids: Any, attention_mask: Any, image_grid_thw: Any,
                        mm_token_type_ids: Any) -> Any:
    """The (3 or 4, rows, length) rope positions the model's own full forward would use for these rows."""
    import torch

    pos = backbone.compute_3d_position_ids(input_ids=input_ids, image_grid_thw=image_grid_thw, video_grid_thw=None,
                                           inputs_embeds=None, attention_mask=attention_mask,
                                           mm_token_type_ids=mm_token_type_ids,
                                           **cache_kwargs(backbone.compute_3d_position_ids, None))
    if pos is None:  # no image in these rows: the text model counts 0..L-1 on every row, padding included
        rows, length = input_ids.shape
        pos = torch.arange(length, device=input_ids.device).view(1, 1, -1).expand(3, rows, length)
    return pos


def _per_row_images(pixel_values: Any, image_grid_thw: Any, num_images: list[int]) -> tuple[list[Any], list[Any]]:
    """Each row's pixel patches and grids (Qwen-VL concatenates every image's patches along dim 0)."""
    import torch

    grids = list(torch.split(image_grid_thw, num_images))
    patches = [int(g.prod(dim=-1).sum()) if len(g) else 0 for g in grids]
    return list(torch.split(pixel_values, patches)), grids


def _groups_with_pixels(key: Any, pixels: list[Any] | None) -> tuple[list[int], Any]:
    """Representative rows and each row's group: equal prompt tokens and mask, and equal pixels."""
    import torch

    _, by_text = torch.unique(key, dim=0, return_inverse=True)
    reps: list[int] = []
    inverse: list[int] = []
    for r in range(key.size(0)):
        for g, rep in enumerate(reps):
            if by_text[rep] == by_text[r] and (pixels is None or torch.equal(pixels[rep], pixels[r])):
                inverse.append(g)
                break
        else:
            reps.append(r)
            inverse.append(len(reps) - 1)
    return reps, torch.tensor(inverse, device=key.device)


def shared_prefix_logps_qwen_vl(model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int,
                                compute_entropy: bool = False, pixel_values: Any = None, image_grid_thw: Any = None,
                                num_images: list[int] | None = None, mm_token_type_ids: Any = None,
                                only_if_shared: bool = False) -> tuple[Any, Any, int]:
    """:func:`shared_prefix_logps` for a Qwen-VL policy, images included (see the module doc).

    Positions are those of the model's own full pass, computed once for the full rows and sliced; each
    group's images go through the vision tower once, in the prompt part only (completions hold no image)."""
    import torch

    split = input_ids.size(1) - logits_to_keep - 1
    pixels = grids = None
    if pixel_values is not None:
        pixels, grids = _per_row_images(pixel_values, image_grid_thw, list(num_images))
    key = torch.cat([input_ids[:, :split], attention_mask[:, :split].to(input_ids.dtype)], dim=1)
    reps, inverse = _groups_with_pixels(key, pixels)
    if only_if_shared and len(reps) == input_ids.size(0):
        raise NotShared(NO_SHARED_PROMPT)
    positions = _full_row_positions(qwen_vl_backbone(model), input_ids, attention_mask,
                                    image_grid_thw if pixel_values is not None else None, mm_token_type_ids)
    prompt_kw: dict[str, Any] = {}
    if pixels is not None and any(len(grids[r]) for r in reps):
        prompt_kw = {"pixel_values": torch.cat([pixels[r] for r in reps]),
                     "image_grid_thw": torch.cat([grids[r] for r in reps])}
    idx = torch.tensor(reps, device=input_ids.device)
    tail = input_ids[:, split:]
    labels = tail.masked_fill(attention_mask[:, split:] == 0, -100)
    labels[:, 0] = -100
    out = _two_part_forward(model, inverse,
                            prefix={"input_ids": input_ids[idx, :split], "attention_mask": attention_mask[idx, :split],
                                    "position_ids": positions[:, idx, :split], **prompt_kw},
                            tail={"input_ids": tail, "attention_mask": attention_mask,
                                  "position_ids": positions[:, :, split:], "labels": labels})
    entropies = out.entropy[:, -logits_to_keep:] if compute_entropy else None
    return out.log_probs[:, -logits_to_keep:], entropies, len(reps)


VERIFIED_DISTRIBUTED = ("NO", "MULTI_CPU", "MULTI_GPU", "DEEPSPEED")
"""accelerate's distributed types the split pass is checked under (one process, DDP, DeepSpeed ZeRO-2/3:
``tests/test_shared_prefix_ranks.py``); FSDP, Megatron-LM and XLA keep TRL's pass."""


def _checkpointing_kwargs(args: Any) -> dict[str, Any]:
    """The keyword arguments the Trainer hands ``torch.utils.checkpoint`` (its own keys removed)."""
    kwargs = dict(getattr(args, "gradient_checkpointing_kwargs", None) or {})
    kwargs.pop("every_n_layers", None)
    kwargs.pop("offload", None)
    return kwargs


def shared_prefix_reason(trainer: Any) -> str | None:
    """Why the shared-prompt pass cannot be used for ``trainer`` (a sentence), or ``None`` when it can.

    Read from the trainer's arguments before training starts; the pass checks the model itself on every call
    as well (:func:`checkpointing_reason`, the cache layout), and a call it cannot take goes to TRL's pass."""
    args = trainer.args
    accelerator = getattr(trainer, "accelerator", None)
    kind = getattr(getattr(accelerator, "distributed_type", None), "value", "NO")
    if kind not in VERIFIED_DISTRIBUTED:
        return (f"the run is distributed as {kind}, where the two-part forward is not verified (it is under DDP and "
                "DeepSpeed ZeRO-2/3), so TRL's pass runs")
    if getattr(getattr(trainer.model, "config", None), "vision_config", None) is not None \
            and qwen_vl_backbone(trainer.model) is None:
        return ("the policy is a vision-language model outside the Qwen-VL family, whose split pass is not "
                "verified, so TRL's pass runs")
    if getattr(args, "gradient_checkpointing", False):
        kwargs = _checkpointing_kwargs(args)    # none: transformers' default (5.x) and TRL's (4.x) are non-reentrant
        if kwargs and kwargs.get("use_reentrant") is not False:
            return ("gradient checkpointing is reentrant (gradient_checkpointing_kwargs use_reentrant is not false; "
                    "TRL forces it for LoRA under ZeRO-3), which runs each layer under no_grad: the prompt's cached "
                    "key/value states would get no gradient")
    if getattr(trainer, "aux_loss_enabled", False):
        return "the model adds an MoE load-balancing loss, which the split pass does not compute"
    if getattr(args, "num_generations", 1) < 2:
        return "num_generations is 1: no prompt is shared"
    if getattr(args, "per_device_train_batch_size", 2) < 2:
        return "per_device_train_batch_size is 1: each loss pass holds one row, so no prompt is shared"
    return None


def micro_batch_sharing(args: Any) -> str:
    """How many rows share a prompt pass in one loss pass, given TRL 1.16's batching (a sentence for the log).

    TRL's ``RepeatSampler`` puts the G copies of a prompt next to each other, and each rank loads a contiguous
    ``per_device_train_batch_size x steps_per_generation`` slice of that order (the generation batch), so a rank
    holds whole groups when G divides it (captionrl's train config requires it). TRL then shuffles the
    generation batch (``shuffle_sequence_dict``) before cutting it into ``steps_per_generation`` loss passes:
    with one loss pass per generation a pass holds whole groups; with more, a group's rows scatter over them.
    The split pass groups rows by equal prompt within each pass, so it stays exact either way; only what it
    shares changes."""
    from math import comb

    g, b = int(args.num_generations), int(args.per_device_train_batch_size)
    spg = int(getattr(args, "steps_per_generation", None) or getattr(args, "gradient_accumulation_steps", 1) or 1)
    rows = b * spg
    if spg == 1 or rows % g:
        n = max(1, b // g)
        return f"each loss pass holds {b} rows of about {n} prompt{'s' if n > 1 else ''}, each computed once"
    groups = rows // g
    expected = groups * (1 - comb(rows - g, b) / comb(rows, b))   # distinct groups among b rows drawn from rows
    return (f"TRL shuffles each rank's {rows} generated rows over {spg} loss passes (steps_per_generation), so a "
            f"pass of {b} rows holds about {expected:.1f} distinct prompts: {b / expected:.1f} rows per prompt pass "
            f"(whole groups would give {min(g, b)})")


def share_prompt_forward(trainer: Any) -> str | None:
    """Route ``trainer``'s log-prob passes through :func:`shared_prefix_logps` (text) or
    :func:`shared_prefix_logps_qwen_vl` (Qwen-VL policies, images included).

    Returns ``None`` when the trainer is patched, else the reason it is left as it is. A call with an aux
    loss, with multimodal inputs the policy's path does not handle, with no prompt shared by two rows, or that
    the split pass refuses (:class:`NotShared`: reentrant checkpointing, a cache layout it does not handle, a
    layer that dropped the cache) goes to TRL's own pass, under the same autocast as TRL's. Counts land in
    ``trainer._captionrl_shared_prefix`` (rows, distinct prompts, calls that fell back and why) for the timing
    summary, with ``sharing``: what TRL's batching leaves a loss pass to share (:func:`micro_batch_sharing`).
    """
    reason = shared_prefix_reason(trainer)
    if reason is not None:
        return reason
    from captionrl.train.run.trl_compat import original

    own_pass = original(trainer, "_get_per_token_logps_and_entropies")
    qwen_vl = qwen_vl_backbone(trainer.model) is not None
    handled = QWEN_VL_KEYS if qwen_vl else ()
    state: dict[str, Any] = {"rows": 0, "prompts": 0, "fallback_calls": 0, "unshared_calls": 0,
                             "sharing": micro_batch_sharing(trainer.args)}
    # Under ZeRO-3 every forward call gathers each layer's weights with a collective, and DDP broadcasts its
    # buffers on each call, so every rank must make the same calls: with several processes a call is never
    # routed by its own rows (the split pass is exact without a shared prompt too; it only saves nothing).
    local_choice = getattr(trainer.accelerator, "num_processes", 1) == 1

    def logps_and_entropies(model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int,
                            batch_size: int | None = None, compute_entropy: bool = False,
                            compute_aux_loss: bool = False, **multimodal: Any) -> Any:
        def trls() -> Any:
            return own_pass(model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy,
                            compute_aux_loss, **multimodal)

        given = {k for k in MULTIMODAL_KEYS if multimodal.get(k) is not None}
        images = multimodal.get("pixel_values") is not None
        if compute_aux_loss or not given <= set(handled) or input_ids.size(1) - logits_to_keep < 2 \
                or (images and (multimodal.get("image_grid_thw") is None or multimodal.get("num_images") is None)):
            state["fallback_calls"] += 1
            return trls()
        try:
            with trainer.accelerator.autocast():        # as TRL's pass runs the model
                logps, entropies, rows, prompts = _shared_chunks(model, input_ids, attention_mask, logits_to_keep,
                                                                 batch_size, compute_entropy, qwen_vl, multimodal,
                                                                 only_if_shared=local_choice)
        except NotShared as why:
            if why.reason == NO_SHARED_PROMPT:
                state["unshared_calls"] += 1
            else:
                if "fallback_reason" not in state:
                    logger.warning(f"shared-prompt forward: TRL's pass for this call and any like it: {why.reason}")
                state["fallback_calls"] += 1
                state["fallback_reason"] = why.reason
            return trls()
        state["rows"] += rows
        state["prompts"] += prompts
        return logps, entropies, None

    trainer._get_per_token_logps_and_entropies = logps_and_entropies
    # a VLM's generate derives its rope positions from its own prefill: it keeps that prefill
    state["generation"] = ("generate's own prefill (vision-language policy)" if qwen_vl
                           else share_generation_prefill(trainer.model, always=not local_choice))
    trainer._captionrl_shared_prefix = state
    return None


def _shared_chunks(model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int, batch_size: int | None,
                   compute_entropy: bool, qwen_vl: bool, multimodal: dict[str, Any], only_if_shared: bool,
                   ) -> tuple[Any, Any, int, int]:
    """The split pass over ``batch_size``-row chunks, as TRL chunks its pass: (log-probs, entropies or None,
    rows, prompt passes). Raises :class:`NotShared` when a chunk cannot take it."""
    import torch

    pixels = grids = None
    if multimodal.get("pixel_values") is not None:
        pixels, grids = _per_row_images(multimodal["pixel_values"], multimodal["image_grid_thw"],
                                        list(multimodal["num_images"]))
    mm_types = multimodal.get("mm_token_type_ids")
    batch_size = batch_size or input_ids.size(0)
    logps, entropies, prompts = [], [], 0
    for start in range(0, input_ids.size(0), batch_size):
        end = min(start + batch_size, input_ids.size(0))
        ids, mask = input_ids[start:end], attention_mask[start:end]
        if qwen_vl:
            chunk: dict[str, Any] = {"mm_token_type_ids": mm_types[start:end] if mm_types is not None else None}
            if pixels is not None:
                chunk.update(pixel_values=torch.cat(pixels[start:end]), image_grid_thw=torch.cat(grids[start:end]),
                             num_images=list(multimodal["num_images"])[start:end])
            lp, ent, n = shared_prefix_logps_qwen_vl(model, ids, mask, logits_to_keep, compute_entropy,
                                                     only_if_shared=only_if_shared, **chunk)
        else:
            lp, ent, n = shared_prefix_logps(model, ids, mask, logits_to_keep, compute_entropy,
                                             only_if_shared=only_if_shared)
        logps.append(lp)
        entropies.append(ent)
        prompts += n
    return torch.cat(logps), torch.cat(entropies) if compute_entropy else None, int(input_ids.size(0)), prompts


def shared_prefill(model: Any, input_ids: Any, attention_mask: Any, always: bool = False) -> tuple[Any, int] | None:
    """A key/value cache of every row's prompt but its last token, each distinct prompt computed once and
    indexed out to its rows; ``None`` when no two rows share a prompt (nothing to save), unless ``always``
    (several processes: each must make the same forward calls, see :func:`share_prompt_forward`).

    Positions are generation's own (``cumsum`` of the attention mask), so ``generate`` continues on this
    cache exactly as on its own prefill: it runs only the last prompt token and then decodes.
    """
    import torch

    split = input_ids.size(1) - 1
    if split < 1:
        return None
    key = torch.cat([input_ids[:, :split], attention_mask[:, :split].to(input_ids.dtype)], dim=1)
    uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
    if uniq.size(0) == input_ids.size(0) and not always:
        return None
    mask = uniq[:, split:]
    positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
    with torch.no_grad():
        out = model(input_ids=uniq[:, :split], attention_mask=mask, position_ids=positions, use_cache=True,
                    logits_to_keep=1)
    cache = output_cache(out)
    cache.batch_select_indices(inverse)
    return cache, int(uniq.size(0))


def share_generation_prefill(model: Any, state: dict[str, Any] | None = None, always: bool = False) -> dict[str, Any]:
    """Make ``model.generate`` prefill each distinct prompt once (the G rows of a group share it).

    Only plain text calls are changed (``input_ids`` + ``attention_mask``, no cache, no multimodal input);
    anything else goes to the original ``generate``. ``state`` counts rows and distinct prompts; ``always``:
    prefill even when no prompt is shared (see :func:`shared_prefill`).
    """
    state = state if state is not None else {"rows": 0, "prompts": 0}
    original = model.generate

    def generate(*args: Any, **kwargs: Any) -> Any:
        ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
        plain = not args and ids is not None and mask is not None and not any(
            k in kwargs for k in ("cache", "past_key_values", "inputs_embeds", *MULTIMODAL_KEYS))
        if plain:
            shared = shared_prefill(model, ids, mask, always)
            if shared is not None:
                cache, prompts = shared
                state["rows"] += int(ids.size(0))
                state["prompts"] += prompts
                kwargs[cache_argument(model)] = cache
        return original(*args, **kwargs)

    model.generate = generate
    return state
