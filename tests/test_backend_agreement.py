"""The same model through two backends gives the same decisions.

``hf`` runs the embedded SmolLM2-135M dequantised to fp32 in process; ``openai`` reaches the same weights
as the Q4_1 GGUF through a real llama.cpp server. Quantisation moves probabilities by a few hundredths,
so the test compares decisions and rankings, and bounds the differences by what we measured
(largest option-probability gap 0.06, largest log-likelihood gap 0.12 nats).
"""

from __future__ import annotations

import itertools

import pytest

from captionrl.backends.openai_http import OpenAIBackend
from servers import LlamaServer, requires_llama_cpp

OPTIONS = ["A", "B", "C", "D"]
PROMPTS = {
    # Measured (llama.cpp Q4_1 vs hf fp32): argmax A 0.46/0.49 (position bias: the model answers A to MCQs),
    # C 0.62/0.56, D 0.69/0.66, B 0.55/0.57.
    "fruit_mcq": "Which of these is a fruit?\nA) car\nB) apple\nC) house\nD) shoe\nAnswer with the letter only.",
    "type_c": "Type the letter C and nothing else.",
    "single_d": "Reply with the single letter D.",
    "told_b": "The correct option is B. Reply with the correct option's letter only.",
}
ORDER_GAP = 0.05
"""Two options are ordered only when hf separates them by more than this; closer ones are ties."""


@pytest.mark.slow
@pytest.mark.server
@requires_llama_cpp
def test_choose_rankings_agree(embedded_backend, llama_server: LlamaServer):
    prompts = [[{"role": "user", "content": p}] for p in PROMPTS.values()]
    hf = embedded_backend.choose(prompts, OPTIONS)
    http = llama_server.backend().choose(prompts, OPTIONS)
    for name, h, o in zip(PROMPTS, hf, http, strict=True):
        print(f"{name}: hf {_fmt(h.probs)} mass {h.mass:.3f} | llama.cpp {_fmt(o.probs)} mass {o.mass:.3f}")
        assert (h.method, o.method) == ("logits", "top_logprobs")
        assert o.choice == h.choice, name
        for x, y in itertools.combinations(OPTIONS, 2):
            if o.probs[x] > 0 and o.probs[y] > 0 and abs(h.probs[x] - h.probs[y]) > ORDER_GAP:
                assert (h.probs[x] > h.probs[y]) == (o.probs[x] > o.probs[y]), (name, x, y)
        for opt in OPTIONS:
            # llama.cpp reports only the top-20 first tokens: an absent option reads 0 and must be rare in hf.
            bound = 0.1 if o.probs[opt] > 0 else 0.05
            assert abs(h.probs[opt] - o.probs[opt]) < bound, (name, opt, h.probs, o.probs)
    assert {h.choice for h in hf} == set(OPTIONS)  # the prompts exercise every option, not only the A bias


@pytest.mark.slow
@pytest.mark.server
@requires_llama_cpp
def test_loglikelihood_agrees(embedded_backend, llama_server: LlamaServer):
    pairs = [("The capital of France is", " Paris"), ("The capital of France is", " Berlin")]
    http: OpenAIBackend = llama_server.backend()
    via_http = http.loglikelihood(pairs)
    # The echo path starts every prompt with BOS (see servers.py); give hf the same context.
    in_proc = embedded_backend.loglikelihood([(http.echo_prefix + c, x) for c, x in pairs])
    print(f"loglikelihood hf {in_proc} | llama.cpp {via_http} | probe {http.echo_alignment:.3f}")
    assert via_http[0] > via_http[1] and in_proc[0] > in_proc[1]
    for a, b in zip(in_proc, via_http, strict=True):
        assert abs(a - b) < 0.5


def _fmt(probs: dict[str, float] | None) -> str:
    return "None" if probs is None else " ".join(f"{k}={v:.3f}" for k, v in probs.items())
