"""A CPU stand-in for ``trl vllm-serve``: takes TRL's command line and answers the endpoints TRL's client checks
before a training run in ``train.vllm_mode: server`` connects, so the launch script that starts it
(``scripts/launch/moco-node.sh``) runs its start, readiness wait and stop for real on a CPU.

``trl vllm-serve`` (TRL 1.16, ``trl/scripts/vllm_serve.py``) runs vLLM's own OpenAI server with TRL's flags and
``VLLM_SERVER_DEV_MODE=1``; ``VLLMClient`` (``trl/generation/vllm_client.py``) first polls ``GET /health``
until it answers 200, then reads the model from ``GET /v1/models``, and syncs weights through the development
endpoints (``GET /server_info`` answers 404 without them). This stand-in answers exactly those three, after an
optional load delay during which, like vLLM, it does not listen at all. It generates nothing (a CPU cannot
run vLLM, and the training in server mode needs a GPU): a test fixture, not a server to deploy.

    python -m captionrl.testing.trl_standin --model M --host H --port P [--max_model_len N] [trl flags]
        [--standin-delay S] [--standin-no-dev-mode] [--standin-fail]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    ap = argparse.ArgumentParser(prog="trl_standin", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--host", default="0.0.0.0")  # TRL's default
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--max_model_len", "--max-model-len", type=int)
    ap.add_argument("--standin-delay", type=float, default=0.0, help="seconds before it listens (vLLM loading)")
    ap.add_argument("--standin-no-dev-mode", action="store_true", help="answer /server_info with 404 (plain vllm serve)")
    ap.add_argument("--standin-fail", action="store_true", help="exit 1 after the delay, as vLLM does on a load failure")
    return ap.parse_known_args(argv)


def main(argv: list[str] | None = None) -> None:
    args, ignored = parse(list(sys.argv[1:] if argv is None else argv))
    if ignored:
        print(f"trl_standin: ignoring GPU-only flags {ignored}", file=sys.stderr, flush=True)
    model = args.model
    if not Path(model).expanduser().exists() and model.count("/") != 1:
        print(f"trl_standin: {model!r} is neither a folder nor a hub id: vLLM cannot load it", file=sys.stderr)
        raise SystemExit(1)
    time.sleep(args.standin_delay)
    if args.standin_fail:
        print("trl_standin: failing as asked (--standin-fail)", file=sys.stderr)
        raise SystemExit(1)
    answers = {"/health": (200, None), "/v1/models": (200, {"object": "list", "data": [{"id": model, "object": "model"}]})}
    if not args.standin_no_dev_mode:
        answers["/server_info"] = (200, {"vllm_config": {"model_config": {"model": model, "max_model_len": args.max_model_len}}})

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = answers.get(urlparse(self.path).path, (404, {"detail": "Not Found"}))
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, fmt: str, *a: object) -> None:
            print(f"trl_standin: {self.command} {self.path} {fmt % a}", file=sys.stderr, flush=True)

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"trl_standin: serving {model} on {args.host}:{args.port}", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
