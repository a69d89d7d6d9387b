"""What the launch scripts (``scripts/launch/*.sh``) ask of Python: which servers a run needs, and whether the
ones they started answer.

``plan RECIPE CONFIG --serve FIELD... [--dry-run] [--api-committee] -- OVERRIDES...``
    Loads the run's config exactly as ``captionrl train RECIPE`` will (the YAML plus the same ``key=value``
    overrides) and lists the OpenAI-compatible servers that command probes before anything loads (the
    recipe's own list: ``LineupRecipe.servers``, ``rubicap.servers`` / ``rubicap.build_servers`` with
    ``build_rubrics=true``). Every server on this machine must be one the script starts (``--serve FIELD``),
    and every server the script starts must be one the run uses; a remote one (an API) needs its key in the
    environment. Prints one line per server to start, ``serve FIELD HOST PORT MODEL`` (port and served name
    from the config, so the script and the config cannot disagree), and for RubiCap ``store PATH`` (the rubric
    store the build writes). ``--api-committee`` (RubiCap on one GPU) keeps only the committee members that
    are APIs and prints that override as ``override KEY=VALUE`` for the script to pass on. A mismatch exits 2
    with the field and the fix; a missing API key too, except under ``--dry-run`` (a warning then).

    TRL's vLLM server (``train.vllm_mode: server``) is the field ``train.vllm_server``: a run that sends its
    rollouts to this machine needs the script to start it, a script that starts it needs a run in server mode,
    and its port may be no verifier's or judge's (``train.run.gpu_checks.check_vllm_port``). Its line is ``trl
    train.vllm_server HOST PORT MAX_MODEL_LEN MODEL``: the address TRL's client connects to
    (``train.vllm_server_host``/``_port`` or ``_base_url``), ``train.vllm_max_model_length`` (``-`` when unset)
    and the policy's weights (``policy.model``: the server must load the model being trained).

``wait --timeout S KIND=FIELD=URL=MODEL=PID=LOG...``
    Waits until every server is ready, or its process ends, or the deadline passes; then exits 2 with the
    server's log tail. KIND ``openai``: it answers ``GET /models`` with its model (``captionrl.backends.startup``,
    the same wait as the training's own probe). KIND ``trl`` (``trl vllm-serve``; in TRL 1.16 that is ``vllm
    serve`` with TRL's flags and ``VLLM_SERVER_DEV_MODE=1``, ``trl/scripts/vllm_serve.py``): the checks TRL's
    ``VLLMClient`` makes when the trainer connects (``trl/generation/vllm_client.py``): ``GET /health`` answers
    200 (``check_server``), ``GET /v1/models`` lists the policy, and ``GET /server_info`` is there (the
    development endpoints TRL syncs the weights through: a plain ``vllm serve`` lacks them and fails only at
    the first weight sync).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

LOCAL_HOSTS = {"127.0.0.1", "localhost", "0.0.0.0", "::1", ""}
TRL_FIELD = "train.vllm_server"
"""The field name a script gives TRL's vLLM server (``serve_trl`` in ``common.sh``): train.vllm_server_*."""


def fail(problem: str, fix: str) -> None:
    print(f"launch: {problem}. Fix: {fix}", file=sys.stderr)
    raise SystemExit(2)


def is_local(url: str) -> bool:
    return (urlparse(url).hostname or "") in LOCAL_HOSTS


def load(recipe: str, config: str, overrides: list[str]) -> Any:
    import importlib

    from captionrl.cli import COMMANDS
    from captionrl.config import load_config

    if ("train", recipe) not in COMMANDS:
        fail(f"unknown recipe {recipe!r}", "use lineup, rubicap or moco")
    module = importlib.import_module(COMMANDS[("train", recipe)][0])
    return load_config(module.CONFIG, config, overrides)


def probed(recipe: str, cfg: Any) -> list[tuple[Any, str]]:
    """(BackendConfig, field) of every server ``captionrl train RECIPE`` probes with this config."""
    if recipe == "lineup":
        from captionrl.train.lineup import LineupRecipe

        return LineupRecipe(cfg).servers()
    if recipe == "rubicap":
        from captionrl.train import rubicap

        return rubicap.build_servers(cfg) if cfg.build_rubrics else rubicap.servers(cfg)
    from captionrl.train.moco import MocoRecipe

    return MocoRecipe(cfg).servers()


def vllm_address(train: Any) -> tuple[str, int]:
    from captionrl.train.run.gpu_checks import vllm_server_address

    return vllm_server_address(train)


def trl_server(cfg: Any, needed: list[tuple[Any, str]]) -> tuple[str, int, int | None, str] | None:
    """(host, port, max_model_len, model) of the TRL vLLM server on this machine the run sends its rollouts
    to, or None (colocated rollouts, no vLLM, or a server elsewhere). Its port may be no verifier's or judge's."""
    from captionrl.train.run.gpu_checks import check_vllm_port

    t = cfg.train
    if not (getattr(t, "use_vllm", False) and getattr(t, "vllm_mode", "colocate") == "server"):
        return None
    check_vllm_port(t, needed)
    host, port = vllm_address(t)
    if host not in LOCAL_HOSTS:
        return None
    return host, port, t.vllm_max_model_length, policy_weights(cfg.policy.model)


def policy_weights(model: str) -> str:
    """What ``trl vllm-serve --model`` loads for ``policy.model``: a folder or hub id as given; the project's
    named models (embedded, tiny-*, a .gguf) as the folder the training loads."""
    if Path(model).expanduser().is_dir() or (model.count("/") == 1 and not Path(model).exists()):
        return model
    from captionrl.backends.hf import resolve_model_path

    return resolve_model_path(model)[0]


def plan(args: argparse.Namespace) -> None:
    from captionrl.errors import CaptionRLError

    overrides = list(args.overrides)
    try:
        cfg = load(args.recipe, args.config, overrides)
        if args.api_committee:  # RubiCap on one GPU: keep the committee members that are APIs
            api = [b for b in cfg.rubrics.committee if not is_local(str(b.get("base_url", "")))]
            if not api:
                fail("the config's rubric committee has no API teachers, and its open teachers do not fit one GPU",
                     "build the store on a node (scripts/launch/rubicap-node.sh), then give RUBRIC_STORE=path/rubrics.jsonl")
            overrides.append("rubrics.committee=" + json.dumps(api, separators=(",", ":")))
            cfg = load(args.recipe, args.config, overrides)
            print(f"override {overrides[-1]}")
        needed = probed(args.recipe, cfg)
        trl = trl_server(cfg, needed)
    except CaptionRLError as exc:
        fail(f"the run's config is refused: {' '.join(str(exc).splitlines())}", "fix the config or the overrides")
    serve = list(dict.fromkeys(args.serve))
    if TRL_FIELD in serve and trl is None:
        t = cfg.train
        fail(f"the script starts TRL's vLLM server ({TRL_FIELD}) but the run does not use one (train.use_vllm="
             f"{str(t.use_vllm).lower()}, train.vllm_mode={t.vllm_mode}, at {':'.join(map(str, vllm_address(t)))})",
             "drop it from the script, or set train.vllm_mode=server (and the server's address to this machine)")
    if trl is not None and TRL_FIELD not in serve:
        host, port = trl[0], trl[1]
        fail(f"the run sends its rollouts to TRL's vLLM server at http://{host}:{port} (train.vllm_mode=server) and this "
             "script starts none", "start it in the script (serve_trl NAME GPUS), or set train.vllm_mode=colocate")
    serve = [f for f in serve if f != TRL_FIELD]
    local: dict[str, tuple[str, int, str]] = {}
    by_port: dict[tuple[str, int], list[str]] = {}
    for backend, field in needed:
        if backend.kind != "openai":
            continue  # in-process: nothing to start
        urls = [u for u in str(backend.base_url).split("|") if u.strip()]
        for url in urls:
            u = urlparse(url)
            if not is_local(url):
                if not os.environ.get(backend.api_key_env):
                    problem = f"{field} is {url} ({backend.model}), which needs the API key in ${backend.api_key_env}"
                    fix = f"export {backend.api_key_env}=... (or serve that role locally and point {field} at it)"
                    if args.dry_run:
                        print(f"# WARNING: {problem}; a real launch stops here. Fix: {fix}")
                    else:
                        fail(problem, fix)
                continue
            if len(urls) > 1:
                fail(f"{field} names {len(urls)} replicas ({backend.base_url}); a launch script starts one server per role",
                     "give the role one URL (a server with --data-parallel-size serves replicas behind one port)")
            port = u.port or (443 if u.scheme == "https" else 80)
            local[field] = (u.hostname or "127.0.0.1", port, backend.model)
            by_port.setdefault((u.hostname or "127.0.0.1", port), []).append(field)
    for (host, port), fields in by_port.items():
        models = {local[f][2] for f in fields}
        if len(models) > 1:
            fail(f"{' and '.join(fields)} share {host}:{port} but name different models ({sorted(models)})",
                 "give each model a port of its own")
        started = [f for f in fields if f in serve]
        if not started:
            fail(f"the run probes {', '.join(fields)} at http://{host}:{port} ({local[fields[0]][2]}) and this script "
                 "starts no server there", "start it in the script (serve FIELD ...) or point the field at a running server")
        if len(started) > 1:
            fail(f"the script starts {' and '.join(started)} on the same port {port}", "start one server for them")
    unused = [f for f in serve if f not in local]
    if unused:
        fail(f"the script starts a server for {', '.join(unused)} but the run does not use one there "
             f"(it uses: {', '.join(local) or 'no local server'})", "drop it from the script, or check the config and overrides")
    for field in serve:
        host, port, model = local[field]
        print(f"serve {field} {host} {port} {model}")
    if trl is not None:
        host, port, max_len, model = trl
        print(f"trl {TRL_FIELD} {host} {port} {max_len if max_len else '-'} {model}")
    if args.recipe == "rubicap":
        print(f"store {cfg.store_path()}")


def _ended(pid: int) -> str | None:
    """Why process ``pid`` can no longer answer (it ended), or None while it runs."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return "its process ended" if state in ("Z", "X") else None
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return "its process ended"
        except PermissionError:
            return None
        return None


def _tail(path: str, lines: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_for_trl(url: str, *, model: str, timeout_s: float, alive: Any) -> None:
    """Wait until TRL's vLLM server at ``url`` passes the checks ``VLLMClient`` makes (module doc): ``GET
    /health`` 200, polled with backoff while the port refuses connections or answers 502/503/504 (vLLM listens
    only once the model is loaded; the same wait as the HTTP backends', ``poll_until_up``), then ``/v1/models``
    lists ``model`` and ``/server_info`` is there."""
    import httpx

    from captionrl.backends.startup import STARTING_STATUSES, ServerStarting, poll_until_up
    from captionrl.errors import ConfigError

    field = f"{TRL_FIELD} ({url})"

    def health(seconds: float) -> None:
        try:
            resp = httpx.get(url + "/health", timeout=seconds)
        except httpx.HTTPError as exc:
            raise ServerStarting(f"{type(exc).__name__}: {exc}") from exc
        if resp.status_code in STARTING_STATUSES:
            raise ServerStarting(f"GET /health returned HTTP {resp.status_code}")
        if resp.status_code != 200:
            raise ConfigError(field, url, f"GET /health answered HTTP {resp.status_code}: not TRL's vLLM server",
                              "check that nothing else listens on train.vllm_server_port")

    poll_until_up(health, field=field, url=url, timeout_s=timeout_s, alive=alive, what=" GET /health",
                  fix="read its log; a model that needs longer to load: raise CAPTIONRL_READY_TIMEOUT")
    try:
        served = [m.get("id") for m in httpx.get(url + "/v1/models", timeout=10.0).json().get("data", [])]
        info = httpx.get(url + "/server_info", params={"config_format": "json"}, timeout=10.0).status_code
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        raise ConfigError(field, url, f"answers /health but not /v1/models or /server_info ({exc})",
                          "start it with trl vllm-serve (vLLM's server with TRL's flags)") from None
    if model not in served:
        raise ConfigError(field, url, f"serves {served}, not the policy {model}",
                          "start it with the policy's weights: trl vllm-serve --model <policy.model>")
    if info == 404:
        raise ConfigError(field, url, "has no development endpoints (/server_info: 404), which TRL syncs the weights through",
                          "start it with trl vllm-serve, which sets VLLM_SERVER_DEV_MODE=1 (or set it for vllm serve)")


def wait(args: argparse.Namespace) -> None:
    from captionrl.backends.startup import wait_for_models
    from captionrl.errors import ConfigError

    t0 = time.monotonic()
    deadline = t0 + args.timeout
    for spec in args.servers:
        kind, field, url, model, pid, log = spec.split("=", 5)
        alive = lambda pid=int(pid): _ended(pid)  # noqa: E731
        left = max(deadline - time.monotonic(), 0.0)
        try:
            if kind == "trl":
                wait_for_trl(url, model=model, timeout_s=left, alive=alive)
                served = [model]
            else:
                served = wait_for_models(url, field=field, model=model, timeout_s=left, alive=alive)
        except ConfigError as exc:
            print(f"launch: {field} ({model} at {url}) is not ready: {' '.join(str(exc).splitlines())}\n"
                  f"launch: last lines of its log {log}:\n{_tail(log)}", file=sys.stderr)
            raise SystemExit(2) from None
        if served and model not in served:
            print(f"launch: {field} at {url} serves {served}, not {model}\nlaunch: its log {log}", file=sys.stderr)
            raise SystemExit(2)
        print(f"launch: {field} ready at {url} ({model}) after {time.monotonic() - t0:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="the servers a run needs, checked against those the script starts")
    p.add_argument("recipe")
    p.add_argument("config")
    p.add_argument("--serve", action="append", default=[], help="a config field whose server the script starts")
    p.add_argument("--dry-run", action="store_true", help="a missing API key is a warning, not an error")
    p.add_argument("--api-committee", action="store_true",
                   help="RubiCap: keep only the committee members that are APIs (printed as an override line)")
    w = sub.add_parser("wait", help="wait until started servers answer")
    w.add_argument("--timeout", type=float, required=True, help="seconds for all of them together")
    w.add_argument("servers", nargs="+", help="KIND=FIELD=URL=MODEL=PID=LOG (KIND: openai or trl)")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)  # plan: the run's key=value overrides follow "--"
    args = ap.parse_args(argv[:cut])
    args.overrides = argv[cut + 1:]
    {"plan": plan, "wait": wait}[args.command](args)


if __name__ == "__main__":
    main()
