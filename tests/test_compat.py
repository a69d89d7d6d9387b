"""``captionrl.compat``: the key/value cache read and passed under the installed transformers' names, on a
real (tiny, random) model through every path that hands a cache on: the in-process verifier's prefix
sharing, the shared-prompt loss pass and the shared generation prefill.

Marked ``gpu_pins``: ``tests/test_gpu_pins.py`` runs these again under the versions the gpu extra resolves
(transformers 5.17, which says ``past_key_values`` where the CPU install's 5.24 says ``cache``). A wrong name
is not an error there: a forward takes unknown keywords silently and runs without the cache, so each test
compares against a pass that needs no cache.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from captionrl.compat import cache_argument, cache_kwargs, installed_cache_name, output_cache

pytestmark = pytest.mark.gpu_pins

PROMPTS = ["Describe this time series: 1.0, 2.5, 3.1, 2.2, 1.9, 4.4, 5.0, 3.3", "Describe: 7, 7, 8"]
COMPLETIONS = ["It rises to 4.4.", "Peaks at 5.", "Falls then rises, ending at 3.3 after a dip.", "Flat.",
               "Near 7, ends at 8.", "Seven, seven, eight.", "Ends higher.", "A small rise from 7 to 8."]


@pytest.fixture(scope="module")
def tiny():
    """A 2-layer random Qwen2 causal LM on the tiny Qwen tokenizer (built in memory: no download, no cache)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from captionrl.tiny_models.qwen_vl import build_tokenizer

    tok = build_tokenizer("qwen2.5-vl")
    config = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    return model, tok


def test_the_names_are_the_installed_transformers(tiny):
    import transformers

    model, _ = tiny
    name = installed_cache_name()
    assert name in inspect.signature(type(model).forward).parameters
    assert cache_argument(model) == name
    if transformers.__version__ == "5.17.0":  # the gpu extra's (scripts/gpu-pins.txt)
        assert name == "past_key_values"
    out = model(input_ids=torch.tensor([[1, 2, 3]]), use_cache=True)
    assert isinstance(output_cache(out), transformers.Cache)

    def old_style(input_ids=None, past_key_values=None): ...

    def kwargs_only(**kwargs): ...

    assert cache_argument(old_style) == "past_key_values"  # a remote-code model keeps the old name
    assert cache_argument(kwargs_only) == name


def test_peft_and_ddp_wrappers_are_looked_through(tiny):
    from peft import LoraConfig, get_peft_model

    model, _ = tiny
    lora = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    try:
        assert cache_argument(lora) == installed_cache_name()  # PeftModel.forward takes **kwargs only

        class DDP(torch.nn.Module):
            def __init__(self, module):
                super().__init__()
                self.module = module

            def forward(self, *args, **kwargs):
                return self.module(*args, **kwargs)

        assert cache_argument(DDP(model)) == installed_cache_name()
    finally:
        lora.unload()


def test_a_cache_passed_on_continues_the_sequence(tiny):
    model, _ = tiny
    ids = torch.tensor([[5, 9, 13, 21, 34, 55, 89, 144]])
    with torch.no_grad():
        full = model(input_ids=ids).logits
        prefix = model(input_ids=ids[:, :5], use_cache=True)
        tail = model(input_ids=ids[:, 5:], **cache_kwargs(model, output_cache(prefix)))
    torch.testing.assert_close(tail.logits, full[:, 5:], atol=1e-5, rtol=1e-4)


def test_verifier_prefix_sharing_changes_no_score(tiny):
    """``HFBackend``'s shared prefix (``choose``, ``loglikelihood``): the same numbers as plain batches."""
    from captionrl.backends.hf import HFBackend

    model, tok = tiny
    shared = HFBackend.from_model(model, tok)
    plain = HFBackend.from_model(model, tok, share_prefix=False)
    stem = "Series A: " + ", ".join(str(i) for i in range(30)) + ". Which series is it? Answer with a letter. "
    prompts = [[{"role": "user", "content": stem + tail}] for tail in ("One.", "Two, longer.", "Three")]
    got, want = shared.choose(prompts, ["A", "B"]), plain.choose(prompts, ["A", "B"])
    assert all(r.error is None for r in got + want)
    for a, b in zip(got, want, strict=True):
        assert a.probs["A"] == pytest.approx(b.probs["A"], abs=1e-5)
    assert len({round(r.probs["A"], 6) for r in got}) > 1  # the differing suffixes were scored
    pairs = [(stem, " it rises"), (stem, " it falls and then rises again"), (stem, " flat")]
    assert shared.loglikelihood(pairs) == pytest.approx(plain.loglikelihood(pairs), abs=1e-4)


def _batch(tok, group=4):
    """TRL's layout: prompts left-padded, completions right-padded, ``group`` rows per prompt."""
    p_ids = [list(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                          tokenize=True, return_dict=True)["input_ids"]) for p in PROMPTS]
    c_ids = [tok(c, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for c in COMPLETIONS]
    P, C = max(map(len, p_ids)), max(map(len, c_ids))
    rows, masks = [], []
    for r, c in enumerate(c_ids):
        p = p_ids[r // group]
        rows.append([tok.pad_token_id] * (P - len(p)) + p + c + [tok.pad_token_id] * (C - len(c)))
        masks.append([0] * (P - len(p)) + [1] * (len(p) + len(c)) + [0] * (C - len(c)))
    return torch.tensor(rows), torch.tensor(masks), C


def test_shared_prompt_loss_pass_and_prefill_equal_trls(tiny):
    """``train.run.shared_prefix`` on the text path: log-probs equal TRL's own pass, generation its own prefill."""
    import copy
    import types

    from accelerate import Accelerator
    from trl import RLOOTrainer
    from trl.trainer.utils import add_fused_lm_head

    from captionrl.train.run.shared_prefix import share_generation_prefill, shared_prefix_logps

    base, tok = tiny
    model = copy.deepcopy(base)
    add_fused_lm_head(model, temperature=0.9, outputs=("log_probs", "entropy"))  # as RLOOTrainer does
    ids, mask, keep = _batch(tok)
    owner = types.SimpleNamespace(accelerator=Accelerator(cpu=True))
    with torch.no_grad():
        ref, ref_ent, _ = RLOOTrainer._get_per_token_logps_and_entropies(owner, model, ids, mask, keep,
                                                                        compute_entropy=True)
        lp, ent, prompts = shared_prefix_logps(model, ids, mask, keep, compute_entropy=True)
    assert prompts == 2
    cmask = mask[:, -keep:].bool()
    torch.testing.assert_close(lp[cmask], ref[cmask], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(ent[cmask], ref_ent[cmask], atol=1e-5, rtol=1e-4)

    gen = copy.deepcopy(base)
    prompt_ids, prompt_mask = ids[:, : ids.size(1) - keep], mask[:, : ids.size(1) - keep]
    kw = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": tok.pad_token_id}
    plain = gen.generate(input_ids=prompt_ids, attention_mask=prompt_mask, **kw)
    state = share_generation_prefill(gen)
    shared = gen.generate(input_ids=prompt_ids, attention_mask=prompt_mask, **kw)
    assert state == {"rows": 8, "prompts": 2}
    assert torch.equal(shared, plain)
