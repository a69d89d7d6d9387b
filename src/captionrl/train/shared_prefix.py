"""Exact shared-prompt forward for GRPO/RLOO groups: each group's prompt runs once, with gradient.

The G completions of one prompt share it, yet TRL's loss pass (``_get_per_token_logps_and_entropies``)
runs every row's prompt again: in the LineupRL CPU job most of each row's tokens are prompt. Here the
batch is split one token before the completions start:

1. the distinct prompt prefixes (``input_ids[:, :P-1]`` with their attention mask) run once each through
   the model with a key/value cache;
2. the cache is indexed out to every row of the batch (``index_select`` on the batch dimension: autograd
   sums each row's gradient back into its group's single prompt pass);
3. the last prompt token and the completions (``input_ids[:, P-1:]``) run on that cache through TRL's own
   fused LM head (``fused_lm_head=True``), so temperature, logit scaling and the entropy are TRL's.

Positions are the ones TRL's full pass uses (the cache length plus ``arange``), the attention mask is the
full row's, and the first completion token's log-prob comes from the last prompt token as before, so the
per-token log-probs and the parameter gradients equal TRL's up to float rounding (``tests/test_shared_prefix.py``
checks both on the embedded model). The idea is Prefix Grouper's (verl ``use_prefix_grouper``).

Generation gets the same treatment (:func:`share_generation_prefill`): each distinct prompt is prefilled
once and its cache indexed out to the G rows, and ``generate`` continues from there.

Qwen-VL policies (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) take the same path with their images: their 3-D rope
positions depend on the whole row, so they are computed once for the full rows exactly as the model's own
full pass computes them (``compute_3d_position_ids``) and sliced for the two parts; rows are grouped by
prompt tokens *and* pixels (two charts under one instruction have the same placeholder tokens), and the
prompt part carries only the groups' images, so the vision tower also runs once per group. Generation of
VLM policies keeps ``generate``'s own prefill.

Where it is not exact or not known to be, the trainer keeps TRL's pass and the reason is recorded:
vision-language models outside the Qwen-VL family, MoE aux losses, gradient checkpointing (HF drops the
cache under it), distributed runs (DDP's reducer and ZeRO-3's parameter gathering see two forward calls
per loss; not yet verified), and batches with no prompt shared by two rows.
"""

from __future__ import annotations

from typing import Any

from captionrl.compat import cache_argument, cache_kwargs, output_cache

MULTIMODAL_KEYS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes",
                   "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")
QWEN_VL_KEYS = ("pixel_values", "image_grid_thw", "num_images", "mm_token_type_ids")
"""The multimodal inputs the Qwen-VL path handles; any other one sends the call to TRL's pass."""


def shared_prefix_logps(model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int,
                        compute_entropy: bool = False) -> tuple[Any, Any, int]:
    """Per-token log-probs (and entropies) of the last ``logits_to_keep`` tokens of every row, each distinct
    prompt computed once. ``model`` must carry TRL's fused LM head (TRL adds it to the policy).

    Returns ``(logps, entropies or None, distinct prompts)``; shapes are ``(rows, logits_to_keep)``.
    """
    import torch

    split = input_ids.size(1) - logits_to_keep - 1     # the prefix ends one token before the completions
    key = torch.cat([input_ids[:, :split], attention_mask[:, :split].to(input_ids.dtype)], dim=1)
    uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
    prefix = model(input_ids=uniq[:, :split], attention_mask=uniq[:, split:], use_cache=True, logits_to_keep=1)
    cache = output_cache(prefix)
    cache.batch_select_indices(inverse)
    tail = input_ids[:, split:]
    labels = tail.masked_fill(attention_mask[:, split:] == 0, -100)
    labels[:, 0] = -100                                  # the last prompt token is context, not a label
    out = model(input_ids=tail, attention_mask=attention_mask, labels=labels, fused_lm_head=True,
                **cache_kwargs(model, cache))
    entropies = out.entropy[:, -logits_to_keep:] if compute_entropy else None
    return out.log_probs[:, -logits_to_keep:], entropies, int(uniq.size(0))


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
                                ) -> tuple[Any, Any, int]:
    """:func:`shared_prefix_logps` for a Qwen-VL policy, images included (see the module doc).

    Positions are those of the model's own full pass, computed once for the full rows and sliced; each
    group's images go through the vision tower once, in the prompt part only (completions hold no image)."""
    import torch

    backbone = qwen_vl_backbone(model)
    split = input_ids.size(1) - logits_to_keep - 1
    positions = _full_row_positions(backbone, input_ids, attention_mask,
                                    image_grid_thw if pixel_values is not None else None, mm_token_type_ids)
    pixels = grids = None
    if pixel_values is not None:
        pixels, grids = _per_row_images(pixel_values, image_grid_thw, list(num_images))
    key = torch.cat([input_ids[:, :split], attention_mask[:, :split].to(input_ids.dtype)], dim=1)
    reps, inverse = _groups_with_pixels(key, pixels)
    prompt_kw: dict[str, Any] = {}
    if pixels is not None and any(len(grids[r]) for r in reps):
        prompt_kw = {"pixel_values": torch.cat([pixels[r] for r in reps]),
                     "image_grid_thw": torch.cat([grids[r] for r in reps])}
    idx = torch.tensor(reps, device=input_ids.device)
    prefix = model(input_ids=input_ids[idx, :split], attention_mask=attention_mask[idx, :split],
                   position_ids=positions[:, idx, :split], use_cache=True, logits_to_keep=1, **prompt_kw)
    cache = output_cache(prefix)
    cache.batch_select_indices(inverse)
    tail = input_ids[:, split:]
    labels = tail.masked_fill(attention_mask[:, split:] == 0, -100)
    labels[:, 0] = -100
    out = model(input_ids=tail, attention_mask=attention_mask, position_ids=positions[:, :, split:], labels=labels,
                fused_lm_head=True, **cache_kwargs(model, cache))
    entropies = out.entropy[:, -logits_to_keep:] if compute_entropy else None
    return out.log_probs[:, -logits_to_keep:], entropies, len(reps)


def shared_prefix_reason(trainer: Any) -> str | None:
    """Why the shared-prompt pass cannot be used for ``trainer`` (a sentence), or ``None`` when it can."""
    args = trainer.args
    accelerator = getattr(trainer, "accelerator", None)
    if accelerator is not None and (getattr(accelerator, "num_processes", 1) > 1
                                    or getattr(accelerator.state, "deepspeed_plugin", None) is not None):
        return ("the run is distributed (DDP or DeepSpeed): the two-part forward is verified in one process "
                "only, so TRL's pass runs")
    if getattr(getattr(trainer.model, "config", None), "vision_config", None) is not None \
            and qwen_vl_backbone(trainer.model) is None:
        return ("the policy is a vision-language model outside the Qwen-VL family, whose split pass is not "
                "verified, so TRL's pass runs")
    if getattr(args, "gradient_checkpointing", False):
        return "gradient checkpointing is on (transformers drops the key/value cache under it)"
    if getattr(trainer, "aux_loss_enabled", False):
        return "the model adds an MoE load-balancing loss, which the split pass does not compute"
    if getattr(args, "num_generations", 1) < 2:
        return "num_generations is 1: no prompt is shared"
    return None


def share_prompt_forward(trainer: Any) -> str | None:
    """Route ``trainer``'s log-prob passes through :func:`shared_prefix_logps` (text) or
    :func:`shared_prefix_logps_qwen_vl` (Qwen-VL policies, images included).

    Returns ``None`` when the trainer is patched, else the reason it is left as it is. A call with an aux
    loss, or with multimodal inputs the policy's path does not handle, goes to TRL's own pass. Counts land in
    ``trainer._captionrl_shared_prefix`` (rows, distinct prompts, calls that fell back) for the timing summary.
    """
    reason = shared_prefix_reason(trainer)
    if reason is not None:
        return reason
    from captionrl.train.trl_compat import original

    own_pass = original(trainer, "_get_per_token_logps_and_entropies")
    qwen_vl = qwen_vl_backbone(trainer.model) is not None
    handled = QWEN_VL_KEYS if qwen_vl else ()
    state: dict[str, Any] = {"rows": 0, "prompts": 0, "fallback_calls": 0}

    def logps_and_entropies(model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int,
                            batch_size: int | None = None, compute_entropy: bool = False,
                            compute_aux_loss: bool = False, **multimodal: Any) -> Any:
        import torch

        given = {k for k in MULTIMODAL_KEYS if multimodal.get(k) is not None}
        images = multimodal.get("pixel_values") is not None
        if compute_aux_loss or not given <= set(handled) or input_ids.size(1) - logits_to_keep < 2 \
                or (images and (multimodal.get("image_grid_thw") is None or multimodal.get("num_images") is None)):
            state["fallback_calls"] += 1
            return own_pass(model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy,
                            compute_aux_loss, **multimodal)
        pixels = grids = None
        if images:
            pixels, grids = _per_row_images(multimodal["pixel_values"], multimodal["image_grid_thw"],
                                            list(multimodal["num_images"]))
        mm_types = multimodal.get("mm_token_type_ids")
        batch_size = batch_size or input_ids.size(0)
        logps, entropies = [], []
        for start in range(0, input_ids.size(0), batch_size):
            end = min(start + batch_size, input_ids.size(0))
            ids, mask = input_ids[start:end], attention_mask[start:end]
            if qwen_vl:
                chunk: dict[str, Any] = {"mm_token_type_ids": mm_types[start:end] if mm_types is not None else None}
                if pixels is not None:
                    chunk.update(pixel_values=torch.cat(pixels[start:end]), image_grid_thw=torch.cat(grids[start:end]),
                                 num_images=list(multimodal["num_images"])[start:end])
                lp, ent, prompts = shared_prefix_logps_qwen_vl(model, ids, mask, logits_to_keep, compute_entropy, **chunk)
            else:
                lp, ent, prompts = shared_prefix_logps(model, ids, mask, logits_to_keep, compute_entropy)
            logps.append(lp)
            entropies.append(ent)
            state["rows"] += end - start
            state["prompts"] += prompts
        return (torch.cat(logps), torch.cat(entropies) if compute_entropy else None, None)

    trainer._get_per_token_logps_and_entropies = logps_and_entropies
    # a VLM's generate derives its rope positions from its own prefill: it keeps that prefill
    state["generation"] = ("generate's own prefill (vision-language policy)" if qwen_vl
                           else share_generation_prefill(trainer.model))
    trainer._captionrl_shared_prefix = state
    return None


def shared_prefill(model: Any, input_ids: Any, attention_mask: Any) -> tuple[Any, int] | None:
    """A key/value cache of every row's prompt but its last token, each distinct prompt computed once and
    indexed out to its rows; ``None`` when no two rows share a prompt (nothing to save).

    Positions are generation's own (``cumsum`` of the attention mask), so ``generate`` continues on this
    cache exactly as on its own prefill: it runs only the last prompt token and then decodes.
    """
    import torch

    split = input_ids.size(1) - 1
    if split < 1:
        return None
    key = torch.cat([input_ids[:, :split], attention_mask[:, :split].to(input_ids.dtype)], dim=1)
    uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
    if uniq.size(0) == input_ids.size(0):
        return None
    mask = uniq[:, split:]
    positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
    with torch.no_grad():
        out = model(input_ids=uniq[:, :split], attention_mask=mask, position_ids=positions, use_cache=True,
                    logits_to_keep=1)
    cache = output_cache(out)
    cache.batch_select_indices(inverse)
    return cache, int(uniq.size(0))


def share_generation_prefill(model: Any, state: dict[str, Any] | None = None) -> dict[str, Any]:
    """Make ``model.generate`` prefill each distinct prompt once (the G rows of a group share it).

    Only plain text calls are changed (``input_ids`` + ``attention_mask``, no cache, no multimodal input);
    anything else goes to the original ``generate``. ``state`` counts rows and distinct prompts.
    """
    state = state if state is not None else {"rows": 0, "prompts": 0}
    original = model.generate

    def generate(*args: Any, **kwargs: Any) -> Any:
        ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
        plain = not args and ids is not None and mask is not None and not any(
            k in kwargs for k in ("cache", "past_key_values", "inputs_embeds", *MULTIMODAL_KEYS))
        if plain:
            shared = shared_prefill(model, ids, mask)
            if shared is not None:
                cache, prompts = shared
                state["rows"] += int(ids.size(0))
                state["prompts"] += prompts
                kwargs[cache_argument(model)] = cache
        return original(*args, **kwargs)

    model.generate = generate
    return state
