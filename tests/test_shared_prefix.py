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


def test_vision_language_policies_keep_trls_pass_even_on_text_rows():
    """Qwen-VL's 3-D rope positions come from the whole row: a split pass on a text-only batch of a VLM
    policy fails inside the model (the lineup recipe trains VLM policies on printed series), so it must
    not be chosen for them."""
    from types import SimpleNamespace

    from transformers import LlamaConfig, Qwen2_5_VLConfig

    from captionrl.train.shared_prefix import shared_prefix_reason

    args = SimpleNamespace(gradient_checkpointing=False, num_generations=4)
    vlm = SimpleNamespace(args=args, model=SimpleNamespace(config=Qwen2_5_VLConfig()))
    assert "vision-language" in shared_prefix_reason(vlm)
    text = SimpleNamespace(args=args, model=SimpleNamespace(config=LlamaConfig()))
    assert shared_prefix_reason(text) is None
