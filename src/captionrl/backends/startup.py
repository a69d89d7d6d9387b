"""The first contact with an OpenAI-compatible server: wait while it is starting, then check that it serves
the model a run names (``probe_server``), so that a run stops with a named error before any model loads.

Why a wait and not one probe: a launch that starts ``vllm serve`` and the training together finds the server
loading its weights. vLLM binds its port before it builds the engine but listens only once the model is
loaded (``vllm/entrypoints/openai/api_server.py``: ``setup_server`` binds the socket, ``serve_http`` starts
uvicorn on it after ``build_async_engine_client``), so for the minutes a large model takes to load every
connection is refused. One 5 s probe failed such runs at once.

What counts as "still starting", and is waited for with exponential backoff until the deadline: a refused or
dropped connection, a timeout, HTTP 502/503/504 (a proxy in front of a server that is not up yet). Anything
else is an answer and is judged at once: 401/404 and a model the server does not serve fail without waiting,
since waiting would not change them. Progress is logged (``captionrl.backends.startup``) once the wait has
lasted a few seconds and then every 30 s, so a person who forgot to start the server sees why the command
waits and what to do.

How long: ``BackendConfig.startup_timeout_s``; unset, the caller's default. Training (and rubric building)
waits ``TRAINING_WAIT_S`` (600 s): those commands are started together with, or just after, their servers,
and ten minutes covers loading a 72B model over tensor parallelism from local disk (an estimate: no GPU has
measured it here), while being small next to the hours a run takes. One-shot commands (``eval``, ``caption``,
``rubrics build``) wait ``COMMAND_WAIT_S`` (5 s): their servers are normally up
long before, and a mistyped port should fail within seconds.

One exception to the training default: a server named on this machine (127.0.0.1, localhost, ::1) whose port
nothing holds is not starting (vLLM binds its port first, see above), so with ``startup_timeout_s`` unset the
probe fails at once instead of waiting ten minutes on a mistyped port (``free_local_port``). A training started
in the same breath as its server, before the server bound its port, sets ``startup_timeout_s`` (the launch
scripts in ``scripts/launch`` wait for their servers themselves before they start the training).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx

from captionrl.errors import ConfigError

logger = logging.getLogger(__name__)

TRAINING_WAIT_S = 600.0
"""Default wait of a training run's probe for a server that is still starting (see the module doc)."""
COMMAND_WAIT_S = 5.0
"""Default wait of a one-shot command's probe (see the module doc)."""
STARTING_STATUSES = frozenset({502, 503, 504})
"""HTTP answers that mean "not up yet" rather than "wrong"."""
ATTEMPT_TIMEOUT_S = 5.0
"""Seconds one ``GET /models`` may take before it counts as a timeout (and, while waiting, is retried)."""
REPORT_EVERY_S = 30.0
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
T = TypeVar("T")


class ServerStarting(Exception):
    """One attempt found the server not up yet (connection refused, timeout, 502/503/504)."""


def fetch_models(base: str, headers: dict[str, str], timeout_s: float) -> list[str]:
    """``GET {base}/models`` once: the served model ids (empty when the reply has no list to read).

    Raises ``ServerStarting`` when the server is not up yet, ``ConfigError`` (field ``base_url``) for any
    other failed answer."""
    url = base.rstrip("/") + "/models"
    try:
        resp = httpx.get(url, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:  # refused, reset, timed out, DNS: the server is not (yet) there
        raise ServerStarting(f"{type(exc).__name__}: {exc}") from exc
    if resp.status_code in STARTING_STATUSES:
        raise ServerStarting(f"GET {url} returned HTTP {resp.status_code}")
    if resp.status_code != 200:
        raise ConfigError("base_url", base, f"GET {url} returned HTTP {resp.status_code}",
                          "check the URL, the server and its API key")
    try:
        return [m.get("id") for m in resp.json().get("data", [])]
    except (ValueError, AttributeError):  # no model list to check names against: requests will tell
        return []


def poll_until_up(attempt: Callable[[float], T], *, field: str, url: str, timeout_s: float, fix: str,
                  alive: Callable[[], str | None] | None = None, what: str = "",
                  progress: tuple[str, str] | None = None) -> T:
    """Call ``attempt(seconds)`` until it returns (its value is returned), retrying with backoff while it raises
    ``ServerStarting``, for at most ``timeout_s`` seconds (0: one attempt). ``alive`` (optional) says why the
    server cannot come up any more (its process ended) or returns None; it is asked before every retry, so a
    launch script's server that died stops the wait at once. A ``ConfigError`` from ``attempt`` (an answer
    waiting would not change) is raised at once under ``field``; at the deadline a ``ConfigError`` names
    ``url``, what was awaited (``what``), the last error and ``fix``. ``progress``: (label, setting) of the
    log line written after a few seconds and every ``REPORT_EVERY_S``."""
    t0 = time.monotonic()
    deadline = t0 + max(float(timeout_s), 0.0)
    delay, reported = 0.5, 0.0
    while True:
        left = deadline - time.monotonic()
        attempt_s = min(ATTEMPT_TIMEOUT_S, max(left, 1.0)) if timeout_s > 0 else ATTEMPT_TIMEOUT_S
        try:
            return attempt(attempt_s)
        except ServerStarting as exc:
            last = str(exc)
        except ConfigError as exc:
            raise ConfigError(field, url, exc.problem, exc.fix) from None
        waited = time.monotonic() - t0
        gone = alive() if alive is not None else None
        if gone is not None:
            raise ConfigError(field, url, f"the server stopped before it answered ({gone}; last: {last})",
                              "read the server's log for why (out of memory, a wrong flag, a model it cannot load)")
        if time.monotonic() + delay > deadline:
            wait = f" within {waited:.0f} s" if timeout_s > 0 else ""
            raise ConfigError(field, url, f"the server does not answer{what}{wait} ({last})", fix)
        if progress is not None and waited - reported >= (REPORT_EVERY_S if reported else 3.0):
            reported = waited
            label, setting = progress
            logger.info(f"{label}: waiting for {url} to answer ({last}); {waited:.0f} s of {timeout_s:g} s ({setting})")
        time.sleep(delay)
        delay = min(delay * 2, 10.0)


def wait_for_models(base: str, *, field: str, model: str, timeout_s: float, headers: dict[str, str] | None = None,
                    alive: Callable[[], str | None] | None = None) -> list[str]:
    """Poll ``GET {base}/models`` until the server answers (returns the served ids), for at most ``timeout_s``
    seconds (0: one attempt), as :func:`poll_until_up` does; at the deadline the fix names
    ``{field}.startup_timeout_s``."""
    return poll_until_up(
        lambda seconds: fetch_models(base, headers or {}, seconds), field=f"{field}.base_url", url=base,
        timeout_s=timeout_s, alive=alive, progress=(field, f"{field}.startup_timeout_s"),
        fix=(f"start it first (e.g. vllm serve MODEL --served-model-name {model} --port PORT) or fix the URL; "
             f"a server that needs longer to load: raise {field}.startup_timeout_s (now {timeout_s:g} s)"))


def free_local_port(base: str) -> int | None:
    """The port of ``base`` when ``base`` names this machine and nothing holds that port (we can bind it
    ourselves): no server is there or starting there. ``None`` for other hosts and for a port something holds."""
    parts = urlsplit(base)
    host = parts.hostname or ""
    if host not in LOCAL_HOSTS:
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    family = socket.AF_INET6 if host == "::1" else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("::1" if host == "::1" else "127.0.0.1", port))
        except OSError:
            return None
    return port


def probe_server(cfg: Any, field: str = "verifier", default_wait_s: float = COMMAND_WAIT_S) -> None:
    """Fail fast with a named error, before any model loads, when an OpenAI-compatible server does not
    answer ``GET /models`` or does not serve ``cfg.model``; otherwise every later judgment would be
    unscored and a run would end "successfully" with an empty table. ``cfg`` is a ``BackendConfig``; a
    server that is still starting is waited for ``cfg.startup_timeout_s`` seconds (unset: ``default_wait_s``;
    see the module doc). Every replica of ``base_url`` must answer."""
    if cfg.kind != "openai":
        return
    headers = {}
    key = os.environ.get(cfg.api_key_env)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    configured = getattr(cfg, "startup_timeout_s", None)
    timeout_s = default_wait_s if configured is None else float(configured)
    deadline = time.monotonic() + timeout_s
    for base in str(cfg.base_url).split("|"):  # replicas: every one must answer, within one deadline
        # nothing on this machine holds the port: a wrong URL, not a server starting (one probe, unless configured)
        free_port = free_local_port(base) if configured is None else None
        left = max(deadline - time.monotonic(), 0.0) if timeout_s > 0 and free_port is None else 0.0
        try:
            served = wait_for_models(base, field=field, model=cfg.model, timeout_s=left, headers=headers)
        except ConfigError as exc:
            if free_port is None:
                raise
            raise ConfigError(exc.field, base, f"nothing on this machine listens on or holds port {free_port} "
                              f"({exc.problem})",
                              f"start the server first or fix the URL; a server started alongside this command "
                              f"that has not bound its port yet: set {field}.startup_timeout_s (e.g. 600) and it "
                              f"is waited for") from None
        if served and cfg.model not in served:
            raise ConfigError(f"{field}.model", cfg.model, f"is not served at {base} (it serves {served})",
                              f"name one of {served} after '#'")


def probe_servers(servers: Sequence[tuple[Any, str]], default_wait_s: float = TRAINING_WAIT_S) -> None:
    """Probe each (backend config, config field) a training run needs, before any model loads (``probe_server``).
    A server that is still starting is waited for ``startup_timeout_s`` (unset: ``default_wait_s``, by default
    ``TRAINING_WAIT_S``): a training run is often started together with its servers."""
    for cfg, field in servers:
        probe_server(cfg, field, default_wait_s=default_wait_s)
