"""The ``openai`` backend: parse and error paths on fakes, then a real llama.cpp server, faults included.

Fakes (``httpx.MockTransport``, a tiny garbage-replying HTTP server) are used only where a real server
cannot produce the case (exact 503/429 sequences, malformed replies, vLLM-only fields).
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from captionrl.backends import BackendConfig, make_backend
from captionrl.backends.base import FORBID_ENV, ChatRequest
from captionrl.backends.openai_http import OpenAIBackend, option_probs_from_top
from captionrl.errors import BackendError, ConfigError, ModelCallsForbiddenError
from captionrl.records import RecordWriter, read_jsonl
from servers import LlamaServer, requires_llama_cpp, send_json

URL = "http://fake.local/v1"
OPTIONS = ["A", "B", "C", "D"]


def chat_reply(text: str, top: list[tuple[str, float]] | None = None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                              "finish_reason": "stop", "logprobs": None}
    if top is not None:
        choice["logprobs"] = {"content": [{"token": top[0][0], "logprob": top[0][1],
                                           "top_logprobs": [{"token": t, "logprob": lp} for t, lp in top]}]}
    return {"choices": [choice]}


def mock_backend(handler, **kw: Any) -> OpenAIBackend:
    kw.setdefault("backoff_s", 0.0)
    kw.setdefault("progress", False)
    return OpenAIBackend(URL, transport=httpx.MockTransport(handler), **kw)


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


# ---------------------------------------------------------------------------- fakes: transport
def test_retries_on_5xx_then_succeeds_and_counts_attempts():
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) < 3:
            return httpx.Response(503, text="overloaded")
        return httpx.Response(200, json=chat_reply("hello"))

    g = mock_backend(handler, max_retries=3).generate([ChatRequest(user("hi"))])[0]
    assert (g.text, g.attempts, g.error) == ("hello", 3, None)
    assert len(calls) == 3


def test_429_exhausted_is_unscored_with_error_not_raised():
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(time.perf_counter())
        return httpx.Response(429, headers={"Retry-After": "0.05"}, text="slow down")

    g = mock_backend(handler, max_retries=2, backoff_s=5.0).generate([ChatRequest(user("hi"))])[0]
    assert g.text is None and g.attempts == 3 and len(calls) == 3
    assert "429" in g.error and "slow down" in g.error
    assert calls[1] - calls[0] < 1.0  # Retry-After (0.05 s) was honoured over backoff_s (5 s)


def test_client_errors_are_not_retried():
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(400, text="bad request: messages missing")

    g = mock_backend(handler, max_retries=3).generate([ChatRequest(user("hi"))])[0]
    assert g.text is None and g.attempts == 1 and len(calls) == 1 and "400" in g.error


def test_concurrency_cap_holds_across_requests():
    state = {"now": 0, "max": 0}

    async def handler(request: httpx.Request) -> httpx.Response:
        state["now"] += 1
        state["max"] = max(state["max"], state["now"])
        await asyncio.sleep(0.02)
        state["now"] -= 1
        return httpx.Response(200, json=chat_reply("ok"))

    backend = mock_backend(handler, concurrency=3)
    gens = backend.generate([ChatRequest(user(str(i))) for i in range(10)])
    assert [g.text for g in gens] == ["ok"] * 10
    assert state["max"] == 3

    async def two_reward_functions_at_once() -> list:
        # TRL runs async reward functions concurrently: the cap holds across calls, not per call.
        return await asyncio.gather(*(backend.agenerate([ChatRequest(user(str(i))) for i in range(5)])
                                      for _ in range(2)))

    state["max"] = 0
    both = asyncio.run(two_reward_functions_at_once())
    assert [len(x) for x in both] == [5, 5] and state["max"] == 3


def test_sync_call_works_inside_a_running_event_loop():
    backend = mock_backend(lambda r: httpx.Response(200, json=chat_reply("from thread loop")))

    async def inside() -> str | None:
        return backend.generate([ChatRequest(user("hi"))])[0].text  # sync call, loop already running

    assert asyncio.run(inside()) == "from thread loop"


def test_images_are_sent_as_data_urls():
    from PIL import Image

    bodies = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json=chat_reply("a red square"))

    msg = [{"role": "user", "content": [{"type": "image", "image": Image.new("RGB", (4, 4), "red")},
                                        {"type": "text", "text": "Describe."}]}]
    mock_backend(handler).generate([ChatRequest(msg, seed=7, stop=("\n",))])
    part = bodies[0]["messages"][0]["content"][0]
    assert part["type"] == "image_url" and part["image_url"]["url"].startswith("data:image/png;base64,")
    assert bodies[0]["seed"] == 7 and bodies[0]["stop"] == ["\n"]


def test_forbid_switch_blocks_calls(monkeypatch):
    monkeypatch.setenv(FORBID_ENV, "1")
    backend = mock_backend(lambda r: httpx.Response(200, json=chat_reply("x")))
    with pytest.raises(ModelCallsForbiddenError):
        backend.generate([ChatRequest(user("hi"))])
    with pytest.raises(ModelCallsForbiddenError):
        backend.choose([user("hi")], OPTIONS)


def test_from_config_and_make_backend(monkeypatch):
    monkeypatch.setenv("CAPTIONRL_TEST_KEY", "sekret")
    cfg = BackendConfig(kind="openai", model="m", base_url="http://127.0.0.1:9/v1", api_key_env="CAPTIONRL_TEST_KEY",
                        concurrency=2, timeout_s=3.0, max_retries=1)
    b = make_backend(cfg, shared=False)
    assert isinstance(b, OpenAIBackend)
    assert (b.api_key, b.concurrency, b.timeout_s, b.max_retries, b.model) == ("sekret", 2, 3.0, 1, "m")
    with pytest.raises(ConfigError, match="base_url"):
        OpenAIBackend("127.0.0.1:8000")
    with pytest.raises(ConfigError, match="timeout_s"):
        OpenAIBackend(URL, timeout_s=0)


def test_vllm_backend_without_vllm_raises_with_install_hint():
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    from captionrl.backends.vllm_offline import VLLMBackend

    with pytest.raises(BackendError, match=r"captionrl\[vllm\]"):
        VLLMBackend("some/model")
    with pytest.raises(BackendError, match=r"captionrl\[vllm\]"):
        make_backend({"kind": "vllm", "model": "some/model"}, shared=False)


# ---------------------------------------------------------------------------- fakes: choose
def test_option_mapping_strips_spaces_and_folds_case():
    probs, mass = option_probs_from_top([(" A", -1.0), ("a", -2.0), ("B", -1.5), ("The", -0.5), (" A", -9)], OPTIONS)
    a, b = math.exp(-1) + math.exp(-2), math.exp(-1.5)
    assert mass == pytest.approx(a + b)
    assert probs == pytest.approx({"A": a / (a + b), "B": b / (a + b), "C": 0.0, "D": 0.0})
    strict, _ = option_probs_from_top([("a", -1.0), ("B", -1.0)], OPTIONS, fold_case=False)
    assert strict == {"A": 0.0, "B": 1.0, "C": 0.0, "D": 0.0}
    with pytest.raises(ConfigError):
        option_probs_from_top([], ["a", "A"])


def test_choose_reads_top_logprobs():
    bodies = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json=chat_reply("B", top=[("B", -0.2), (" C", -2.0), ("Hello", -3.0)]))

    r = mock_backend(handler).choose([user("q")], OPTIONS)[0]
    assert r.method == "top_logprobs" and r.choice == "B" and r.raw == "B"
    assert r.mass == pytest.approx(math.exp(-0.2) + math.exp(-2.0))
    assert bodies[0]["max_tokens"] == 1 and bodies[0]["logprobs"] is True and bodies[0]["top_logprobs"] == 20


def test_choose_without_option_in_top_is_unscored():
    r = mock_backend(lambda q: httpx.Response(200, json=chat_reply("Hi", top=[("Hi", -0.1)]))).choose(
        [user("q")], OPTIONS)[0]
    assert r.probs is None and r.choice is None and r.mass == 0.0 and "no option" in r.error


def test_choose_falls_back_to_generate_when_server_gives_no_logprobs():
    bodies = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        return httpx.Response(200, json=chat_reply("Answer: C" if body["max_tokens"] > 1 else "C"))

    backend = mock_backend(handler)
    r = backend.choose([user("q1"), user("q2")], OPTIONS)
    assert [x.method for x in r] == ["generate", "generate"]
    assert r[0].probs == {"A": 0.0, "B": 0.0, "C": 1.0, "D": 0.0} and r[0].raw == "Answer: C"
    assert r[0].extra["fallback_reason"] == "server returned no logprobs"
    assert len(bodies) == 4 and backend.server_lacks_logprobs
    backend.choose([user("q3")], OPTIONS)  # remembered: straight to generate, one request
    assert len(bodies) == 5 and "logprobs" not in bodies[-1]


# ---------------------------------------------------------------------------- fakes: loglikelihood
def echo_reply(tokens: list[str], logprobs: list[float | None]) -> dict[str, Any]:
    offsets, acc = [], 0
    for t in tokens:
        offsets.append(acc)
        acc += len(t)
    return {"choices": [{"text": "".join(tokens), "logprobs": {"tokens": tokens, "token_logprobs": logprobs,
                                                               "text_offset": offsets, "top_logprobs": None}}]}


def test_loglikelihood_echo_sums_continuation_tokens():
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert body["echo"] is True and body["max_tokens"] == 1 and body["prompt"] == "The sky is blue"
        return httpx.Response(200, json=echo_reply(["The", " sky", " is", " blue", "."],
                                                   [None, -3.0, -1.0, -0.5, -0.25]))

    backend = mock_backend(handler, verify_echo=False)
    assert backend.loglikelihood([("The sky is ", "blue")]) == [pytest.approx(-0.5)]  # space moves to " blue"
    assert backend.loglikelihood([("The sky", " is blue")]) == [pytest.approx(-1.5)]


def test_loglikelihood_without_echo_logprobs_raises_with_flags():
    backend = mock_backend(lambda r: httpx.Response(200, json={"choices": [{"text": "x", "logprobs": None}]}),
                           verify_echo=False)
    with pytest.raises(BackendError, match="--logits_all true"):
        backend.loglikelihood([("a", " b")])
    refused = mock_backend(lambda r: httpx.Response(
        500, text='{"error": "logprobs is not supported for models created with logits_all=False"}'))
    with pytest.raises(BackendError, match="prompt_logprobs"):
        refused.loglikelihood([("a", " b")])


def test_echo_probe_rejects_shifted_logprobs():
    def handler(request: httpx.Request) -> httpx.Response:
        toks = ["1", ",", " ", "2", ",", " ", "3", ",", " ", "4"]
        return httpx.Response(200, json=echo_reply(toks, [None] + [-12.0] * 9))

    with pytest.raises(BackendError, match="shifted by one token"):
        mock_backend(handler).loglikelihood([("x", " y")])


def test_loglikelihood_prompt_logprobs_vllm_format():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append((request.url.path, body))
        if request.url.path == "/tokenize":
            return httpx.Response(200, json={"tokens": [1, 10, 11] if body["add_special_tokens"] else [12, 13]})
        assert request.url.path == "/v1/completions" and body["prompt"] == [1, 10, 11, 12, 13]
        plp = [None, {"10": {"logprob": -5.0}}, {"11": {"logprob": -4.0}},
               {"12": {"logprob": -0.5, "rank": 1}, "99": {"logprob": -0.1}}, {"13": {"logprob": -0.25}}]
        return httpx.Response(200, json={"choices": [{"text": "", "prompt_logprobs": plp}]})

    backend = mock_backend(handler, loglikelihood_api="prompt_logprobs")
    assert backend.loglikelihood([("ctx", " cont")]) == [pytest.approx(-0.75)]
    assert [p for p, _ in seen] == ["/tokenize", "/tokenize", "/v1/completions"]


# ---------------------------------------------------------------------------- real server
@pytest.mark.server
@requires_llama_cpp
def test_generate_real_server(llama_server: LlamaServer):
    backend = llama_server.backend()
    gens = backend.generate([
        ChatRequest(user("What is the capital of France? Answer in one word."), max_new_tokens=8),
        ChatRequest(user("Say hello."), max_new_tokens=4),
    ])
    assert "Paris" in gens[0].text  # measured: 'The capital of France is Paris.'
    assert gens[0].finish_reason == "stop" and gens[1].finish_reason == "length"
    assert all(g.error is None and g.attempts == 1 and g.latency_s > 0 for g in gens)


@pytest.mark.server
@requires_llama_cpp
def test_choose_real_server_uses_top_logprobs(llama_server: LlamaServer):
    r = llama_server.backend().choose([user("Type the letter C and nothing else."),
                                       user("Reply with the single letter D.")], OPTIONS)
    assert [x.method for x in r] == ["top_logprobs"] * 2
    assert [x.choice for x in r] == ["C", "D"]  # measured: C 0.62, D 0.69 (A takes the rest)
    assert all(sum(x.probs.values()) == pytest.approx(1.0) and 0 < x.mass <= 1 for x in r)


@pytest.mark.server
@requires_llama_cpp
def test_loglikelihood_real_server_echo(llama_server: LlamaServer):
    backend = llama_server.backend()
    paris, banana = backend.loglikelihood([("The capital of France is", " Paris"),
                                           ("The capital of France is", " banana")])
    assert backend.echo_alignment is not None and backend.echo_alignment > -2.0  # probe passed
    assert -2.0 < paris < 0 and banana < paris - 8  # measured: -0.27 vs -16.4
    with pytest.raises(BackendError, match="shifted by one token"):
        llama_server.backend(echo_prefix="").loglikelihood([("The capital of France is", " Paris")])


@pytest.mark.server
@requires_llama_cpp
def test_loglikelihood_needs_logits_all(llama_server_factory):
    server = llama_server_factory(logits_all=False)
    backend = server.backend(max_retries=3)
    with pytest.raises(BackendError, match="--logits_all true"):
        backend.loglikelihood([("The capital of France is", " Paris")])
    r = backend.choose([user("Reply with the single letter D.")], OPTIONS)[0]  # falls back, recorded
    assert r.method == "generate" and "logits_all" in r.extra["fallback_reason"]


class KillAfter(httpx.AsyncBaseTransport):
    """A real transport that kills the server once ``n`` responses have arrived (deterministic timing)."""

    def __init__(self, server: LlamaServer, n: int) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.server, self.n, self.responses, self.requests = server, n, 0, 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        resp = await self.inner.handle_async_request(request)
        await resp.aread()
        self.responses += 1
        if self.responses == self.n:
            self.server.kill()
        return resp

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.mark.server
@requires_llama_cpp
def test_server_killed_mid_batch_leaves_rest_unscored(llama_server_factory):
    server = llama_server_factory()
    backend = server.backend(concurrency=1, max_retries=1, backoff_s=0.05, transport=KillAfter(server, 2))
    gens = backend.generate([ChatRequest(user(f"Count to {i}."), max_new_tokens=6) for i in range(5)])
    assert not server.alive
    assert [g.text is not None for g in gens] == [True, True, False, False, False]
    for g in gens[2:]:
        assert g.text is None and g.attempts == 2 and "connection error" in g.error
    dead = server.backend(max_retries=0)
    r = dead.choose([user("q")], OPTIONS)[0]
    assert r.probs is None and r.choice is None and "connection error" in r.error
    assert dead.loglikelihood([("a", " b")]) == [None] and "connection error" in dead.last_errors[0]


@pytest.mark.server
@requires_llama_cpp
def test_timeout_is_unscored_with_error(llama_server: LlamaServer):
    backend = llama_server.backend(timeout_s=0.01, max_retries=1, backoff_s=0.0)
    g = backend.generate([ChatRequest(user("Write a long story."), max_new_tokens=8)])[0]
    assert g.text is None and g.attempts == 2 and "timeout" in g.error
    r = backend.choose([user("Type the letter C and nothing else.")], OPTIONS)[0]
    assert r.probs is None and "timeout" in r.error


class GarbageHandler(BaseHTTPRequestHandler):
    """Replies 200 with a broken body chosen by the request's ``model`` field."""

    replies: ClassVar[dict[str, bytes]] = {"notjson": b"{this is not json", "nochoices": b'{"object": "chat.completion"}',
               "nomessage": b'{"choices": [{"index": 0}]}', "nullcontent": b'{"choices": [{"message": {"content": null}}]}'}

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        payload = self.replies[body["model"]]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


def test_malformed_replies_are_unscored():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), GarbageHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
        for model in GarbageHandler.replies:
            b = OpenAIBackend(url, model=model, progress=False, max_retries=2)
            g = b.generate([ChatRequest(user("hi"))])[0]
            assert g.text is None and "malformed" in g.error and g.attempts == 1, model
            c = b.choose([user("q")], OPTIONS)[0]
            assert c.probs is None and c.error, model
        b = OpenAIBackend(url, model="notjson", progress=False)
        assert b.loglikelihood([("a", " b")]) == [None] and "not JSON" in b.last_errors[0]
    finally:
        httpd.shutdown()
        httpd.server_close()


def run_judged(backend: OpenAIBackend, out, prompts: dict[str, str]) -> dict[str, int]:
    """A resumable run: writes one record per successful reply; failed ones stay missing for next time."""
    with RecordWriter(out / "records.jsonl") as w:
        todo = [k for k in prompts if not w.has(k)]
        gens = backend.generate([ChatRequest(user(prompts[k]), max_new_tokens=4) for k in todo])
        for k, g in zip(todo, gens, strict=True):
            if g.text is not None:
                w.write({"key": k, "prompt": prompts[k], "reply": g.text, "attempts": g.attempts})
    return {"todo": len(todo), "failed": sum(g.text is None for g in gens)}


@pytest.mark.server
@requires_llama_cpp
def test_resume_after_server_killed_completes_only_missing(llama_server_factory, tmp_path):
    server = llama_server_factory()
    prompts = {f"item{i}": f"Name a colour number {i}." for i in range(5)}
    first = run_judged(server.backend(concurrency=1, max_retries=0, transport=KillAfter(server, 2)), tmp_path,
                       prompts)
    assert first == {"todo": 5, "failed": 3}
    done_before = {r["key"] for r in read_jsonl(tmp_path / "records.jsonl")}
    assert done_before == {"item0", "item1"}

    server.restart()
    counter = KillAfter(server, n=10**9)  # counts requests, never kills
    second = run_judged(server.backend(transport=counter), tmp_path, prompts)
    assert second == {"todo": 3, "failed": 0} and counter.requests == 3
    records = list(read_jsonl(tmp_path / "records.jsonl"))
    assert sorted(r["key"] for r in records) == sorted(prompts)  # each key once, none redone
    assert all(r["reply"] for r in records)


# ---------------------------------------------------------------------- replicas
def test_replica_urls_from_a_spec_a_list_or_a_config():
    from captionrl.backends import parse_backend_spec
    from captionrl.backends.openai_http import split_base_urls

    cfg = parse_backend_spec("openai:http://a:1/v1|http://b:2/v1/#m")
    assert cfg.base_url == "http://a:1/v1|http://b:2/v1/" and cfg.model == "m"
    backend = OpenAIBackend.from_config(cfg)
    assert [r.url for r in backend.replicas] == ["http://a:1/v1", "http://b:2/v1"]
    assert backend.name == "openai:m@a:1+1"
    assert BackendConfig(kind="openai", base_url=["http://a/v1", "http://b/v1"]).base_url == "http://a/v1|http://b/v1"
    assert split_base_urls(["http://a/v1"]) == ["http://a/v1"]
    with pytest.raises(ConfigError, match="several separated by"):
        OpenAIBackend("http://a/v1|ftp://b")
    with pytest.raises(ConfigError, match="same replica twice"):
        OpenAIBackend("http://a/v1|http://a/v1/")


def test_requests_go_to_the_least_loaded_live_replica():
    seen: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.host)
        if request.url.host == "a.local":  # replica a is slow: its one request stays in flight
            await asyncio.sleep(0.3)
        return httpx.Response(200, json=chat_reply("ok"))

    backend = OpenAIBackend("http://a.local/v1|http://b.local/v1", concurrency=4, progress=False,
                            transport=httpx.MockTransport(handler))
    gens = backend.generate([ChatRequest(user("q"), max_new_tokens=2) for _ in range(6)])
    assert all(g.text == "ok" for g in gens)
    # a holds its first request for 0.3 s; b answers at once, so it always has fewer in flight and gets
    # every other request (round-robin would have sent a three).
    assert seen == ["a.local"] + ["b.local"] * 5
    assert [s["served"] for s in backend.replica_status()] == [1, 5]


def test_all_replicas_dead_is_unscored_never_zero():
    backend = OpenAIBackend("http://127.0.0.1:9/v1|http://127.0.0.1:7/v1", max_retries=2, backoff_s=0.0,
                            cooldown_s=60, progress=False)
    (g,) = backend.generate([ChatRequest(user("q"), max_new_tokens=2)])
    assert g.text is None and g.attempts == 3 and "connection error" in g.error
    (r,) = backend.choose([user("q")], OPTIONS)
    assert r.probs is None and r.choice is None and "connection error" in r.error
    assert backend.loglikelihood([("a", " b")]) == [None]
    assert not any(s["live"] for s in backend.replica_status())


@pytest.mark.server
@requires_llama_cpp
def test_replica_killed_mid_batch_all_answers_arrive_then_it_rejoins(llama_server_factory):
    a, b = llama_server_factory(), llama_server_factory()
    backend = OpenAIBackend([a.base_url, b.base_url], model="smollm2", concurrency=2, max_retries=2,
                            # a cool-down longer than a loaded machine's answer: a request whose retry came
                            # after it would go back to the dead replica and spend its last attempt there
                            backoff_s=0.05, cooldown_s=3.0, progress=False, transport=KillAfter(a, 3))
    prompts = [user(f"Is {i} even? Answer A (yes) or B (no).") for i in range(16)]
    res = backend.choose(prompts, ["A", "B"])
    assert not a.alive  # killed after the batch's third answer, with requests in flight on it
    assert all(r.probs is not None and r.error is None for r in res), [
        (i, r.probs, r.error) for i, r in enumerate(res) if r.probs is None or r.error is not None]
    status = {s["url"]: s for s in backend.replica_status()}
    assert status[a.base_url]["failures"] >= 1 and "connection error" in status[a.base_url]["last_error"]
    assert status[b.base_url]["served"] > status[a.base_url]["served"] >= 1
    # The same answers as one healthy server gives.
    ref = b.backend(concurrency=2).choose(prompts, ["A", "B"])
    for r, s in zip(res, ref, strict=True):
        assert r.probs["A"] == pytest.approx(s.probs["A"], abs=1e-3)
    # After the cool-down a restarted replica gets requests again.
    a.restart()
    time.sleep(3.1)
    served_before = status[a.base_url]["served"]
    backend._transport = None
    backend.choose(prompts[:6], ["A", "B"])
    after = {s["url"]: s for s in backend.replica_status()}
    assert after[a.base_url]["served"] > served_before and after[a.base_url]["live"]


# ---------------------------------------------------------------------- reasoning models (GPT-5, Gemini 2.5)
GEMINI_THINKING = {"none": 0, "low": 1024, "medium": 8192, "high": 24576}
"""Gemini's OpenAI-compatible endpoint: reasoning_effort none/low/medium/high -> thinking budgets of 0, 1,024,
8,192 and 24,576 tokens (Google's OpenAI-compatibility page); the stand-in thinks its whole budget, the worst case."""


class ReasoningProvider(BaseHTTPRequestHandler):
    """A stand-in for a reasoning model's chat completions, replaying what the providers document: OpenAI's
    GPT-5 family and o-series reject ``max_tokens`` and any temperature but the default with a 400 in OpenAI's
    error shape; reasoning tokens count against ``max_completion_tokens`` (a limit spent thinking returns empty
    content, finish_reason "length"), as Gemini 2.5's thinking tokens count against its output limit."""

    seen: ClassVar[list[dict[str, Any]]] = []
    ANSWER_TOKENS = 40

    def _send(self, code: int, body: dict[str, Any]) -> None:
        send_json(self, code, body)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append(body)
        if "max_tokens" in body:
            return self._send(400, {"error": {
                "message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
                           "'max_completion_tokens' instead.",
                "type": "invalid_request_error", "param": "max_tokens", "code": "unsupported_parameter"}})
        if body.get("temperature", 1) != 1:
            return self._send(400, {"error": {
                "message": f"Unsupported value: 'temperature' does not support {body['temperature']} with this model. "
                           "Only the default (1) value is supported.",
                "type": "invalid_request_error", "param": "temperature", "code": "unsupported_value"}})
        thinking = GEMINI_THINKING[body.get("reasoning_effort") or "medium"]
        limit = body.get("max_completion_tokens") or 10**9
        spent = min(thinking, limit)
        enough = limit - spent >= self.ANSWER_TOKENS
        self._send(200, {"choices": [{"index": 0, "message": {"role": "assistant",
                                                               "content": "Two red circles. END more" if enough else ""},
                                      "finish_reason": "stop" if enough else "length"}],
                         "usage": {"completion_tokens": spent + (self.ANSWER_TOKENS if enough else 0),
                                   "completion_tokens_details": {"reasoning_tokens": spent}}})

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def reasoning_provider():
    ReasoningProvider.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), ReasoningProvider)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_reasoning_models_get_max_completion_tokens_default_sampling_and_room_to_think(reasoning_provider):
    url = reasoning_provider
    caption = ChatRequest(user("Describe the image."), max_new_tokens=1024, temperature=0.0, stop=("END",))
    plain = make_backend(BackendConfig(kind="openai", base_url=url, model="gpt-5"), shared=False)
    g = plain.generate([caption])[0]  # what every GPT-5 caption got before: a 400, unscored
    assert g.text is None and "Unsupported parameter: 'max_tokens'" in g.error and g.attempts == 1

    tight = make_backend(BackendConfig(kind="openai", base_url=url, model="gpt-5", reasoning=True), shared=False)
    g = tight.generate([ChatRequest(user("Describe."), max_new_tokens=1024)])[0]  # 8,192 thinking > 1,024
    assert g.text is None and "spent its limit thinking" in g.error and "reasoning tokens 1024" in g.error

    cfg = BackendConfig(kind="openai", base_url=url, model="gemini-2.5-pro", reasoning=True, reasoning_effort="low",
                        reasoning_budget=2048)
    g = make_backend(cfg, shared=False).generate([caption])[0]
    assert g.text == "Two red circles. " and g.finish_reason == "stop"  # the stop string, applied here
    sent = ReasoningProvider.seen[-1]
    assert sent["max_completion_tokens"] == 1024 + 2048 and sent["reasoning_effort"] == "low"
    assert not {"max_tokens", "temperature", "top_p", "stop"} & set(sent)
    choice = make_backend(cfg, shared=False).choose([user("Pick one.")], ["A", "B"])[0]
    assert choice.method != "top_logprobs" and "logprobs" not in ReasoningProvider.seen[-1]  # no log-probs asked

    with pytest.raises(ConfigError, match=r"backend\.reasoning_effort"):
        BackendConfig(kind="openai", base_url=url, reasoning=True, reasoning_effort="max")
    with pytest.raises(ConfigError, match="reasoning: true"):
        BackendConfig(kind="openai", base_url=url, reasoning_budget=1024)


def test_the_rubicap_presets_api_teachers_and_writer_are_answered_by_a_reasoning_provider(reasoning_provider):
    """configs/rubicap-paper.yaml's GPT-5 and Gemini 2.5 Pro roles, sent to the stand-in: each request passes
    (max_completion_tokens, default sampling) and its limit leaves the caption or rubric its full length after
    the thinking its effort allows."""
    import yaml

    from captionrl.config import from_dict

    root = Path(__file__).resolve().parents[1]
    preset = yaml.safe_load((root / "configs" / "rubicap-paper.yaml").read_text())["rubrics"]
    roles = {f"committee[{i}]": c for i, c in enumerate(preset["committee"]) if "api_key_env" in c}
    roles["writer"] = preset["writer"]
    assert sorted(c["model"] for c in roles.values()) == ["gemini-2.5-pro", "gemini-2.5-pro", "gpt-5"]
    for role, spec in roles.items():
        cfg = from_dict(BackendConfig, {**spec, "base_url": reasoning_provider}, prefix="backend.")
        assert cfg.reasoning and cfg.reasoning_effort in GEMINI_THINKING, role
        length = preset["writer_max_new_tokens"] if role == "writer" else preset["caption_max_new_tokens"]
        assert cfg.reasoning_budget >= GEMINI_THINKING[cfg.reasoning_effort], role  # the thinking fits beside the reply
        g = make_backend(cfg, shared=False).generate([ChatRequest(user("Describe the image."), max_new_tokens=length)])[0]
        assert g.text and ReasoningProvider.seen[-1]["max_completion_tokens"] == length + cfg.reasoning_budget, (role, g)
