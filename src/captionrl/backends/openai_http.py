"""Any OpenAI-compatible server (vLLM, SGLang, llama.cpp) as a backend: async, capped, retried.

Why this shape:
- Judges run inside TRL reward functions that may be async, and inside plain scripts. Every call has an
  ``a``-prefixed coroutine and a sync twin that works with or without a running event loop (it runs the
  coroutine on a private thread's loop when one is already running).
- A single failed request (timeout, connection refused, 5xx after retries, a reply that does not parse)
  never raises and is never scored 0: it comes back as ``None`` with the error text, the number of
  attempts and the latency, so the judge marks that sample unscored.
- Misuse raises: a server that lacks the feature a call needs (prompt log-probs for ``loglikelihood``)
  raises ``BackendError`` naming the flag or server that provides it.

``loglikelihood`` over HTTP has two sources. ``echo``: ``/v1/completions`` with ``echo=true, logprobs=1``
returns the prompt tokens' log-probs (vLLM, llama-cpp-python). llama-cpp-python 0.3.36 shifts them by one
token unless the prompt starts with the model's BOS token (abetlen/llama-cpp-python#1983), so the first
echo call runs an alignment probe and refuses misaligned numbers; ``echo_prefix`` (the BOS text, e.g.
``<|im_start|>`` for SmolLM2) fixes it. ``prompt_logprobs``: vLLM's extension, on token ids from its
``/tokenize`` endpoint, exact at the context/continuation boundary.

Replicas: ``base_url`` may name several servers of the same model (a list, or ``|``-separated:
``http://a:8000/v1|http://b:8000/v1``), the normal way to scale a verifier without an external load
balancer. Each request goes to the live replica with the fewest requests in flight; a replica that
refuses connections or times out is taken out for ``cooldown_s`` seconds and the request is re-sent at
once to another replica (a retry attempt, with no backoff wait while another replica is live). After
the cool-down the replica gets requests again: if it still fails it goes out again. When every attempt
failed the result is ``None`` with the error text (never 0).
"""

from __future__ import annotations

import asyncio
import math
import re
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from captionrl.backends.base import (
    ChatRequest,
    ChoiceResult,
    Generation,
    Message,
    check_model_calls_allowed,
    normalise_option_probs,
    parse_choice,
)
from captionrl.backends.startup import probe_server  # noqa: F401  (its older home: callers import it from here)
from captionrl.errors import BackendError, ConfigError

T = TypeVar("T")

ECHO_PROBE_CONTEXT = "1, 2, 3"
ECHO_PROBE_CONTINUATION = ", 4"
ECHO_PROBE_MIN_MEAN_LOGPROB = -4.0
"""An aligned server gives a counting continuation a mean token log-prob near 0 (SmolLM2-135M Q4_1 on
llama-cpp-python with the BOS prefix: -0.41); a server whose echo log-probs are shifted by one token
scores each token under the *next* position's distribution (same server without the prefix: -12.2)."""

_FEATURE_WORDS = re.compile(r"logprob|logits_all|echo", re.IGNORECASE)
_FEATURE_VERBS = re.compile(r"support|enabl|invalid|not allowed|unknown|unrecogni|extra", re.IGNORECASE)

LOGLIKELIHOOD_HELP = (
    "loglikelihood needs prompt log-probs from the server: for loglikelihood_api='echo', a "
    "/v1/completions that honours echo=true with logprobs (vLLM; llama-cpp-python started with "
    "--logits_all true); for loglikelihood_api='prompt_logprobs', vLLM's /tokenize endpoint and "
    "prompt_logprobs. llama.cpp's C++ llama-server and `transformers serve` return no prompt log-probs"
)


@dataclass(frozen=True)
class LoglikelihoodResult:
    """One ``loglikelihood`` pair: the summed log-prob, or ``None`` with the error that prevented it."""

    value: float | None
    error: str | None = None
    attempts: int = 1
    latency_s: float = 0.0
    n_tokens: int = 0


@dataclass
class _Reply:
    """The outcome of one HTTP call after retries: parsed JSON or an error."""

    data: Any = None
    error: str | None = None
    status: int | None = None
    attempts: int = 0
    latency_s: float = 0.0
    feature_error: bool = False


@dataclass
class Replica:
    """One server of a replicated backend and what it is doing (see ``OpenAIBackend.replica_status``)."""

    url: str
    in_flight: int = 0
    served: int = 0
    failures: int = 0
    down_until: float = 0.0
    last_error: str | None = None

    def live(self, now: float) -> bool:
        return self.down_until <= now


def split_base_urls(base_url: str | Sequence[str]) -> list[str]:
    """``"http://a/v1|http://b/v1"`` or a list of URLs -> the replica URLs, each without a trailing ``/``."""
    parts = base_url.split("|") if isinstance(base_url, str) else list(base_url)
    urls = [u.strip().rstrip("/") for u in parts if isinstance(u, str) and u.strip()]
    bad = [u for u in parts if not (isinstance(u, str) and u.strip().startswith(("http://", "https://")))]
    if not urls or bad:
        raise ConfigError("backend.base_url", base_url, "must be an http(s) URL, or several separated by '|'",
                          "set base_url: http://HOST:PORT/v1 (replicas: http://A:8000/v1|http://B:8000/v1)")
    if len(set(urls)) != len(urls):
        raise ConfigError("backend.base_url", base_url, "names the same replica twice", "list each server once")
    return urls


@dataclass
class _Pending:
    """A choose prompt whose first-token log-probs were missing: answered by generate-and-parse."""

    index: int
    reason: str
    extra: dict[str, Any] = field(default_factory=dict)


def run_sync(factory: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to completion from sync code, whether or not an event loop is running here.

    Inside a running loop (a notebook, an async trainer) ``asyncio.run`` would fail, so the coroutine
    runs on a private thread with its own loop; the caller blocks until it is done.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_as_coro(factory))
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="captionrl-openai") as pool:
        return pool.submit(asyncio.run, _as_coro(factory)).result()


async def _as_coro(factory: Callable[[], Awaitable[T]]) -> T:
    return await factory()


def option_probs_from_top(
    top: Iterable[tuple[str, float]], options: Sequence[str], fold_case: bool = True
) -> tuple[dict[str, float] | None, float]:
    """Map first-token (token, logprob) pairs to options; returns (normalised probs, raw mass).

    Tokens match an option after stripping spaces (``" B"`` is ``B``) and, with ``fold_case``, ignoring
    case; several tokens of one option add up. Duplicate token strings count once.
    """

    def norm(s: str) -> str:
        s = s.strip()
        return s.upper() if fold_case else s

    by_key: dict[str, str] = {}
    for o in options:
        k = norm(o)
        if k in by_key:
            raise ConfigError("options", list(options), f"options {by_key[k]!r} and {o!r} are the same token",
                              "use distinct option labels such as A, B, C, D")
        by_key[k] = o
    raw: dict[str, float] = {}
    seen: set[str] = set()
    for tok, lp in top:
        if tok in seen or lp is None:
            continue
        seen.add(tok)
        o = by_key.get(norm(tok))
        if o is not None:
            raw[o] = raw.get(o, 0.0) + math.exp(float(lp))
    return normalise_option_probs(raw, options)


def to_openai_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """OpenAI chat messages with every image as a base64 data URL (servers cannot read our files)."""
    from captionrl.backends.images import image_to_data_url

    out: list[dict[str, Any]] = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str) or content is None:
            out.append({**m, "content": content or ""})
            continue
        parts: list[dict[str, Any]] = []
        for part in content:
            kind = part.get("type")
            if kind == "image":
                parts.append({"type": "image_url", "image_url": {"url": image_to_data_url(part["image"])}})
            elif kind == "image_url":
                url = part["image_url"]["url"] if isinstance(part.get("image_url"), dict) else part.get("image_url")
                if not (isinstance(url, str) and url.startswith(("http://", "https://", "data:"))):
                    url = image_to_data_url(url)
                parts.append({"type": "image_url", "image_url": {"url": url}})
            else:
                parts.append(dict(part))
        out.append({**m, "content": parts})
    return out


class OpenAIBackend:
    """A model behind an OpenAI-compatible HTTP API.

    Args:
        base_url: the server's API root, e.g. ``http://127.0.0.1:8000/v1``; several replicas as a list or
            ``|``-separated (see the module doc).
        model: the served model name sent with each request.
        api_key: bearer token (local servers need none).
        concurrency: requests in flight at once per replica, per event loop, across all calls of this backend.
        timeout_s: seconds before one attempt is abandoned (and retried).
        max_retries: extra attempts on 429, 5xx, timeouts and connection errors (a re-send to another
            replica counts as one).
        cooldown_s: seconds a replica that failed (connection error, timeout) gets no requests.
        backoff_s, backoff_max_s: the wait before retry ``k`` is ``min(backoff_s * 2**k, backoff_max_s)``
            (or the server's ``Retry-After``, capped the same way); deterministic, so runs are repeatable.
        loglikelihood_api: ``echo`` or ``prompt_logprobs`` (vLLM), see the module doc.
        echo_prefix: text sent before every echo prompt and never scored (the BOS token for
            llama-cpp-python, whose echo log-probs are otherwise shifted).
        verify_echo: run the alignment probe before the first echo loglikelihood call.
        top_logprobs: first-token alternatives asked for by ``choose`` (OpenAI allows at most 20).
        choice_max_tokens: reply length of the generate-and-parse fallback of ``choose``.
        fold_case: ``choose`` counts ``a`` as option ``A``.
        progress: show a tqdm bar for calls with more than one request.
        transport: an ``httpx`` transport (tests use ``httpx.MockTransport``).
        reasoning: a reasoning model that takes only its default sampling (OpenAI GPT-5 and o-series, Gemini 2.5
            through its OpenAI-compatible endpoint): see ``_chat_payload``.
        reasoning_effort: sent as ``reasoning_effort`` when given (reasoning models only).
        reasoning_budget: thinking tokens allowed on top of each request's reply length (reasoning models count
            their thinking against ``max_completion_tokens``).
    """

    def __init__(
        self,
        base_url: str | Sequence[str],
        model: str = "default",
        *,
        api_key: str | None = None,
        concurrency: int = 8,
        timeout_s: float = 120.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        backoff_max_s: float = 8.0,
        cooldown_s: float = 10.0,
        loglikelihood_api: str = "echo",
        echo_prefix: str = "",
        verify_echo: bool = True,
        top_logprobs: int = 20,
        choice_max_tokens: int = 8,
        fold_case: bool = True,
        progress: bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
        name: str | None = None,
        reasoning: bool = False,
        reasoning_effort: str | None = None,
        reasoning_budget: int = 0,
    ) -> None:
        urls = split_base_urls(base_url)
        checks: list[tuple[str, Any, bool, str]] = [
            ("backend.concurrency", concurrency, concurrency >= 1, "set concurrency: 8"),
            ("backend.timeout_s", timeout_s, timeout_s > 0, "set timeout_s: 120"),
            ("backend.max_retries", max_retries, max_retries >= 0, "set max_retries: 3"),
            ("backend.backoff_s", backoff_s, backoff_s >= 0, "set backoff_s: 0.5"),
            ("backend.cooldown_s", cooldown_s, cooldown_s >= 0, "set cooldown_s: 10"),
            ("backend.top_logprobs", top_logprobs, top_logprobs >= 1, "set top_logprobs: 20"),
            ("backend.choice_max_tokens", choice_max_tokens, choice_max_tokens >= 1, "set choice_max_tokens: 8"),
        ]
        for fld, value, ok, fix in checks:
            if not ok:
                raise ConfigError(fld, value, "out of range", fix)
        if loglikelihood_api not in ("echo", "prompt_logprobs"):
            raise ConfigError("backend.loglikelihood_api", loglikelihood_api, "unknown API",
                              "use echo or prompt_logprobs")
        self.replicas = [Replica(u) for u in urls]
        self.base_url = urls[0]
        self.cooldown_s = float(cooldown_s)
        self._next = 0
        self.model = model
        self.api_key = api_key
        self.concurrency = concurrency
        self.timeout_s = float(timeout_s)
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.loglikelihood_api = loglikelihood_api
        self.echo_prefix = echo_prefix
        self.verify_echo = verify_echo
        self.top_logprobs = top_logprobs
        self.choice_max_tokens = choice_max_tokens
        self.fold_case = fold_case
        self.progress = progress
        if reasoning_budget < 0:
            raise ConfigError("backend.reasoning_budget", reasoning_budget, "must be >= 0", "set reasoning_budget: 8192")
        self.reasoning = bool(reasoning)
        self.reasoning_effort = reasoning_effort
        self.reasoning_budget = int(reasoning_budget)
        self._transport = transport
        host = httpx.URL(self.base_url).netloc.decode()
        more = f"+{len(urls) - 1}" if len(urls) > 1 else ""
        self.name = name or f"openai:{model}@{host}{more}"
        self.server_lacks_logprobs = self.reasoning  # reasoning models return no log-probs: choose() generates
        """Set when a server answered ``choose`` without log-probs; later calls go straight to generate."""
        self.echo_alignment: float | None = None
        """Mean token log-prob of the echo alignment probe (``None`` until measured)."""
        self.last_errors: list[str | None] = []
        """Per-pair errors of the latest ``loglikelihood`` call (its return value has only numbers)."""
        self._sems: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    @classmethod
    def from_config(cls, cfg: Any) -> OpenAIBackend:
        """Build from a ``BackendConfig`` (kind ``openai``); the API key comes from ``cfg.api_key_env``."""
        import os

        if not getattr(cfg, "base_url", None):
            raise ConfigError("backend.base_url", getattr(cfg, "base_url", None),
                              "an openai backend needs the server's URL", "set base_url: http://HOST:PORT/v1")
        env = getattr(cfg, "api_key_env", "") or ""
        kw: dict[str, Any] = {}
        for opt in ("backoff_s", "echo_prefix", "top_logprobs", "cooldown_s", "reasoning", "reasoning_effort",
                    "reasoning_budget"):  # optional fields, used when present
            if getattr(cfg, opt, None) is not None:
                kw[opt] = getattr(cfg, opt)
        return cls(
            cfg.base_url,
            model=cfg.model,
            api_key=os.environ.get(env) if env else None,
            concurrency=cfg.concurrency,
            timeout_s=cfg.timeout_s,
            max_retries=cfg.max_retries,
            loglikelihood_api=cfg.loglikelihood_api,
            **kw,
        )

    # ------------------------------------------------------------------ transport
    def _client(self) -> httpx.AsyncClient:
        """One client for all replicas (requests carry absolute URLs; see ``_pick``)."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        n = self.concurrency * len(self.replicas)
        return httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(self.timeout_s),
            limits=httpx.Limits(max_connections=n, max_keepalive_connections=n),
            transport=self._transport,
        )

    def _pick(self) -> Replica:
        """The live replica with the fewest requests in flight (ties in turn); when none is live, the one
        whose cool-down ends first (a probe: if it answers, it is live again)."""
        now = time.monotonic()
        live = [r for r in self.replicas if r.live(now)]
        if not live:
            return min(self.replicas, key=lambda r: r.down_until)
        n = len(self.replicas)
        order = {id(r): (self.replicas.index(r) - self._next) % n for r in live}
        best = min(live, key=lambda r: (r.in_flight, order[id(r)]))
        self._next = (self.replicas.index(best) + 1) % n
        return best

    def _mark_down(self, replica: Replica, error: str) -> None:
        replica.failures += 1
        replica.last_error = error
        replica.down_until = time.monotonic() + self.cooldown_s

    def replica_status(self) -> list[dict[str, Any]]:
        """Per replica: URL, live or not, requests in flight, served, failures, last error."""
        now = time.monotonic()
        return [{"url": r.url, "live": r.live(now), "in_flight": r.in_flight, "served": r.served,
                 "failures": r.failures, "last_error": r.last_error,
                 "retry_in_s": round(max(r.down_until - now, 0.0), 1)} for r in self.replicas]

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        sem = self._sems.get(loop)
        if sem is None:
            sem = self._sems[loop] = asyncio.Semaphore(self.concurrency * len(self.replicas))
        return sem

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        if retry_after:
            try:
                return min(max(float(retry_after), 0.0), self.backoff_max_s)
            except ValueError:
                pass
        return min(self.backoff_s * (2**attempt), self.backoff_max_s)

    async def _post(self, client: httpx.AsyncClient, path: str, payload: dict[str, Any], *,
                    root: bool = False) -> _Reply:
        """POST with retries on 429/5xx/timeouts/connection errors; never raises for a failed request.

        ``path`` is relative to the replica's ``/v1`` URL, or to the server root with ``root``. A replica
        that cannot be reached is taken out (``cooldown_s``) and the request re-sent to another at once.
        """
        sem = self._semaphore()
        t0 = time.perf_counter()
        last = ""
        attempts = 0
        retry_now = False
        for attempt in range(self.max_retries + 1):
            attempts += 1
            retry_after = None
            retry_now = False
            async with sem:
                replica = self._pick()
                base = re.sub(r"/v1$", "", replica.url) if root else replica.url
                replica.in_flight += 1
                try:
                    resp = await client.post(base + path, json=payload)
                except httpx.TimeoutException as exc:
                    last = f"timeout after {self.timeout_s:g}s from {replica.url} ({type(exc).__name__})"
                    self._mark_down(replica, last)
                    retry_now = any(r.live(time.monotonic()) for r in self.replicas)
                except httpx.TransportError as exc:
                    last = f"connection error from {replica.url} ({type(exc).__name__}: {exc})"
                    self._mark_down(replica, last)
                    retry_now = any(r.live(time.monotonic()) for r in self.replicas)
                else:
                    replica.served += 1
                    replica.down_until = 0.0
                    body = resp.text
                    code = resp.status_code
                    feature = bool(code >= 400 and _FEATURE_WORDS.search(body) and _FEATURE_VERBS.search(body))
                    if code < 400:
                        try:
                            data = resp.json()
                        except ValueError:
                            return _Reply(error=f"malformed reply (not JSON): {body[:200]!r}", status=code,
                                          attempts=attempts, latency_s=time.perf_counter() - t0)
                        return _Reply(data=data, status=code, attempts=attempts,
                                      latency_s=time.perf_counter() - t0)
                    last = f"HTTP {code}: {body[:300]}"
                    if feature or not (code == 429 or code >= 500):
                        return _Reply(error=last, status=code, attempts=attempts,
                                      latency_s=time.perf_counter() - t0, feature_error=feature)
                    retry_after = resp.headers.get("retry-after")
                finally:
                    replica.in_flight -= 1
            if attempt < self.max_retries and not retry_now:
                await asyncio.sleep(self._delay(attempt, retry_after))
        return _Reply(error=f"failed after {attempts} attempt(s): {last}", attempts=attempts,
                      latency_s=time.perf_counter() - t0)

    async def _gather(self, coros: list[Awaitable[T]], desc: str) -> list[T]:
        """Run request coroutines concurrently (the semaphore caps them) with a progress bar."""
        from tqdm.auto import tqdm

        bar = tqdm(total=len(coros), desc=f"{self.name} {desc}", leave=False,
                   disable=not self.progress or len(coros) <= 1)

        async def tracked(c: Awaitable[T]) -> T:
            try:
                return await c
            finally:
                bar.update(1)

        try:
            return list(await asyncio.gather(*(tracked(c) for c in coros)))
        finally:
            bar.close()

    # ------------------------------------------------------------------ generate
    async def agenerate(self, requests: Sequence[ChatRequest]) -> list[Generation]:
        """Chat completions for each request; a failed one is ``Generation(text=None, error=...)``."""
        check_model_calls_allowed(self.name)
        async with self._client() as client:
            return await self._gather([self._generate_one(client, r) for r in requests], "generate")

    def _chat_payload(self, r: ChatRequest) -> dict[str, Any]:
        """The chat-completions body of one request.

        A reasoning model (``reasoning``) gets the limit as ``max_completion_tokens`` (OpenAI's reasoning models
        reject ``max_tokens``), the reply's length plus ``reasoning_budget`` (their thinking counts against it),
        no ``temperature``/``top_p`` (they accept only the default) and no ``stop`` (applied to the reply here);
        ``reasoning_effort`` when set. Any other server gets ``max_tokens``, ``temperature`` and ``top_p``.
        """
        payload: dict[str, Any] = {"model": self.model, "messages": to_openai_messages(r.messages)}
        if self.reasoning:
            payload["max_completion_tokens"] = r.max_new_tokens + self.reasoning_budget
            if self.reasoning_effort is not None:
                payload["reasoning_effort"] = self.reasoning_effort
        else:
            payload.update(max_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p)
        if r.seed is not None:
            payload["seed"] = r.seed
        if r.stop and not self.reasoning:
            payload["stop"] = list(r.stop)
        if r.response_format is not None:
            payload["response_format"] = r.response_format
        return payload

    async def _generate_one(self, client: httpx.AsyncClient, r: ChatRequest) -> Generation:
        rep = await self._post(client, "/chat/completions", self._chat_payload(r))
        if rep.error is not None:
            return Generation(text=None, error=rep.error, latency_s=rep.latency_s, attempts=rep.attempts)
        try:
            choice = rep.data["choices"][0]
            text = choice["message"]["content"]
            if not isinstance(text, str):
                raise TypeError(f"content is {type(text).__name__}")
        except (KeyError, IndexError, TypeError) as exc:
            return Generation(text=None, error=f"malformed reply ({type(exc).__name__}: {exc}): "
                              f"{str(rep.data)[:200]}", latency_s=rep.latency_s, attempts=rep.attempts)
        finish = choice.get("finish_reason")
        if self.reasoning and r.stop:  # the stop strings a reasoning model is not sent
            cuts = [text.find(s) for s in r.stop if s and s in text]
            if cuts:
                text, finish = text[: min(cuts)], "stop"
        if self.reasoning and not text.strip():
            usage = rep.data.get("usage") or {}
            spent = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
            return Generation(text=None, error=(
                f"empty reply (finish_reason {finish}, reasoning tokens {spent}, max_completion_tokens "
                f"{r.max_new_tokens + self.reasoning_budget}): the model spent its limit thinking; raise "
                "reasoning_budget or lower reasoning_effort"), latency_s=rep.latency_s, attempts=rep.attempts)
        return Generation(text=text, finish_reason=finish, latency_s=rep.latency_s, attempts=rep.attempts)

    def generate(self, requests: Sequence[ChatRequest]) -> list[Generation]:
        return run_sync(lambda: self.agenerate(requests))

    # ------------------------------------------------------------------ choose
    async def achoose(self, prompts: Sequence[Sequence[Message]], options: Sequence[str]) -> list[ChoiceResult]:
        """Option probabilities from the first reply token's ``top_logprobs``; generate-and-parse only
        when the server gives no log-probs (recorded as ``method="generate"`` with the reason)."""
        check_model_calls_allowed(self.name)
        option_probs_from_top([], options, self.fold_case)  # validates the options up front
        results: list[ChoiceResult | _Pending] = []
        async with self._client() as client:
            if self.server_lacks_logprobs:
                results = [_Pending(i, "server returned no logprobs earlier") for i in range(len(prompts))]
            else:
                results = await self._gather([self._choose_one(client, i, p, options)
                                              for i, p in enumerate(prompts)], "choose")
            pending = [r for r in results if isinstance(r, _Pending)]
            if pending:
                gens = await self._gather([
                    self._generate_one(client, ChatRequest(prompts[p.index], max_new_tokens=self.choice_max_tokens))
                    for p in pending], "choose(generate)")
                for p, g in zip(pending, gens, strict=True):
                    results[p.index] = _parsed_choice(g, options, p)
        return [r for r in results if isinstance(r, ChoiceResult)]

    async def _choose_one(
        self, client: httpx.AsyncClient, index: int, prompt: Sequence[Message], options: Sequence[str]
    ) -> ChoiceResult | _Pending:
        payload = self._chat_payload(ChatRequest(prompt, max_new_tokens=1, temperature=0.0))
        payload.update(logprobs=True, top_logprobs=self.top_logprobs)
        rep = await self._post(client, "/chat/completions", payload)
        extra: dict[str, Any] = {"attempts": rep.attempts, "latency_s": rep.latency_s}
        if rep.error is not None:
            if rep.feature_error:
                self.server_lacks_logprobs = True
                return _Pending(index, f"server refused logprobs: {rep.error}", extra)
            return ChoiceResult(None, "top_logprobs", error=rep.error, extra=extra)
        try:
            choice = rep.data["choices"][0]
        except (KeyError, IndexError, TypeError) as exc:
            return ChoiceResult(None, "top_logprobs", error=f"malformed reply ({type(exc).__name__}: {exc}): "
                                f"{str(rep.data)[:200]}", extra=extra)
        content = (choice.get("logprobs") or {}).get("content") if isinstance(choice, dict) else None
        if not content:
            self.server_lacks_logprobs = True
            return _Pending(index, "server returned no logprobs", extra)
        try:
            first = content[0]
            top = [(t["token"], t["logprob"]) for t in first.get("top_logprobs") or []]
            top.append((first["token"], first["logprob"]))
        except (KeyError, IndexError, TypeError) as exc:
            return ChoiceResult(None, "top_logprobs", error=f"malformed logprobs ({type(exc).__name__}: {exc})",
                                extra=extra)
        probs, mass = option_probs_from_top(top, options, self.fold_case)
        raw = first.get("token")
        if probs is None:
            return ChoiceResult(None, "top_logprobs", mass=0.0, raw=raw, extra=extra,
                                error=f"no option among the top {len(top)} first tokens (top: {raw!r})")
        return ChoiceResult(probs, "top_logprobs", mass=mass, raw=raw, extra=extra)

    def choose(self, prompts: Sequence[Sequence[Message]], options: Sequence[str]) -> list[ChoiceResult]:
        return run_sync(lambda: self.achoose(prompts, options))

    # ------------------------------------------------------------------ loglikelihood
    async def aloglikelihood_results(self, pairs: Sequence[tuple[str, str]]) -> list[LoglikelihoodResult]:
        """Summed log p(continuation | context) per pair, with per-pair errors (see ``aloglikelihood``)."""
        check_model_calls_allowed(self.name)
        if not pairs:
            return []
        if self.loglikelihood_api == "prompt_logprobs":
            async with self._client() as client:
                results = await self._gather([self._ll_prompt_logprobs(client, c, x) for c, x in pairs],
                                             "loglikelihood")
        else:
            async with self._client() as client:
                if self.verify_echo and self.echo_alignment is None:
                    await self._check_echo_alignment(client)
                results = await self._gather([self._ll_echo(client, c, x) for c, x in pairs], "loglikelihood")
        missing = [r for r in results if isinstance(r, _Reply)]
        if missing:
            raise BackendError(f"{self.name}: {LOGLIKELIHOOD_HELP}. Server said: {missing[0].error}")
        return [r for r in results if isinstance(r, LoglikelihoodResult)]

    async def aloglikelihood(self, pairs: Sequence[tuple[str, str]]) -> list[float | None]:
        """Summed log p(continuation | context); ``None`` where a request failed (errors: ``last_errors``).

        Trailing whitespace of a context moves to its continuation, as in ``HFBackend``, so the boundary
        tokenises as in running text. A token that straddles the boundary counts as context.
        """
        res = await self.aloglikelihood_results(pairs)
        self.last_errors = [r.error for r in res]
        return [r.value for r in res]

    def loglikelihood(self, pairs: Sequence[tuple[str, str]]) -> list[float | None]:
        return run_sync(lambda: self.aloglikelihood(pairs))

    async def _check_echo_alignment(self, client: httpx.AsyncClient) -> None:
        res = await self._ll_echo(client, ECHO_PROBE_CONTEXT, ECHO_PROBE_CONTINUATION)
        if isinstance(res, _Reply):
            raise BackendError(f"{self.name}: {LOGLIKELIHOOD_HELP}. Server said: {res.error}")
        if res.value is None or res.n_tokens == 0:
            return  # the probe itself failed (outage): no verdict, the real requests will record errors
        mean = res.value / res.n_tokens
        if mean < ECHO_PROBE_MIN_MEAN_LOGPROB:
            raise BackendError(
                f"{self.name}: the server's echo log-probs look shifted by one token (probe: mean "
                f"{mean:.2f} nats/token on a counting sequence, expected > {ECHO_PROBE_MIN_MEAN_LOGPROB}); "
                "llama-cpp-python aligns them only when the prompt starts with the BOS token "
                "(abetlen/llama-cpp-python#1983). Fix: set echo_prefix to the model's BOS text "
                "(SmolLM2: '<|im_start|>'), or serve with vLLM, or pass verify_echo=False to skip this check"
            )
        self.echo_alignment = mean

    async def _ll_echo(self, client: httpx.AsyncClient, ctx: str, cont: str) -> LoglikelihoodResult | _Reply:
        stripped = ctx.rstrip()
        cont = ctx[len(stripped):] + cont
        full = stripped + cont
        payload = {"model": self.model, "prompt": self.echo_prefix + full, "max_tokens": 1,
                   "temperature": 0.0, "echo": True, "logprobs": 1}
        rep = await self._post(client, "/completions", payload)
        meta = {"attempts": rep.attempts, "latency_s": rep.latency_s}
        if rep.error is not None:
            return rep if rep.feature_error else LoglikelihoodResult(None, rep.error, **meta)
        try:
            lp = rep.data["choices"][0].get("logprobs")
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            return LoglikelihoodResult(None, f"malformed reply ({type(exc).__name__}: {exc}): "
                                       f"{str(rep.data)[:200]}", **meta)
        if not lp or not lp.get("tokens") or lp.get("token_logprobs") is None:
            return _Reply(error=f"no echoed prompt logprobs in the reply: {str(rep.data)[:200]}")
        try:
            return _sum_echo(lp["tokens"], lp["token_logprobs"], lp.get("text_offset"), self.echo_prefix,
                             len(stripped), full, meta)
        except (TypeError, ValueError) as exc:
            return LoglikelihoodResult(None, f"malformed logprobs ({type(exc).__name__}: {exc})", **meta)

    async def _tokenize(self, client: httpx.AsyncClient, text: str, special: bool) -> list[int] | str:
        rep = await self._post(client, "/tokenize", {"model": self.model, "prompt": text,
                                                     "add_special_tokens": special}, root=True)
        if rep.error is not None:
            return rep.error
        tokens = rep.data.get("tokens") if isinstance(rep.data, dict) else None
        if not isinstance(tokens, list):
            return f"malformed /tokenize reply: {str(rep.data)[:200]}"
        return [int(t) for t in tokens]

    async def _ll_prompt_logprobs(
        self, client: httpx.AsyncClient, ctx: str, cont: str
    ) -> LoglikelihoodResult | _Reply:
        t0 = time.perf_counter()
        stripped = ctx.rstrip()
        cont = ctx[len(stripped):] + cont
        ctx_ids = await self._tokenize(client, stripped, True)
        cont_ids = await self._tokenize(client, cont, False) if cont else []
        for got in (ctx_ids, cont_ids):
            if isinstance(got, str):
                return LoglikelihoodResult(None, f"tokenize failed: {got}", latency_s=time.perf_counter() - t0)
        assert isinstance(ctx_ids, list) and isinstance(cont_ids, list)
        if not cont_ids:
            return LoglikelihoodResult(0.0, latency_s=time.perf_counter() - t0)
        ids = ctx_ids + cont_ids
        payload = {"model": self.model, "prompt": ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 1}
        rep = await self._post(client, "/v1/completions", payload, root=True)
        meta = {"attempts": rep.attempts, "latency_s": time.perf_counter() - t0}
        if rep.error is not None:
            return rep if rep.feature_error else LoglikelihoodResult(None, rep.error, **meta)
        try:
            choice = rep.data["choices"][0]
            plp = choice.get("prompt_logprobs") or rep.data.get("prompt_logprobs")
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            return LoglikelihoodResult(None, f"malformed reply ({type(exc).__name__}: {exc})", **meta)
        if not plp:
            return _Reply(error=f"no prompt_logprobs in the reply: {str(rep.data)[:200]}")
        try:
            total = 0.0
            for pos in range(len(ctx_ids), len(ids)):
                entry = plp[pos][str(ids[pos])]
                total += float(entry["logprob"] if isinstance(entry, Mapping) else entry)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            return LoglikelihoodResult(None, f"prompt_logprobs lack token at a position ({type(exc).__name__}: "
                                       f"{exc})", **meta)
        return LoglikelihoodResult(total, n_tokens=len(cont_ids), **meta)


def _sum_echo(
    tokens: Sequence[str], logprobs: Sequence[float | None], offsets: Sequence[int] | None, prefix: str,
    boundary: int, full: str, meta: dict[str, Any],
) -> LoglikelihoodResult:
    """Sum the echoed log-probs of the tokens that start inside the continuation.

    Token starts come from joining the echoed token strings and finding our text in them (robust to a
    BOS that is or is not echoed); if the join does not reproduce the text, the reply's ``text_offset``
    (relative to the prompt sent, prefix included) is used instead.
    """
    joined = "".join(tokens)
    pos = joined.find(full) if full else -1
    if pos >= 0:
        starts, base = [], pos
        acc = 0
        for t in tokens:
            starts.append(acc)
            acc += len(t)
    elif offsets is not None and len(offsets) == len(tokens):
        starts, base = [int(o) for o in offsets], len(prefix)
    else:
        return LoglikelihoodResult(None, "echoed tokens do not reproduce the prompt and no text_offset", **meta)
    lo, hi = base + boundary, base + len(full)
    total, n = 0.0, 0
    for s, lp in zip(starts, logprobs, strict=False):
        if lo <= s < hi:
            if lp is None:
                return LoglikelihoodResult(None, "the first continuation token has no logprob (empty context?)",
                                           **meta)
            total += float(lp)
            n += 1
    return LoglikelihoodResult(total, n_tokens=n, **meta)


def _parsed_choice(g: Generation, options: Sequence[str], pending: _Pending) -> ChoiceResult:
    extra = {**pending.extra, "fallback_reason": pending.reason, "attempts": g.attempts, "latency_s": g.latency_s}
    if g.text is None:
        return ChoiceResult(None, "generate", error=g.error, extra=extra)
    picked = parse_choice(g.text, options)
    if picked is None:
        return ChoiceResult(None, "generate", raw=g.text, error="no option could be parsed from the reply",
                            extra=extra)
    return ChoiceResult({o: float(o == picked) for o in options}, "generate", mass=1.0, raw=g.text, extra=extra)
