"""``train.run.compact_head``: on CPU, TRL's fused LM head then projects only the labelled positions, and gives the
same log-probabilities, entropies and gradients as when it projects every position; the rebinding is undone."""

from __future__ import annotations

import torch

from captionrl.train.run.compact_head import compact_on_cpu


def _fused(tiny_llama: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    return model


def _pass(model: torch.nn.Module, rows_seen: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probs, entropies and the first block's gradient of one fused pass over a right-padded batch whose
    labels are each row's last tokens (a caption after its prompt); ``rows_seen`` gets the kernel's row count."""
    import trl.trainer.utils as trl_utils

    kernel = trl_utils._ChunkedLogProbFunction

    class Counting(kernel):
        @staticmethod
        def forward(ctx, hidden, *args):
            rows_seen.append(hidden.shape[0])
            return kernel.forward(ctx, hidden, *args)

    g = torch.Generator().manual_seed(2)
    ids = torch.randint(5, 200, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :7] = -100  # the prompt
    model.zero_grad()
    trl_utils._ChunkedLogProbFunction = Counting
    try:
        out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    finally:
        trl_utils._ChunkedLogProbFunction = kernel
    out.loss.backward()
    grad = model.model.layers[0].self_attn.q_proj.weight.grad.clone()
    return out.log_probs.detach(), out.entropy.detach(), grad


def test_the_compact_head_scores_only_the_labelled_positions_with_the_same_results(tiny_llama):
    model = _fused(tiny_llama)
    every: list[int] = []
    want = _pass(model, every)
    compact: list[int] = []
    with compact_on_cpu():
        got = _pass(model, compact)
    assert every == [3 * 11]  # every shifted position of the 3 rows
    assert compact == [5 + 2 + 5]  # only those with a label: rows 0 and 2 score 5 caption tokens, row 1 (padded) 2
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert got[0].abs().sum() > 0 and got[2].abs().sum() > 0  # real values, not two passes of zeros


def test_the_rebinding_is_undone_and_gpu_devices_keep_trl_choice():
    import trl.kernels.chunked_logprob as kernels
    import trl.trainer.utils as trl_utils

    before = trl_utils._use_triton
    with compact_on_cpu():
        assert trl_utils._use_triton(torch.device("cpu")) is True
        assert trl_utils._use_triton(torch.device("meta")) is before(torch.device("meta"))
        assert kernels._use_triton(torch.device("cpu")) is False  # the kernel still runs its CPU fallback
    assert trl_utils._use_triton is before
