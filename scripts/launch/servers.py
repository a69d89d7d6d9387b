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

``wait --timeout S FIELD=URL=MODEL=PID=LOG...``
    Waits until every server answers ``GET /models`` with its model (``captionrl.backends.startup``, the
    same wait as the training's own probe), or its process ends, or the deadline passes; then exits 2 with
    the server's log tail.
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
    except CaptionRLError as exc:
        fail(f"the run's config is refused: {' '.join(str(exc).splitlines())}", "fix the config or the overrides")
    serve = list(dict.fromkeys(args.serve))
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


def wait(args: argparse.Namespace) -> None:
    from captionrl.backends.startup import wait_for_models
    from captionrl.errors import ConfigError

    t0 = time.monotonic()
    deadline = t0 + args.timeout
    for spec in args.servers:
        field, url, model, pid, log = spec.split("=", 4)
        try:
            served = wait_for_models(url, field=field, model=model, timeout_s=max(deadline - time.monotonic(), 0.0),
                                     alive=lambda pid=int(pid): _ended(pid))
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
    w.add_argument("servers", nargs="+", help="FIELD=URL=MODEL=PID=LOG")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)  # plan: the run's key=value overrides follow "--"
    args = ap.parse_args(argv[:cut])
    args.overrides = argv[cut + 1:]
    {"plan": plan, "wait": wait}[args.command](args)


if __name__ == "__main__":
    main()
