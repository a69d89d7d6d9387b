"""The in-process backend on the real embedded model: generate, choose, loglikelihood, prefix sharing."""

from __future__ import annotations

import math

import pytest
import torch

from captionrl.backends.base import FORBID_ENV, ChatRequest
from captionrl.backends.hf import HFBackend, _prefix_runs
from captionrl.errors import ConfigError, ModelCallsForbiddenError

pytestmark = pytest.mark.slow

RISING = "Time series: " + ", ".join(str(i) for i in range(1, 21)) + "\nDescription of this time series:"


def test_generate_batch_returns_one_text_per_request(embedded_backend):
    reqs = [
        ChatRequest([{"role": "user", "content": "What is the capital of France? Answer in one word."}], max_new_tokens=12),
        ChatRequest([{"role": "user", "content": "Say hello."}], max_new_tokens=12),
    ]
    out = embedded_backend.generate(reqs)
    assert len(out) == 2
    assert all(g.text is not None and g.error is None for g in out)
    assert "paris" in out[0].text.lower()


def test_choose_returns_normalised_letter_probabilities(embedded_backend):
    prompt = [{"role": "user", "content": "Which is a fruit?\nA. car\nB. apple\nC. chair\nD. road\nAnswer with the letter."}]
    (res,) = embedded_backend.choose([prompt], list("ABCD"))
    assert res.method == "logits" and res.error is None
    assert set(res.probs) == set("ABCD")
    assert math.isclose(sum(res.probs.values()), 1.0, rel_tol=1e-6)
    assert 0.0 < res.mass <= 1.0  # the raw probability mass the model put on the four letters


def test_choose_matches_the_next_token_distribution_of_a_plain_forward(embedded_backend):
    prompt = [{"role": "user", "content": "Pick one letter: A or B?"}]
    (res,) = embedded_backend.choose([prompt], ["A", "B"])
    text = embedded_backend.render_chat(prompt)
    ids = embedded_backend.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        probs = embedded_backend.model(input_ids=ids).logits[0, -1].float().softmax(-1)
    ids_a = embedded_backend._option_token_ids(["A", "B"])
    raw = {o: float(sum(probs[t] for t in ts)) for o, ts in ids_a.items()}
    assert res.probs["A"] == pytest.approx(raw["A"] / (raw["A"] + raw["B"]), abs=1e-4)


def test_prefix_sharing_gives_the_same_choices_as_plain_batches(embedded_backend):
    numbers = ", ".join(str(i * 3 % 17) for i in range(48))
    prompts = [[{"role": "user", "content": f"Series: {numbers}\nCaption {i}: it oscillates. Answer A or B."}] for i in range(5)]
    shared = embedded_backend.choose(prompts, ["A", "B"])
    plain = HFBackend.from_model(embedded_backend.model, embedded_backend._processor, share_prefix=False).choose(prompts, ["A", "B"])
    for s, p in zip(shared, plain, strict=True):
        assert s.probs["A"] == pytest.approx(p.probs["A"], abs=1e-4)


def test_loglikelihood_matches_a_full_forward_and_prefers_the_true_description(embedded_backend):
    pairs = [(RISING, " It rises steadily from 1 to 20."), (RISING, " It falls steadily from 20 to 1.")]
    shared = embedded_backend.loglikelihood(pairs)
    plain = HFBackend.from_model(embedded_backend.model, embedded_backend._processor, share_prefix=False).loglikelihood(pairs)
    assert shared == pytest.approx(plain, abs=1e-3)
    # Ground truth: one forward over context + continuation, summing the continuation's token log-probs.
    tok = embedded_backend.tokenizer
    ctx = tok(RISING.rstrip(), add_special_tokens=True)["input_ids"]
    cont = tok(pairs[0][1], add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        logp = embedded_backend.model(input_ids=torch.tensor([ctx + cont])).logits[0].float().log_softmax(-1)
    expected = sum(float(logp[len(ctx) - 1 + j, t]) for j, t in enumerate(cont))
    assert shared[0] == pytest.approx(expected, abs=1e-3)
    assert shared[0] > shared[1]


def test_request_switch_forbids_model_calls(embedded_backend, monkeypatch):
    monkeypatch.setenv(FORBID_ENV, "1")
    with pytest.raises(ModelCallsForbiddenError, match=FORBID_ENV):
        embedded_backend.generate([ChatRequest([{"role": "user", "content": "hi"}])])


def test_bad_settings_fail_clearly(tmp_path):
    with pytest.raises(ConfigError, match="batch_size"):
        HFBackend(batch_size=0)
    with pytest.raises(ConfigError, match="GGUF file not found"):
        HFBackend(str(tmp_path / "missing.gguf"))._ensure_loaded()


def test_prefix_runs_split_candidate_sets():
    header = list(range(20))
    a = [*header, *range(100, 160)]
    b = [*header, *range(200, 260)]
    seqs = [[*a, 1], [*a, 2], [*a, 3], [*b, 4], [*b, 5]]
    runs = _prefix_runs(seqs)
    assert runs == [(0, 3, len(a)), (3, 5, len(b))]


def test_empty_continuations_score_zero_in_shared_and_single_paths(embedded_backend):
    out = embedded_backend.loglikelihood([(RISING, ""), (RISING, " It rises."), (RISING + " x", "")])
    assert out[0] == 0.0 and out[2] == 0.0
    assert out[1] is not None and out[1] < 0


def test_duplicate_pairs_are_scored_once_with_the_same_value(embedded_backend):
    pairs = [(RISING, " It rises."), (RISING, " It falls."), (RISING, " It rises.")]
    out = embedded_backend.loglikelihood(pairs)
    assert out[0] == out[2] and out[0] != out[1]


def test_auto_dtype_load_reports_the_dtype_it_chose_and_why():
    from captionrl.devices import DTYPE_CHOICES, resolve_dtype

    backend = HFBackend("embedded", dtype="auto")
    assert backend.dtype_chosen is None  # nothing loaded yet
    backend._ensure_loaded()
    expected, reason = resolve_dtype("auto", "cpu")
    assert backend.model.dtype == expected
    assert backend.dtype_chosen == str(expected).removeprefix("torch.")
    assert backend.dtype_reason == reason and reason.startswith("auto on CPU")
    assert DTYPE_CHOICES[backend.name]["dtype"] == backend.dtype_chosen
    (res,) = backend.choose([[{"role": "user", "content": "A or B?"}]], ["A", "B"])
    assert res.probs is not None and res.error is None


@pytest.mark.slow
def test_model_failures_are_unscored_but_bugs_propagate(embedded_backend, monkeypatch):
    """An out-of-memory-like RuntimeError leaves the batch unscored with the error recorded; a TypeError
    (our bug) is not turned into an unscored result: it reaches the caller."""
    from captionrl.backends.base import ChatRequest

    req = [ChatRequest([{"role": "user", "content": "Say hello."}], max_new_tokens=2)]

    def oom(*a, **k):
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(embedded_backend, "_generate_batch", oom)
    (gen,) = embedded_backend.generate(req)
    assert gen.text is None and "out of memory" in gen.error

    def bug(*a, **k):
        raise TypeError("unsupported operand (a bug)")

    monkeypatch.setattr(embedded_backend, "_generate_batch", bug)
    with pytest.raises(TypeError, match="a bug"):
        embedded_backend.generate(req)
    monkeypatch.setattr(embedded_backend, "_last_token_probs", bug)
    with pytest.raises(TypeError):
        embedded_backend.choose([[{"role": "user", "content": "A or B?"}]], ["A", "B"])


def test_letter_scoring_fast_path_gives_the_probabilities_of_one_plain_forward_per_question(embedded_backend):
    """The identification judge's letter questions (G captions of one candidate set, K rotations) through
    ``choose``, which shares each rotation's candidate prefix and projects only the last positions onto
    the vocabulary, give the letter probabilities of one plain forward per question (float32, 1e-4)."""
    from captionrl.judges.identification import IdentificationJudge, IdentifyConfig

    class Recorder:
        name = "recorder"

        def __init__(self) -> None:
            self.prompts: list = []
            self.results: list = []

        def choose(self, prompts, options):
            self.prompts, self.results = list(prompts), embedded_backend.choose(prompts, options)
            return self.results

    cands = [[1.0, 2.0, 3.5, 5.0, 4.0, 2.5], [6.0, 5.0, 3.0, 2.0, 2.5, 1.0]]
    captions = ["It rises to 5 and falls.", "It falls from 6 to 1, with a small bump near the end of the series.", "Up."]
    rec = Recorder()
    IdentificationJudge(rec, IdentifyConfig(mode="letter", k=2, signal="soft")).judge(captions, {"candidates": [cands] * 3})
    assert len(rec.prompts) == 6  # G=3 captions x K=2 rotations, all sharing a prefix per rotation
    options = ["A", "B"]
    ids = embedded_backend._option_token_ids(options)
    for prompt, res in zip(rec.prompts, rec.results, strict=True):
        seq = embedded_backend._encode(embedded_backend.render_chat(prompt))
        with torch.inference_mode():
            probs = embedded_backend.model(input_ids=torch.tensor([seq])).logits[0, -1].float().softmax(-1)
        raw = {o: float(sum(probs[t] for t in ts)) for o, ts in ids.items()}
        assert res.probs["A"] == pytest.approx(raw["A"] / (raw["A"] + raw["B"]), abs=1e-4)
        assert res.mass == pytest.approx(raw["A"] + raw["B"], abs=1e-4)
    assert len({round(r.probs["A"], 5) for r in rec.results}) > 2  # every caption and rotation was scored
