"""A real OpenAI-compatible server for tests: llama-cpp-python serving the embedded SmolLM2 GGUF.

Start one with ``LlamaServer().start()`` or use the fixtures: ``llama_server`` (one per session, shared,
never killed) and ``llama_server_factory`` (servers a test may kill and restart; stopped at teardown).
Tests that need them skip with a clear reason only when ``llama_cpp`` is not importable.

llama-cpp-python 0.3.36 shifts echo log-probs by one token unless the prompt starts with the BOS token,
so backends pointed at it use ``echo_prefix=SMOLLM2_BOS`` (see ``captionrl.backends.openai_http``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from captionrl.testing.vllm_standin import LLAMA_LAUNCH as LAUNCH  # llama.cpp, AMX kernels off

LLAMA_CPP_AVAILABLE = importlib.util.find_spec("llama_cpp") is not None
requires_llama_cpp = pytest.mark.skipif(
    not LLAMA_CPP_AVAILABLE,
    reason="llama-cpp-python[server] is not installed (pip install 'captionrl[server]'): "
    "the real OpenAI-compatible server tests need it",
)
SMOLLM2_BOS = "<|im_start|>"


def send_json(handler: Any, status: int, body: Any) -> None:
    """Answer a ``BaseHTTPRequestHandler`` request with ``body`` as JSON (the stand-in servers' one reply)."""
    import json

    data = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, from this test worker's own block.

    The suite runs in two pytest-xdist workers. A port from ``bind(0)`` could be handed to the other
    worker's server between this check and our server's own bind, or be one that a "nothing listens
    here" test of the other worker points at (those take theirs from ``bind(0)``). So each worker draws
    from its own block of 1,000 ports below Linux's ephemeral range (32768 and up), where ``bind(0)``
    never lands.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    low = 20000 + (index % 12) * 1000
    for port in random.Random().sample(range(low, low + 1000), 1000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {low}-{low + 999} for test worker {worker}")



class LlamaServer:
    """``python -m llama_cpp.server`` on 127.0.0.1, one thread (the CPU is shared), logits for all tokens."""

    def __init__(self, model: str | Path | None = None, port: int | None = None, *, logits_all: bool = True,
                 n_ctx: int = 2048, n_threads: int = 1) -> None:
        if model is None:
            from captionrl.embedded import embedded_gguf_path

            model = embedded_gguf_path()
        self.model = str(model)
        self.port = port or free_port()
        self.logits_all = logits_all
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = Path(tempfile.mkstemp(prefix=f"llama-server-{self.port}-", suffix=".log")[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command(self) -> list[str]:
        return [sys.executable, "-c", LAUNCH, "--model", self.model, "--host", "127.0.0.1",
                "--port", str(self.port), "--n_threads", str(self.n_threads), "--n_threads_batch",
                str(self.n_threads), "--n_ctx", str(self.n_ctx), "--logits_all", str(self.logits_all).lower(),
                "--verbose", "false"]

    def start(self, timeout_s: float = 60.0) -> LlamaServer:
        """Start the process and wait until ``/v1/models`` answers; raise with the log tail if it dies."""
        if not LLAMA_CPP_AVAILABLE:
            pytest.skip("llama-cpp-python[server] is not installed (pip install 'captionrl[server]')")
        env = {**os.environ, "OMP_NUM_THREADS": str(self.n_threads)}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama server exited with {self.proc.returncode}: {self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/models", timeout=1.0).status_code == 200:
                    return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"llama server not ready after {timeout_s:.0f}s: {self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL, as a crash or an OOM kill would: no graceful shutdown, connections drop."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self, timeout_s: float = 60.0) -> LlamaServer:
        """Stop (if running) and start again on the same port, as an operator restarting a server would."""
        self.stop()
        return self.start(timeout_s)

    def log_tail(self, n: int = 1500) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def backend(self, **kw: Any) -> Any:
        """An ``OpenAIBackend`` for this server (echo log-probs aligned with the BOS prefix)."""
        from captionrl.backends.openai_http import OpenAIBackend

        kw.setdefault("echo_prefix", SMOLLM2_BOS)
        kw.setdefault("progress", False)
        return OpenAIBackend(self.base_url, model="smollm2", **kw)

    def __enter__(self) -> LlamaServer:
        return self.start() if not self.alive else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture(scope="session")
def llama_server() -> Iterator[LlamaServer]:
    """One shared llama.cpp server for the session. Do not kill it: use ``llama_server_factory``."""
    if not LLAMA_CPP_AVAILABLE:
        pytest.skip("llama-cpp-python[server] is not installed (pip install 'captionrl[server]')")
    server = LlamaServer().start()
    yield server
    server.stop()


@pytest.fixture
def llama_server_factory() -> Iterator[Callable[..., LlamaServer]]:
    """Start private servers (to kill, restart or misconfigure); all are stopped after the test."""
    started: list[LlamaServer] = []

    def start(**kw: Any) -> LlamaServer:
        server = LlamaServer(**kw)
        started.append(server)
        return server.start()

    yield start
    for s in started:
        s.stop()
