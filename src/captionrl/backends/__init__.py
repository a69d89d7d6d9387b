"""Backends: how text is produced and scored. Build one from a ``BackendConfig`` with ``make_backend``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from captionrl.backends.base import Backend, ChatRequest, ChoiceResult, Generation, Message
from captionrl.config import help_field
from captionrl.errors import ConfigError
from captionrl.registry import Registry

BACKENDS: Registry[Any] = Registry("backend.kind")
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high")
"""``reasoning_effort`` values the providers document: OpenAI's (minimal, low, medium, high) and Gemini's
OpenAI-compatible endpoint's (none, low, medium, high)."""


@dataclass
class BackendConfig:
    """Which model serves a role (policy sampler, verifier, judge, teacher...) and how to reach it."""

    kind: str = help_field("hf", "hf (in-process transformers), openai (any OpenAI-compatible server) or vllm (in-process vllm.LLM)")
    model: str = help_field("embedded", "hf: 'embedded', an HF folder, a .gguf file or a hub id; openai/vllm: the served model name")
    base_url: str | list[str] | None = help_field(None, "openai: server URL, e.g. http://127.0.0.1:8000/v1; replicas of one model: a list, or URLs separated by '|' (least-loaded routing, failover)")
    api_key_env: str = help_field("OPENAI_API_KEY", "openai: environment variable holding the API key (optional for local servers)")
    device: str = help_field("cpu", "hf: cpu, cuda, cuda:N or auto")
    dtype: str = help_field("auto", "hf: auto (bf16 on GPUs and CPUs with native bf16, float32 elsewhere), float32, bfloat16 or float16")
    batch_size: int = help_field(8, "hf: requests per forward pass")
    constrain: bool = help_field(True, "hf: decode a JSON role's reply under its schema (xgrammar); false only to measure unconstrained decoding")
    concurrency: int = help_field(8, "openai: requests in flight at once")
    timeout_s: float = help_field(120.0, "openai: seconds before a request is abandoned and retried")
    max_retries: int = help_field(3, "openai: retries on 429/5xx/connection errors (exponential backoff)")
    echo_prefix: str = help_field("", "openai: text sent before every echo prompt and never scored; llama-cpp-python needs the model's BOS (SmolLM2: <|im_start|>)")
    backoff_s: float = help_field(0.5, "openai: first retry wait in seconds, doubled each retry")
    cooldown_s: float = help_field(10.0, "openai replicas: seconds a replica that failed (connection error, timeout) is left out before it is tried again")
    loglikelihood_api: str = help_field("echo", "openai: how to get prompt log-probs: echo (completions echo+logprobs) or prompt_logprobs (vLLM)")
    gpu_memory_utilization: float = help_field(0.3, "vllm: share of the GPU's memory vllm.LLM may take (weights and KV cache), in (0, 1). vLLM's own default, 0.9, leaves a trainer on the same GPU nothing; 0.3 is TRL's colocate default")
    max_model_len: int | None = help_field(16384, "vllm: longest prompt + reply in tokens (sizes the KV cache; must not exceed the model's context); null: the model's full context, e.g. 262,144 for Qwen3-VL, whose KV cache alone may not fit beside a trainer")
    enforce_eager: bool = help_field(False, "vllm: true skips CUDA-graph capture (less memory and a faster start, slower decoding)")
    reasoning: bool = help_field(False, "openai: a reasoning model behind an API that takes only its default sampling (OpenAI GPT-5 and o-series; Gemini 2.5 through its OpenAI-compatible endpoint): the token limit is sent as max_completion_tokens, temperature and top_p are left out, stop strings are applied to the reply here, and choose() generates and parses (no log-probs). docs/backends.md, 'Reasoning models'")
    reasoning_effort: str | None = help_field(None, "openai, reasoning models: sent as reasoning_effort (OpenAI: minimal, low, medium, high; Gemini's OpenAI endpoint: none, low, medium, high, i.e. thinking budgets of 0, 1,024, 8,192 and 24,576 tokens); null sends none (the provider's default)")
    reasoning_budget: int = help_field(0, "openai, reasoning models: tokens of thinking the limit allows on top of a request's reply length (the provider counts reasoning tokens against max_completion_tokens: without room a 1,024-token caption comes back empty or cut)")
    startup_timeout_s: float | None = help_field(None, "openai: seconds to wait, before the first request, for a server that is still starting (refuses connections or answers 502/503/504); null = the command's default: 600 for training and rubric building (servers often start alongside them: vLLM listens only once its weights are loaded), 5 for one-shot commands; 0 = one probe")

    def __post_init__(self) -> None:
        if isinstance(self.base_url, (list, tuple)):  # one string keeps configs hashable: a|b
            self.base_url = "|".join(str(u) for u in self.base_url)
        if self.kind not in ("hf", "openai", "vllm"):
            from captionrl.registry import suggest

            raise ConfigError("backend.kind", self.kind, "unknown backend", suggest(self.kind, ["hf", "openai", "vllm"]))
        if self.kind == "openai" and not self.base_url:
            raise ConfigError(
                "backend.base_url", self.base_url, "an openai backend needs the server's URL",
                "set base_url: http://HOST:PORT/v1 (start the server first, e.g. vllm serve MODEL)",
            )
        if self.batch_size < 1:
            raise ConfigError("backend.batch_size", self.batch_size, "must be >= 1", "set batch_size: 8")
        if self.concurrency < 1:
            raise ConfigError("backend.concurrency", self.concurrency, "must be >= 1", "set concurrency: 8")
        if self.loglikelihood_api not in ("echo", "prompt_logprobs"):
            raise ConfigError("backend.loglikelihood_api", self.loglikelihood_api, "unknown API",
                              "use echo or prompt_logprobs")
        if isinstance(self.gpu_memory_utilization, bool) or not isinstance(self.gpu_memory_utilization, (int, float)) \
                or not 0 < self.gpu_memory_utilization < 1:
            raise ConfigError("backend.gpu_memory_utilization", self.gpu_memory_utilization,
                              "must be a share of the GPU's memory between 0 and 1",
                              "set gpu_memory_utilization: 0.3 (leave the rest to the trainer and other models)")
        if self.max_model_len is not None and (isinstance(self.max_model_len, bool)
                                               or not isinstance(self.max_model_len, int) or self.max_model_len < 1):
            raise ConfigError("backend.max_model_len", self.max_model_len, "must be a token count >= 1 or null",
                              "set max_model_len: 16384 (the longest prompt + reply the judge sees), or null for the "
                              "model's full context")
        if self.reasoning_effort is not None and self.reasoning_effort not in REASONING_EFFORTS:
            from captionrl.registry import suggest

            raise ConfigError("backend.reasoning_effort", self.reasoning_effort, "unknown effort",
                              suggest(str(self.reasoning_effort), list(REASONING_EFFORTS)))
        if (self.reasoning_effort is not None or self.reasoning_budget) and not self.reasoning:
            raise ConfigError("backend.reasoning_effort" if self.reasoning_effort is not None else "backend.reasoning_budget",
                              self.reasoning_effort if self.reasoning_effort is not None else self.reasoning_budget,
                              "applies to reasoning models only",
                              "set reasoning: true too (the model takes max_completion_tokens), or remove it")
        if isinstance(self.reasoning_budget, bool) or not isinstance(self.reasoning_budget, int) or self.reasoning_budget < 0:
            raise ConfigError("backend.reasoning_budget", self.reasoning_budget, "must be a token count >= 0",
                              "set reasoning_budget: 8192 (thinking room on top of each reply's length)")
        if self.startup_timeout_s is not None and not self.startup_timeout_s >= 0:
            raise ConfigError("backend.startup_timeout_s", self.startup_timeout_s, "must be >= 0 seconds (or null)",
                              "set startup_timeout_s: 600 (0 = one probe, null = the command's default)")

    def vllm_engine_args(self) -> dict[str, Any]:
        """The memory settings ``vllm.LLM`` is built with (kind ``vllm``); no ``max_model_len``: the model's."""
        args: dict[str, Any] = {"gpu_memory_utilization": float(self.gpu_memory_utilization),
                                "enforce_eager": bool(self.enforce_eager)}
        if self.max_model_len is not None:
            args["max_model_len"] = self.max_model_len
        return args


@BACKENDS.register("hf")
def _make_hf(cfg: BackendConfig) -> Backend:
    from captionrl.backends.hf import HFBackend

    return HFBackend(cfg.model, device=cfg.device, dtype=cfg.dtype, batch_size=cfg.batch_size, constrain=cfg.constrain)


@BACKENDS.register("openai")
def _make_openai(cfg: BackendConfig) -> Backend:
    from captionrl.backends.openai_http import OpenAIBackend

    return OpenAIBackend.from_config(cfg)


@BACKENDS.register("vllm")
def _make_vllm(cfg: BackendConfig) -> Backend:
    from captionrl.backends.vllm_offline import VLLMBackend

    return VLLMBackend(cfg.model, gpu_memory_utilization=cfg.gpu_memory_utilization, max_model_len=cfg.max_model_len,
                       enforce_eager=cfg.enforce_eager)


def parse_backend_spec(text: str) -> BackendConfig:
    """A backend from one command-line word: the one way to name a backend everywhere.

    ``hf:embedded`` / ``hf:PATH_OR_HUB_ID`` / ``openai:URL#MODEL`` / ``openai:URL_A|URL_B#MODEL`` (replicas
    of one model) / ``vllm:MODEL``; a bare word (``tiny-vlm``, a folder) is an ``hf`` model. Any
    ``BackendConfig`` setting follows as ``,key=value`` (``hf:embedded,dtype=bfloat16,batch_size=16``;
    values are read as YAML scalars).
    """
    from captionrl.config import from_dict, parse_override

    if not isinstance(text, str) or not text.strip():
        raise ConfigError("backend", text, "is not a backend spec", "write e.g. hf:embedded or openai:http://HOST:PORT/v1#MODEL")
    head, *rest = text.strip().split(",")
    kind, _, target = head.partition(":")
    if not target:
        kind, target = "hf", head
    data: dict[str, Any] = {"kind": kind}
    if kind == "openai":
        url, _, model = target.partition("#")
        urls = [u.strip() for u in url.split("|")]  # replicas: http://a/v1|http://b/v1
        data.update(base_url=urls[0] if len(urls) == 1 else urls, model=model or "default")
    else:
        data["model"] = target
    for item in rest:
        if "=" not in item:
            raise ConfigError("backend", text, f"option {item!r} is not key=value",
                              "write options after commas, e.g. hf:embedded,dtype=bfloat16")
        key, value = parse_override(item)
        if key in ("kind", "model", "base_url"):
            raise ConfigError(f"backend.{key}", value, "is part of the spec's head, not an option",
                              "write kind:model (hf:NAME, vllm:NAME) or openai:URL#MODEL")
        data[key] = value
    return from_dict(BackendConfig, data, prefix="backend.")


def backend_from_spec(spec: str, field: str = "backend") -> Backend:
    """``make_backend(parse_backend_spec(spec))``: the backend a spec names (shared when identical).

    An ``openai`` server is asked for ``/models`` first: a command given a server that does not answer
    stops with a named error here, instead of running to the end with every judgment unscored.
    """
    from captionrl.backends.startup import probe_server

    cfg = parse_backend_spec(spec)
    probe_server(cfg, field)
    return make_backend(cfg)


_CACHE: dict[tuple, Backend] = {}


def make_backend(cfg: BackendConfig | dict[str, Any], *, shared: bool = True) -> Backend:
    """Build the backend a config describes; identical configs share one instance (one model load)."""
    if isinstance(cfg, dict):
        from captionrl.config import from_dict

        cfg = from_dict(BackendConfig, cfg, prefix="backend.")
    key = tuple(sorted(vars(cfg).items()))
    if shared and key in _CACHE:
        return _CACHE[key]
    backend = BACKENDS.get(cfg.kind)(cfg)
    if shared:
        _CACHE[key] = backend
    return backend


__all__ = [
    "BACKENDS",
    "Backend",
    "BackendConfig",
    "ChatRequest",
    "ChoiceResult",
    "Generation",
    "Message",
    "backend_from_spec",
    "make_backend",
    "parse_backend_spec",
]
