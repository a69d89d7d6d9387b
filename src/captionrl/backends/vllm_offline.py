"""``vllm.LLM`` in this process (GPU machines): the fastest way to run a judge next to a trainer.

Kept thin on purpose: vLLM is not installable on the CPU machines we test on, so everything here is a
direct mapping of the three backend calls onto vLLM's public API, imported lazily so that importing
captionrl never needs vLLM. ``generate`` uses ``LLM.chat``; ``choose`` reads the first token's
``logprobs``; ``loglikelihood`` reads ``prompt_logprobs`` on token ids, so the context/continuation
boundary is exact. Single failures come back as ``None`` with the error, as in every backend.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from captionrl.backends.base import (
    ChatRequest,
    ChoiceResult,
    Generation,
    Message,
    check_model_calls_allowed,
    model_failure,
)
from captionrl.backends.openai_http import option_probs_from_top, to_openai_messages
from captionrl.errors import BackendError

INSTALL_HINT = "pip install 'captionrl[vllm]' (needs a CUDA GPU and a matching torch)"


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise BackendError(f"backend kind 'vllm' needs the vllm package ({exc}). Fix: {INSTALL_HINT}, "
                           "or use kind 'openai' against a `vllm serve` server") from exc
    return vllm


MEMORY_SETTINGS = ("gpu_memory_utilization", "max_model_len", "enforce_eager")
"""``vllm.LLM`` arguments that ``BackendConfig`` validates and gives defaults safe beside a trainer."""


class VLLMBackend:
    """A model loaded by ``vllm.LLM`` (built on first use; extra keyword arguments go to ``vllm.LLM``).

    The memory settings (``MEMORY_SETTINGS``) default to ``BackendConfig``'s, not to vLLM's: vLLM takes 0.9
    of the GPU and the model's full context by default, which leaves a trainer on the same GPU nothing."""

    def __init__(self, model: str, *, top_logprobs: int = 20, fold_case: bool = True, **llm_kwargs: Any) -> None:
        from captionrl.backends import BackendConfig

        memory = {k: llm_kwargs.pop(k) for k in MEMORY_SETTINGS if k in llm_kwargs}
        engine = BackendConfig(kind="vllm", model=model, **memory).vllm_engine_args()  # validated
        self._vllm = _import_vllm()
        self.model_spec = model
        self.top_logprobs = top_logprobs
        self.fold_case = fold_case
        self.llm_kwargs = {**engine, **llm_kwargs}
        self._llm: Any = None
        self.name = f"vllm:{model}"
        self.last_errors: list[str | None] = []

    @property
    def llm(self) -> Any:
        if self._llm is None:
            check_model_calls_allowed(self.name)
            self._llm = self._vllm.LLM(model=self.model_spec, **self.llm_kwargs)
        return self._llm

    def _params(self, **kw: Any) -> Any:
        return self._vllm.SamplingParams(**kw)

    def generate(self, requests: Sequence[ChatRequest]) -> list[Generation]:
        """One ``LLM.chat`` call per group of requests with the same sampling settings (vLLM batches it)."""
        check_model_calls_allowed(self.name)
        out: list[Generation | None] = [None] * len(requests)
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault((r.max_new_tokens, r.temperature, r.top_p, r.seed, r.stop), []).append(i)
        for (max_new, temperature, top_p, seed, stop), idx in groups.items():
            t0 = time.perf_counter()
            try:
                params = self._params(max_tokens=max_new, temperature=temperature, top_p=top_p, seed=seed,
                                      stop=list(stop) or None)
                res = self.llm.chat([to_openai_messages(requests[i].messages) for i in idx], params, use_tqdm=True)
            except Exception as exc:  # a failing group must not lose the others; bugs re-raise
                error = str(model_failure(exc))
                for i in idx:
                    out[i] = Generation(None, error=error)
                continue
            dt = (time.perf_counter() - t0) / len(idx)
            for i, o in zip(idx, res, strict=True):
                out[i] = Generation(o.outputs[0].text, finish_reason=o.outputs[0].finish_reason, latency_s=dt)
        return [g for g in out if g is not None]

    def choose(self, prompts: Sequence[Sequence[Message]], options: Sequence[str]) -> list[ChoiceResult]:
        check_model_calls_allowed(self.name)
        option_probs_from_top([], options, self.fold_case)
        params = self._params(max_tokens=1, temperature=0.0, logprobs=self.top_logprobs)
        try:
            outs = self.llm.chat([to_openai_messages(p) for p in prompts], params, use_tqdm=True)
        except Exception as exc:  # model_failure re-raises anything that is a bug
            error = str(model_failure(exc))
            return [ChoiceResult(None, "top_logprobs", error=error) for _ in prompts]
        results = []
        for o in outs:
            first = (o.outputs[0].logprobs or [{}])[0]
            top = [(lp.decoded_token or "", lp.logprob) for lp in first.values()]
            probs, mass = option_probs_from_top(top, options, self.fold_case)
            error = None if probs else "no option among the top first tokens"
            results.append(ChoiceResult(probs, "top_logprobs", mass=mass, raw=o.outputs[0].text, error=error))
        return results

    def loglikelihood(self, pairs: Sequence[tuple[str, str]]) -> list[float | None]:
        """Summed log p(continuation | context) from ``prompt_logprobs`` (whitespace moved as in ``hf``)."""
        check_model_calls_allowed(self.name)
        tok = self.llm.get_tokenizer()
        prompts, bounds = [], []
        for ctx, cont in pairs:
            stripped = ctx.rstrip()
            ctx_ids = tok(stripped, add_special_tokens=True)["input_ids"]
            cont_ids = tok(ctx[len(stripped):] + cont, add_special_tokens=False)["input_ids"]
            prompts.append({"prompt_token_ids": ctx_ids + cont_ids})
            bounds.append(len(ctx_ids))
        values: list[float | None] = []
        self.last_errors = []
        try:
            outs = self.llm.generate(prompts, self._params(max_tokens=1, prompt_logprobs=0), use_tqdm=True)
        except Exception as exc:  # model_failure re-raises anything that is a bug
            self.last_errors = [str(model_failure(exc))] * len(pairs)
            return [None] * len(pairs)
        for p, start, o in zip(prompts, bounds, outs, strict=True):
            ids = p["prompt_token_ids"]
            try:
                values.append(float(sum(o.prompt_logprobs[i][ids[i]].logprob for i in range(start, len(ids)))))
                self.last_errors.append(None)
            except (KeyError, IndexError, TypeError) as exc:
                values.append(None)
                self.last_errors.append(f"prompt_logprobs missing ({type(exc).__name__}: {exc})")
        return values
