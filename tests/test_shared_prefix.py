"""The shared-prompt forward equals TRL's own log-prob pass: per-token log-probs and parameter gradients.

TRL's ``RLOOTrainer._get_per_token_logps_and_entropies`` (the real function, called on the real model with
TRL's fused LM head) is the reference; ours computes each group's prompt once and reuses its cache.
The batch is what TRL builds: left-padded prompts of different lengths (two groups of four rows), right-
padded completions of different lengths.
"""

from __future__ import annotations

import pytest
import torch

from prefix_batches import COMPLETIONS, PROMPTS, text_batch, trl_pass, vlm_batch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def policy():
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.trainer.utils import add_fused_lm_head

    from captionrl.embedded import embedded_model_dir

    folder = embedded_model_dir()
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.train()
    add_fused_lm_head(model, temperature=0.9, outputs=("log_probs", "entropy"))  # as RLOOTrainer does
    return model, tok


def _grads(model, logps, mask):
    model.zero_grad(set_to_none=True)
    (logps * mask).sum().backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def test_logps_entropies_and_gradients_equal_trl(policy):
    from captionrl.train.run.shared_prefix import shared_prefix_logps

    model, tok = policy
    ids, mask, keep = text_batch(tok, PROMPTS, COMPLETIONS, group=4)
    cmask = mask[:, -keep:].float()
    ref_lp, ref_ent, _ = trl_pass(model, ids, mask, keep)
    ref_grads = _grads(model, ref_lp, cmask)
    lp, ent, prompts = shared_prefix_logps(model, ids, mask, keep, compute_entropy=True)
    grads = _grads(model, lp, cmask)

    assert prompts == 2                       # one prompt pass per group, not per row
    assert lp.shape == ref_lp.shape == (8, keep)
    assert torch.allclose(lp * cmask, ref_lp * cmask, atol=2e-4), (lp - ref_lp).abs().max()
    assert torch.allclose(ent * cmask, ref_ent * cmask, atol=2e-4)
    assert set(grads) == set(ref_grads) and len(grads) > 20
    for name, g in ref_grads.items():
        scale = g.abs().max().clamp(min=1e-6)
        assert (grads[name] - g).abs().max() / scale < 2e-3, name


def test_rows_with_distinct_prompts_still_match(policy):
    """No prompt shared (group 1): one prefix per row, the same numbers as TRL."""
    from captionrl.train.run.shared_prefix import shared_prefix_logps

    model, tok = policy
    ids, mask, keep = text_batch(tok, [f"Series {i}: {i}, {i + 1}" for i in range(3)], COMPLETIONS[:3], group=1)
    cmask = mask[:, -keep:].float()
    with torch.no_grad():
        ref_lp, _, _ = trl_pass(model, ids, mask, keep)
        lp, _, prompts = shared_prefix_logps(model, ids, mask, keep)
    assert prompts == 3
    assert torch.allclose(lp * cmask, ref_lp * cmask, atol=2e-4)


def test_generation_on_the_shared_prefill_equals_plain_generation(policy):
    """Greedy captions from the once-per-group prefill are the captions of TRL's plain ``generate``."""
    from captionrl.train.run.shared_prefix import share_generation_prefill

    model, tok = policy
    ids, mask, keep = text_batch(tok, PROMPTS, COMPLETIONS, group=4)
    prompts, pmask = ids[:, :-keep], mask[:, :-keep]
    kwargs = dict(max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
    model.eval()
    try:
        with torch.no_grad():
            plain = model.generate(input_ids=prompts, attention_mask=pmask, **kwargs)
            state = share_generation_prefill(model)
            shared = model.generate(input_ids=prompts, attention_mask=pmask, **kwargs)
    finally:
        model.__dict__.pop("generate", None)
        model.train()
    assert state == {"rows": 8, "prompts": 2}
    assert torch.equal(plain, shared)


@pytest.fixture(scope="module")
def tiny_policy(tiny_llama):
    """The tiny random Llama with TRL's fused head, for the checks that need a model, not a good one."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.trainer.utils import add_fused_lm_head

    tok = AutoTokenizer.from_pretrained(tiny_llama)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    model.train()
    add_fused_lm_head(model, temperature=0.9, outputs=("log_probs", "entropy"))
    return model, tok


def _count_checkpointed_calls(model) -> list[int]:
    """Count each checkpointed layer call (the checkpoint function is kept, its keywords too)."""
    import functools

    calls: list[int] = []
    for m in model.modules():
        func = getattr(m, "_gradient_checkpointing_func", None)
        if getattr(m, "gradient_checkpointing", False) and isinstance(func, functools.partial):
            def counted(*a, _f=func.func, **k):
                calls.append(1)
                return _f(*a, **k)
            m._gradient_checkpointing_func = functools.partial(counted, **func.keywords)
    return calls


def test_gradient_checkpointing_keeps_the_shared_cache_and_equals_trl(tiny_policy, monkeypatch):
    """With (non-reentrant) gradient checkpointing on, the layers really checkpoint (each runs again in the
    backward pass) and the split pass still equals TRL's pass, log-probs and every gradient. Without the flag
    that lets the layers keep the cache, transformers drops it (the completions would attend to nothing of the
    prompt): the pass then refuses instead of returning wrong numbers."""
    import contextlib

    from captionrl.train.run import shared_prefix as sp

    model, tok = tiny_policy
    ids, mask, keep = text_batch(tok, PROMPTS, COMPLETIONS, group=4)
    cmask = mask[:, -keep:].float()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    try:
        calls = _count_checkpointed_calls(model)
        ref_lp, ref_ent, _ = trl_pass(model, ids, mask, keep)
        ref_grads = _grads(model, ref_lp, cmask)
        assert len(calls) == 2                      # TRL's pass: one call per layer (2 layers)
        lp, ent, prompts = sp.shared_prefix_logps(model, ids, mask, keep, compute_entropy=True)
        grads = _grads(model, lp, cmask)
        assert len(calls) == 2 + 4                  # ours: the prompt pass and the completions pass, both checkpointed
        assert prompts == 2
        assert torch.allclose(lp * cmask, ref_lp * cmask, atol=2e-4), (lp - ref_lp).abs().max()
        assert torch.allclose(ent * cmask, ref_ent * cmask, atol=2e-4)
        assert set(grads) == set(ref_grads) and len(grads) > 10
        for name, g in ref_grads.items():
            assert (grads[name] - g).abs().max() / g.abs().max().clamp(min=1e-6) < 2e-3, name
        monkeypatch.setattr(sp, "_cache_kept_under_checkpointing", lambda model: contextlib.nullcontext())
        with pytest.raises(sp.NotShared, match="dropped"):
            sp.shared_prefix_logps(model, ids, mask, keep)
    finally:
        model.gradient_checkpointing_disable()


def test_reentrant_checkpointing_is_refused(tiny_policy):
    """Reentrant checkpointing runs each layer under no_grad: the prompt's cached states would get no gradient
    (measured: 95% off on a k_proj weight), so the pass refuses before any forward."""
    from captionrl.train.run.shared_prefix import NotShared, shared_prefix_logps

    model, tok = tiny_policy
    ids, mask, keep = text_batch(tok, PROMPTS, COMPLETIONS, group=4)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    try:
        with pytest.raises(NotShared, match="reentrant"):
            shared_prefix_logps(model, ids, mask, keep)
    finally:
        model.gradient_checkpointing_disable()


@pytest.mark.parametrize("processes", [1, 2])
def test_a_call_without_a_shared_prompt_is_routed_by_its_rows_only_in_one_process(tiny_policy, processes):
    """Through the trainer patch: a loss pass whose rows share no prompt goes to TRL's pass in one process
    (nothing to save). With several processes every rank must make the same forward calls (ZeRO-3 gathers
    weights with a collective per call, DDP broadcasts buffers per call), so the split pass runs anyway:
    exact, one prompt pass per row."""
    import contextlib
    import functools
    from types import SimpleNamespace

    from accelerate.utils import DistributedType
    from trl import RLOOTrainer

    from captionrl.train.run.shared_prefix import share_prompt_forward

    model, tok = tiny_policy
    args = SimpleNamespace(gradient_checkpointing=False, num_generations=2, per_device_train_batch_size=3,
                           steps_per_generation=1)
    accelerator = SimpleNamespace(num_processes=processes, autocast=contextlib.nullcontext, is_main_process=True,
                                  distributed_type=DistributedType.NO if processes == 1 else DistributedType.MULTI_CPU)
    trainer = SimpleNamespace(args=args, model=model, accelerator=accelerator)
    trainer._get_per_token_logps_and_entropies = functools.partial(RLOOTrainer._get_per_token_logps_and_entropies,
                                                                   trainer)
    ids, mask, keep = text_batch(tok, [f"Series {i}: {i}, {i + 1}" for i in range(3)], COMPLETIONS[:3], group=1)
    cmask = mask[:, -keep:].float()
    try:
        assert share_prompt_forward(trainer) is None
        with torch.no_grad():
            lp, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, keep)
            ref_lp, _, _ = trl_pass(model, ids, mask, keep)
    finally:
        model.__dict__.pop("generate", None)
    assert torch.allclose(lp * cmask, ref_lp * cmask, atol=2e-4)
    state = trainer._captionrl_shared_prefix
    if processes == 1:
        assert (state["unshared_calls"], state["rows"], state["fallback_calls"]) == (1, 0, 0), state
    else:
        assert (state["unshared_calls"], state["rows"], state["prompts"]) == (0, 3, 3), state


def test_reasons_follow_the_verified_setups():
    """On under one process, DDP and DeepSpeed, with non-reentrant checkpointing (transformers' default when no
    kwargs are given); off, with the reason, under FSDP, reentrant checkpointing (TRL forces it for LoRA under
    ZeRO-3) and one-row loss passes."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType
    from transformers import LlamaConfig

    from captionrl.train.run.shared_prefix import shared_prefix_reason

    def reason(kind=DistributedType.NO, **args):
        base = {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": None, "num_generations": 8,
                "per_device_train_batch_size": 8}
        return shared_prefix_reason(SimpleNamespace(args=SimpleNamespace(**{**base, **args}),
                                                    accelerator=SimpleNamespace(distributed_type=kind),
                                                    model=SimpleNamespace(config=LlamaConfig())))

    for kind in (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU, DistributedType.DEEPSPEED):
        assert reason(kind) is None, kind
    assert "FSDP" in reason(DistributedType.FSDP)
    assert reason(gradient_checkpointing_kwargs={"use_reentrant": False, "every_n_layers": 2}) is None
    assert reason(gradient_checkpointing_kwargs={"every_n_layers": 2}) is None     # transformers' default
    assert "reentrant" in reason(gradient_checkpointing_kwargs={"use_reentrant": True})
    assert "reentrant" in reason(gradient_checkpointing_kwargs={"preserve_rng_state": True})  # torch's default
    assert reason(gradient_checkpointing=False, gradient_checkpointing_kwargs={"use_reentrant": True}) is None
    assert "one row" in reason(per_device_train_batch_size=1)


def test_sharing_note_matches_trls_own_batching():
    """What a loss pass holds, by TRL's own sampler, shuffle and split: with one loss pass per generation each
    holds whole groups; with steps_per_generation 4 (the RubiCap preset: G=8, 8 rows a pass) TRL's shuffle
    scatters the groups, and the note's expected number of distinct prompts per pass matches TRL's functions."""
    import re
    from types import SimpleNamespace

    from trl.trainer.utils import RepeatSampler, shuffle_sequence_dict, split_tensor_dict

    from captionrl.train.run.shared_prefix import micro_batch_sharing

    g, b, spg, ranks = 8, 8, 4, 2
    order = list(RepeatSampler(range(40), mini_repeat_count=g, batch_size=ranks * b * spg // g, seed=0))
    rank0 = torch.tensor(order[: b * spg])          # a rank's generation batch: a contiguous slice of the order
    assert sorted(torch.unique(rank0, return_counts=True)[1].tolist()) == [g] * (b * spg // g)  # whole groups
    distinct = []
    for seed in range(400):
        torch.manual_seed(seed)
        for part in split_tensor_dict(shuffle_sequence_dict({"prompt": rank0}), spg):
            distinct.append(len(set(part["prompt"].tolist())))
    note = micro_batch_sharing(SimpleNamespace(num_generations=g, per_device_train_batch_size=b, steps_per_generation=spg))
    expected = float(re.search(r"about ([0-9.]+) distinct prompts", note).group(1))
    assert abs(sum(distinct) / len(distinct) - expected) < 0.1, (sum(distinct) / len(distinct), note)
    whole = micro_batch_sharing(SimpleNamespace(num_generations=g, per_device_train_batch_size=b, steps_per_generation=1))
    assert "holds 8 rows of about 1 prompt," in whole


def test_only_vision_language_models_outside_the_qwen_vl_family_keep_trls_pass(tiny_vlm):
    """Qwen-VL policies take the shared pass (their positions are computed for the full rows); a VLM of
    another family keeps TRL's pass, with the reason recorded."""
    from types import SimpleNamespace

    from transformers import LlamaConfig, LlavaConfig

    from captionrl.train.run.shared_prefix import shared_prefix_reason

    args = SimpleNamespace(gradient_checkpointing=False, num_generations=4, per_device_train_batch_size=4)
    other = SimpleNamespace(args=args, model=SimpleNamespace(config=LlavaConfig()))
    assert "outside the Qwen-VL family" in shared_prefix_reason(other)
    assert shared_prefix_reason(SimpleNamespace(args=args, model=tiny_vlm[0])) is None
    text = SimpleNamespace(args=args, model=SimpleNamespace(config=LlamaConfig()))
    assert shared_prefix_reason(text) is None


@pytest.mark.gpu_pins
def test_qwen_vl_text_only_rows_equal_trl_after_a_generation(tiny_vlm):
    """LineupRL trains VLM policies on printed numbers: text-only rows. The model keeps rope deltas from its
    last generation (here of another batch size), which once broke a split pass inside the model; the
    positions are now passed explicitly, so the log-probs still equal TRL's."""
    from captionrl.train.run.shared_prefix import shared_prefix_logps_qwen_vl

    model, proc = tiny_vlm
    ids, mask, keep = text_batch(proc.tokenizer, PROMPTS, COMPLETIONS, group=4)
    model.model.rope_deltas = torch.zeros((5, 1), dtype=torch.long)   # stale, from a batch of 5
    cmask = mask[:, -keep:].float()
    with torch.no_grad():
        ref_lp, _, _ = trl_pass(model, ids, mask, keep)
        lp, _, groups = shared_prefix_logps_qwen_vl(model, ids, mask, keep)
    assert groups == 2
    assert torch.allclose(lp * cmask, ref_lp * cmask, atol=2e-4), (lp - ref_lp).abs().max()


@pytest.fixture(scope="module", params=["qwen2.5-vl", "qwen3-vl"])
def tiny_vlm(request):
    """A tiny random Qwen-VL policy with its real processor, TRL's fused head added as RLOOTrainer adds it."""
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from trl.trainer.utils import add_fused_lm_head

    from captionrl.backends.hf import resolve_model_path

    folder = resolve_model_path(f"tiny-{request.param}")[0]
    proc = AutoProcessor.from_pretrained(folder)
    proc.tokenizer.padding_side = "left"          # TRL pads prompts on the left
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    model.train()
    add_fused_lm_head(model, temperature=0.9, outputs=("log_probs", "entropy"))
    return model, proc


@pytest.mark.parametrize("images_differ", [True, False])
@pytest.mark.gpu_pins
def test_qwen_vl_with_images_equals_trl_and_runs_the_vision_tower_once_per_group(tiny_vlm, images_differ):
    """Per-token log-probs, entropies and every parameter's gradient (the vision tower's included) equal TRL's
    pass on a tiny Qwen-VL with an image per row, left-padded prompts of two lengths and right-padded
    completions; the vision tower sees one image per group instead of one per row. Two groups with the same
    instruction and different charts must stay apart (their placeholder tokens are equal, their pixels not)."""
    from captionrl.train.run.shared_prefix import shared_prefix_logps_qwen_vl

    model, proc = tiny_vlm
    prompts = ["Describe this chart.", "Describe this chart.", "Describe this chart in detail, please."]
    colours = [(250, 10, 10), (10, 10, 250) if images_differ else (250, 10, 10), (10, 200, 10)]
    completions = ["It rises.", "A dip then a rise to the end.", "Flat", "Up and down.", "It falls at the end.",
                   "Steady", "Peaks early.", "Ends high after a long climb."]
    group_of = [0, 0, 0, 1, 1, 1, 2, 2]            # G=3, 3 and 2 rows per prompt
    ids, mask, keep, mm = vlm_batch(proc, [prompts[g] for g in group_of], [colours[g] for g in group_of],
                                     completions)
    cmask = mask[:, -keep:].float()
    seen: list[int] = []                           # images per vision-tower call

    def count(module, args, kwargs, output):
        grid = kwargs.get("grid_thw", args[1] if len(args) > 1 else None)
        seen.append(int(grid.size(0)))

    hook = model.model.visual.register_forward_hook(count, with_kwargs=True)
    try:
        ref_lp, ref_ent, _ = trl_pass(model, ids, mask, keep, **mm)
        ref_grads = _grads(model, ref_lp, cmask)
        trl_images = int(mm["image_grid_thw"].size(0))
        lp, ent, groups = shared_prefix_logps_qwen_vl(model, ids, mask, keep, compute_entropy=True, **mm)
        grads = _grads(model, lp, cmask)
    finally:
        hook.remove()
    expected_groups = 3 if images_differ else 2   # equal text and equal pixels share one prompt pass
    assert groups == expected_groups and trl_images == 8
    assert seen == [8, expected_groups]            # TRL's pass encodes every row's image, ours each group's once
    assert torch.allclose(lp * cmask, ref_lp * cmask, atol=2e-4), (lp - ref_lp).abs().max()
    assert torch.allclose(ent * cmask, ref_ent * cmask, atol=2e-4)
    visual = [n for n in ref_grads if ".visual." in f".{n}"]
    assert visual and set(grads) == set(ref_grads)
    for name, g in ref_grads.items():
        scale = g.abs().max().clamp(min=1e-6)
        assert (grads[name] - g).abs().max() / scale < 2e-3, name
