"""The shared-prompt forward equals TRL's own log-prob pass: per-token log-probs and parameter gradients.

TRL's ``RLOOTrainer._get_per_token_logps_and_entropies`` (the real function, called on the real model with
TRL's fused LM head) is the reference; ours computes each group's prompt once and reuses its cache.
The batch is what TRL builds: left-padded prompts of different lengths (two groups of four rows), right-
padded completions of different lengths.
"""

from __future__ import annotations

import types

import pytest
import torch

pytestmark = pytest.mark.slow


def _batch(tok, prompts, completions, group):
    """TRL's layout: prompts left-padded, completions right-padded, ``group`` rows per prompt."""
    p_ids = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)
             for p in prompts]
    p_ids = [list(x["input_ids"]) if isinstance(x, dict) or hasattr(x, "keys") else list(x) for x in p_ids]
    c_ids = [tok(c, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for c in completions]
    P, C = max(map(len, p_ids)), max(map(len, c_ids))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    rows, masks = [], []
    for r, c in enumerate(c_ids):
        p = p_ids[r // group]
        rows.append([pad] * (P - len(p)) + p + c + [pad] * (C - len(c)))
        masks.append([0] * (P - len(p)) + [1] * (len(p) + len(c)) + [0] * (C - len(c)))
    return torch.tensor(rows), torch.tensor(masks), C


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


def _trl_pass(model, ids, mask, keep):
    from accelerate import Accelerator
    from trl import RLOOTrainer

    owner = types.SimpleNamespace(accelerator=Accelerator(cpu=True))
    return RLOOTrainer._get_per_token_logps_and_entropies(owner, model, ids, mask, keep, compute_entropy=True)


def _grads(model, logps, mask):
    model.zero_grad(set_to_none=True)
    (logps * mask).sum().backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


PROMPTS = ["Describe this time series: 1.0, 2.5, 3.1, 2.2, 1.9, 4.4", "Describe: 7, 7, 8"]
COMPLETIONS = ["The series rises to 4.4 at the end.", "It peaks at 4.4.", "It falls then rises, ending at 4.4 after a dip.",
               "Flat.", "The values stay near 7 and end at 8.", "Seven, seven, eight.", "It ends higher.",
               "A small rise from 7 to 8 at the last step."]


def test_logps_entropies_and_gradients_equal_trl(policy):
    from captionrl.train.shared_prefix import shared_prefix_logps

    model, tok = policy
    ids, mask, keep = _batch(tok, PROMPTS, COMPLETIONS, group=4)
    cmask = mask[:, -keep:].float()
    ref_lp, ref_ent, _ = _trl_pass(model, ids, mask, keep)
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
    from captionrl.train.shared_prefix import shared_prefix_logps

    model, tok = policy
    ids, mask, keep = _batch(tok, [f"Series {i}: {i}, {i + 1}" for i in range(3)], COMPLETIONS[:3], group=1)
    cmask = mask[:, -keep:].float()
    with torch.no_grad():
        ref_lp, _, _ = _trl_pass(model, ids, mask, keep)
        lp, _, prompts = shared_prefix_logps(model, ids, mask, keep)
    assert prompts == 3
    assert torch.allclose(lp * cmask, ref_lp * cmask, atol=2e-4)


def test_generation_on_the_shared_prefill_equals_plain_generation(policy):
    """Greedy captions from the once-per-group prefill are the captions of TRL's plain ``generate``."""
    from captionrl.train.shared_prefix import share_generation_prefill

    model, tok = policy
    ids, mask, keep = _batch(tok, PROMPTS, COMPLETIONS, group=4)
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


def test_only_vision_language_models_outside_the_qwen_vl_family_keep_trls_pass(tiny_vlm):
    """Qwen-VL policies take the shared pass (their positions are computed for the full rows); a VLM of
    another family keeps TRL's pass, with the reason recorded."""
    from types import SimpleNamespace

    from transformers import LlamaConfig, LlavaConfig

    from captionrl.train.shared_prefix import shared_prefix_reason

    args = SimpleNamespace(gradient_checkpointing=False, num_generations=4)
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
    from captionrl.train.shared_prefix import shared_prefix_logps_qwen_vl

    model, proc = tiny_vlm
    ids, mask, keep = _batch(proc.tokenizer, PROMPTS, COMPLETIONS, group=4)
    model.model.rope_deltas = torch.zeros((5, 1), dtype=torch.long)   # stale, from a batch of 5
    cmask = mask[:, -keep:].float()
    with torch.no_grad():
        ref_lp, _, _ = _trl_pass(model, ids, mask, keep)
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


def _vlm_batch(proc, prompts, images, completions):
    """TRL's multimodal layout: the processor pads the prompts (left) and makes the pixel inputs; completions
    are right-padded and ``mm_token_type_ids`` extended with zeros over them (``RLOOTrainer._generate_and_score``)."""
    from PIL import Image

    texts = [proc.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": p}]}],
                                      add_generation_prompt=True, tokenize=False) for p in prompts]
    pics = [[Image.new("RGB", (56, 56), colour)] for colour in images]
    enc = proc(images=pics, text=texts, padding=True, return_tensors="pt")
    tok = proc.tokenizer
    c_ids = [tok(c, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for c in completions]
    C = max(map(len, c_ids))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    rows = torch.tensor([c + [pad] * (C - len(c)) for c in c_ids])
    cmask = torch.tensor([[1] * len(c) + [0] * (C - len(c)) for c in c_ids])
    owner = torch.arange(len(completions))
    ids = torch.cat([enc["input_ids"][owner], rows], dim=1)
    mask = torch.cat([enc["attention_mask"][owner], cmask], dim=1)
    per_row = torch.split(enc["pixel_values"], [int(g.prod()) for g in enc["image_grid_thw"]])
    multimodal = {"pixel_values": torch.cat([per_row[o] for o in owner.tolist()]),
                  "image_grid_thw": enc["image_grid_thw"][owner], "num_images": [1] * len(completions)}
    if "mm_token_type_ids" in enc:
        mm = enc["mm_token_type_ids"][owner]
        multimodal["mm_token_type_ids"] = torch.cat([mm, mm.new_zeros(rows.shape)], dim=1)
    return ids, mask, C, multimodal


@pytest.mark.parametrize("images_differ", [True, False])
@pytest.mark.gpu_pins
def test_qwen_vl_with_images_equals_trl_and_runs_the_vision_tower_once_per_group(tiny_vlm, images_differ):
    """Per-token log-probs, entropies and every parameter's gradient (the vision tower's included) equal TRL's
    pass on a tiny Qwen-VL with an image per row, left-padded prompts of two lengths and right-padded
    completions; the vision tower sees one image per group instead of one per row. Two groups with the same
    instruction and different charts must stay apart (their placeholder tokens are equal, their pixels not)."""
    from captionrl.train.shared_prefix import shared_prefix_logps_qwen_vl

    model, proc = tiny_vlm
    prompts = ["Describe this chart.", "Describe this chart.", "Describe this chart in detail, please."]
    colours = [(250, 10, 10), (10, 10, 250) if images_differ else (250, 10, 10), (10, 200, 10)]
    completions = ["It rises.", "A dip then a rise to the end.", "Flat", "Up and down.", "It falls at the end.",
                   "Steady", "Peaks early.", "Ends high after a long climb."]
    group_of = [0, 0, 0, 1, 1, 1, 2, 2]            # G=3, 3 and 2 rows per prompt
    ids, mask, keep, mm = _vlm_batch(proc, [prompts[g] for g in group_of], [colours[g] for g in group_of],
                                     completions)
    cmask = mask[:, -keep:].float()
    seen: list[int] = []                           # images per vision-tower call

    def count(module, args, kwargs, output):
        grid = kwargs.get("grid_thw", args[1] if len(args) > 1 else None)
        seen.append(int(grid.size(0)))

    hook = model.model.visual.register_forward_hook(count, with_kwargs=True)
    try:
        ref_lp, ref_ent, _ = _trl_pass_mm(model, ids, mask, keep, mm)
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


def _trl_pass_mm(model, ids, mask, keep, multimodal):
    from accelerate import Accelerator
    from trl import RLOOTrainer

    owner = types.SimpleNamespace(accelerator=Accelerator(cpu=True))
    return RLOOTrainer._get_per_token_logps_and_entropies(owner, model, ids, mask, keep, compute_entropy=True,
                                                          **multimodal)
