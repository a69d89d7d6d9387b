"""The probe waits for a server that is still starting: a real llama.cpp server started after the
probe began is found; nothing listening fails at the deadline with the URL and the fix; an answer that waiting
cannot change (404, a model the server does not serve, a server process that died) fails at once."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from captionrl.backends import BackendConfig
from captionrl.backends.startup import probe_server, wait_for_models
from captionrl.errors import ConfigError
from servers import LlamaServer, free_port, requires_llama_cpp, send_json


def _cfg(port: int, model: str = "m", **kw) -> BackendConfig:
    return BackendConfig(kind="openai", model=model, base_url=f"http://127.0.0.1:{port}/v1", **kw)


@pytest.mark.server
@requires_llama_cpp
def test_a_server_started_after_the_probe_is_waited_for():
    """The docs' old launch lines started ``vllm serve ... &`` and the training at once: the training's one
    5 s probe failed while the server loaded. Here the server starts 3 s after the probe began."""
    server = LlamaServer(port=free_port())
    starter = threading.Timer(3.0, server.start)
    t0 = time.monotonic()
    starter.start()
    try:
        probe_server(_cfg(server.port, model=server.model, startup_timeout_s=90), "verifier")
        waited = time.monotonic() - t0
        assert server.alive and waited >= 3.0, waited
    finally:
        starter.join()
        server.stop()


def test_nothing_listening_fails_at_the_deadline_naming_url_and_fix():
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as err:
        probe_server(_cfg(port, startup_timeout_s=2), "judge")
    took = time.monotonic() - t0
    assert 1.0 <= took < 8.0, took  # waited (retries with backoff), then stopped near the deadline
    e = err.value
    assert e.field == "judge.base_url" and str(port) in str(e) and "does not answer" in e.problem
    assert "judge.startup_timeout_s" in e.fix and "vllm serve" in e.fix


def test_zero_means_one_probe():
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="does not answer"):
        probe_server(_cfg(free_port(), startup_timeout_s=0), "verifier")
    assert time.monotonic() - t0 < 2.0


def test_training_waits_longer_than_one_shot_commands_by_default(monkeypatch):
    """Unset, the caller's default applies: training passes 600 s, commands 5 s."""
    seen = []
    monkeypatch.setattr("captionrl.backends.startup.wait_for_models",
                        lambda base, **kw: seen.append(kw["timeout_s"]) or ["m"])
    from captionrl.backends import backend_from_spec
    from captionrl.backends.startup import probe_servers

    with socket.socket() as held:  # a port something holds: a server may be starting there
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        probe_servers([(_cfg(port), "verifier")])
        backend_from_spec(f"openai:http://127.0.0.1:{port}/v1#m")
        probe_servers([(_cfg(port, startup_timeout_s=42), "verifier")])
    assert [round(s) for s in seen] == [600, 5, 42]


def test_a_local_port_nothing_holds_fails_at_once_naming_the_wait_setting():
    """A mistyped local port made training wait its full 600 s before the error (CI, 2026-12-03); a port
    nobody holds cannot be a server that is starting (vLLM binds before it loads)."""
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as err:
        from captionrl.backends.startup import probe_servers

        probe_servers([(_cfg(port), "verifier")])
    assert time.monotonic() - t0 < 3.0
    e = err.value
    assert e.field == "verifier.base_url" and f"port {port}" in e.problem and "verifier.startup_timeout_s" in e.fix


def test_negative_wait_is_refused_with_a_fix():
    with pytest.raises(ConfigError) as err:
        _cfg(1, startup_timeout_s=-1)
    assert err.value.field == "backend.startup_timeout_s" and err.value.fix


class _Scripted(http.server.BaseHTTPRequestHandler):
    """``GET /v1/models`` answers from the server's list of (status, body), the last one repeated."""

    def do_GET(self) -> None:
        replies = self.server.replies  # type: ignore[attr-defined]
        status, body = replies.pop(0) if len(replies) > 1 else replies[0]
        self.server.hits += 1  # type: ignore[attr-defined]
        send_json(self, status, body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def scripted() -> Iterator:
    """A local HTTP server whose answers a test scripts (for the status paths: a fake for parse/error paths)."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    httpd.hits = 0
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()


MODELS = {"data": [{"id": "m"}]}


def test_503_while_loading_is_waited_for(scripted):
    scripted.replies = [(503, {}), (503, {}), (200, MODELS)]
    probe_server(_cfg(scripted.server_address[1], startup_timeout_s=30), "verifier")
    assert scripted.hits == 3


def test_an_answer_that_waiting_cannot_change_fails_at_once(scripted):
    port = scripted.server_address[1]
    scripted.replies = [(404, {})]
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="HTTP 404") as err:
        probe_server(_cfg(port, startup_timeout_s=600), "verifier")
    assert err.value.field == "verifier.base_url" and scripted.hits == 1
    scripted.replies = [(200, {"data": [{"id": "other"}]})]
    with pytest.raises(ConfigError, match="is not served") as err:
        probe_server(_cfg(port, startup_timeout_s=600), "verifier")
    assert err.value.field == "verifier.model"
    assert time.monotonic() - t0 < 5.0


def test_a_server_process_that_died_stops_the_wait():
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"stopped before it answered.*exit status 1"):
        wait_for_models(f"http://127.0.0.1:{port}/v1", field="verifier", model="m", timeout_s=600,
                        alive=lambda: "exit status 1")
    assert time.monotonic() - t0 < 5.0
