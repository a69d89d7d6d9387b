"""The backend protocol: how text is produced and scored, nothing else.

Every judge, verifier, teacher and evaluator talks to models only through these three calls, so the same
judge runs in-process (``hf``), against any OpenAI-compatible server (``openai``) or on ``vllm.LLM``.

- ``generate``: chat requests in, texts out (batch in, batch out).
- ``choose``: the probability of each answer option (letters A..K) for the *first* token of the reply,
  from one forward pass; backends fall back to generate-and-parse only when they cannot read
  probabilities, and ``ChoiceResult.method`` records which path was used.
- ``loglikelihood``: summed log-probability of a continuation given a raw-text context.

Failures of a single request never raise: the result carries ``error`` and ``None`` values, so judges
can mark the sample unscored. Only genuine model or transport failures count (``model_failure``: out of
memory after a retry at a smaller batch, a dead engine, timeouts, refused connections, HTTP errors,
unparseable replies); misuse (bad arguments, a server that lacks a needed feature, an input longer than the
model's context) and bugs in our code raise.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from captionrl.errors import EngineError, ModelCallError, ModelCallsForbiddenError, ModelOutOfMemoryError

Message = dict[str, Any]
"""A chat message: ``{"role": ..., "content": str | list[content parts]}`` (OpenAI format)."""

FORBID_ENV = "CAPTIONRL_FORBID_MODEL_CALLS"

ENGINE_ERROR_NAMES = ("EngineDeadError", "EngineGenerateError")
"""vLLM's exceptions for an engine that died or failed a request (matched by name: vLLM is imported lazily)."""


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-memory failure (CUDA's ``OutOfMemoryError``, Python's ``MemoryError``, or
    torch's CPU allocator refusing), matched without importing torch."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def as_model_failure(exc: BaseException) -> ModelCallError | None:
    """The ``ModelCallError`` ``exc`` stands for, or ``None`` when it is not a model failure (then it is a bug).

    Narrow on purpose: torch raises ``RuntimeError`` for shape and dtype bugs too, and a bug turned into
    "unscored" is a run that silently learns nothing. So only out of memory, a dead engine or a CUDA
    error other than a device-side assert (which is an index bug) count."""
    if isinstance(exc, ModelCallError):
        return exc
    text = f"{type(exc).__name__}: {exc}"
    if is_out_of_memory(exc):
        return ModelOutOfMemoryError(text)
    if type(exc).__name__ in ENGINE_ERROR_NAMES:
        return EngineError(text)
    if isinstance(exc, RuntimeError) and "CUDA error" in str(exc) and "device-side assert" not in str(exc):
        return EngineError(text)
    return None


def model_failure(exc: BaseException) -> ModelCallError:
    """Call in an ``except`` block around a model call: the failure to record as unscored, or ``exc`` itself
    re-raised (traceback kept) when it is a bug in our code."""
    failure = as_model_failure(exc)
    if failure is None:
        raise exc
    return failure


@dataclass(frozen=True)
class ChatRequest:
    """One chat-style generation request.

    ``messages`` follow the OpenAI format; an image is a content part
    ``{"type": "image", "image": <PIL.Image | path | bytes>}`` (``hf``) or ``image_url`` (``openai``);
    backends convert between the two. ``response_format`` asks a server for constrained decoding (sent
    as the OpenAI ``response_format`` field, e.g. a JSON schema; llama.cpp and vLLM honour it); backends
    that cannot constrain ignore it, so a reply is always schema-checked by its reader anyway.
    ``json_schema`` is the JSON schema the reply must follow, for backends that constrain in process
    (``hf`` decodes under it with a grammar, ``backends.structured``); servers ignore it and read
    ``response_format`` instead, whose wire form depends on the server (``judges.roles.structured``).
    """

    messages: Sequence[Message]
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    response_format: Any = field(default=None, compare=False)
    json_schema: dict[str, Any] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Generation:
    """A generated reply, or ``text=None`` with ``error`` set when the request failed."""

    text: str | None
    error: str | None = None
    finish_reason: str | None = None
    latency_s: float = 0.0
    attempts: int = 1


ChoiceMethod = Literal["logits", "top_logprobs", "generate"]


@dataclass(frozen=True)
class ChoiceResult:
    """Probabilities over answer options for one multiple-choice prompt.

    ``probs`` is normalised over the options (``None`` when the call failed). ``mass`` is the raw
    probability the model put on the options before normalisation (1.0 on the generate path): a low mass
    says the model mostly wanted to answer something else. ``choice`` is the argmax option.
    """

    probs: dict[str, float] | None
    method: ChoiceMethod
    mass: float | None = None
    raw: str | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def choice(self) -> str | None:
        if not self.probs:
            return None
        return max(self.probs, key=lambda k: self.probs[k])  # type: ignore[index]


@runtime_checkable
class Backend(Protocol):
    """What every backend provides. ``name`` identifies the model in records."""

    name: str

    def generate(self, requests: Sequence[ChatRequest]) -> list[Generation]: ...

    def choose(
        self, prompts: Sequence[Sequence[Message]], options: Sequence[str]
    ) -> list[ChoiceResult]: ...

    def loglikelihood(self, pairs: Sequence[tuple[str, str]]) -> list[float | None]: ...


def model_calls_forbidden() -> bool:
    return os.environ.get(FORBID_ENV, "").strip().lower() not in ("", "0", "false", "no")


def check_model_calls_allowed(backend: str) -> None:
    """Raise when the request switch forbids real model calls (set in unit tests that must not make them)."""
    if model_calls_forbidden():
        raise ModelCallsForbiddenError(
            f"{FORBID_ENV} is set, so backend {backend!r} may not call a model. "
            f"Unset {FORBID_ENV} (or set it to 0) to allow real model calls."
        )


def option_letters(k: int) -> list[str]:
    """The first ``k`` capital letters: the option labels of a K-way question."""
    if not 2 <= k <= 26:
        from captionrl.errors import ConfigError

        raise ConfigError("K", k, "must be between 2 and 26 (options are the letters A..Z)", "set K to 2..26")
    return [chr(ord("A") + i) for i in range(k)]


def normalise_option_probs(
    raw: dict[str, float], options: Sequence[str]
) -> tuple[dict[str, float] | None, float]:
    """Normalise non-negative per-option probabilities; returns (probs, mass). ``None`` if mass is 0."""
    mass = float(sum(raw.get(o, 0.0) for o in options))
    if mass <= 0.0:
        return None, 0.0
    return {o: raw.get(o, 0.0) / mass for o in options}, mass


def parse_choice(text: str, options: Sequence[str]) -> str | None:
    """Parse an option from a generated answer ("B", "(B)", "Answer: B", "B. because...")."""
    import re

    if not text:
        return None
    opts = {o.upper(): o for o in options}
    stripped = text.strip()
    m = re.match(r"^\W*([A-Za-z])\b", stripped)
    if m and m.group(1).upper() in opts:
        return opts[m.group(1).upper()]
    m = re.search(r"(?:answer|option|choice)\s*(?:is|:)?\s*\(?([A-Za-z])\b\)?", stripped, re.IGNORECASE)
    if m and m.group(1).upper() in opts:
        return opts[m.group(1).upper()]
    return None
