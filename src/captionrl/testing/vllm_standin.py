"""A CPU stand-in for ``vllm serve``: takes vLLM's command line and serves a GGUF file with llama-cpp-python.

The launch scripts (``scripts/launch/*.sh``) start their servers with ``vllm serve MODEL --served-model-name
NAME --host HOST --port PORT`` and vLLM flags. With ``CAPTIONRL_SERVE_CMD="python -m
captionrl.testing.vllm_standin"`` and ``CAPTIONRL_SERVE_MODEL=<a .gguf>`` (the embedded SmolLM2) the same
scripts run for real on a CPU: this module reads the same arguments, ignores the GPU-only flags (named on
stderr), and starts llama.cpp's OpenAI-compatible server under the served name, so ``/v1/models`` lists
exactly the name the run's config asks for. It also exits on SIGTERM like vLLM does, so the scripts' stop
path is exercised. A test fixture, not a server to deploy.
"""

from __future__ import annotations

import argparse
import os
import sys

LLAMA_LAUNCH = (
    "import runpy, llama_cpp.llama_cpp as c; d = c.llama_model_default_params\n"
    "def p():\n    x = d(); x.use_extra_bufts = False; return x\n"
    "c.llama_model_default_params = p; runpy.run_module('llama_cpp.server', run_name='__main__')"
)
"""``python -m llama_cpp.server`` with llama.cpp's extra (repacking) buffer types off: on CPUs that list AMX
(amx_int8) in a VM that does not grant the tile state, the AMX repacked Q4_1 kernels segfault on the first
multi-token batch (llama-cpp-python 0.3.36: every chat completion kills the server with SIGSEGV). Plain kernels serve the same numbers."""

VLLM_VALUE_FLAGS = ("--gpu-memory-utilization", "--tensor-parallel-size", "--data-parallel-size", "--dtype",
                    "--max-model-len", "--max-num-seqs", "--quantization", "--pipeline-parallel-size")
VLLM_SWITCHES = ("--trust-remote-code", "--enforce-eager", "--enable-prefix-caching")


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    ap = argparse.ArgumentParser(prog="vllm_standin", description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a .gguf file (vLLM's positional model)")
    ap.add_argument("--served-model-name", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--max-model-len", type=int, default=2048)
    for flag in VLLM_VALUE_FLAGS:
        if flag != "--max-model-len":
            ap.add_argument(flag)
    for flag in VLLM_SWITCHES:
        ap.add_argument(flag, action="store_true")
    return ap.parse_known_args(argv)


def main(argv: list[str] | None = None) -> None:
    args, unknown = parse(list(sys.argv[1:] if argv is None else argv))
    if not args.model.endswith(".gguf"):
        print(f"vllm_standin: {args.model!r} is not a .gguf file: the CPU stand-in serves GGUF files only "
              "(set CAPTIONRL_SERVE_MODEL to one, e.g. the embedded SmolLM2's)", file=sys.stderr)
        raise SystemExit(2)
    ignored = [f for f in (*VLLM_VALUE_FLAGS, *VLLM_SWITCHES)
               if getattr(args, f[2:].replace("-", "_"), None) not in (None, False) and f != "--max-model-len"]
    if ignored or unknown:
        print(f"vllm_standin: ignoring GPU-only flags {ignored + unknown}", file=sys.stderr, flush=True)
    threads = os.environ.get("CAPTIONRL_STANDIN_THREADS", "1")
    sys.argv = ["llama_cpp.server", "--model", args.model, "--model_alias", args.served_model_name,
                "--host", args.host, "--port", str(args.port), "--n_threads", threads, "--n_threads_batch", threads,
                "--n_ctx", str(args.max_model_len), "--logits_all", "true", "--verbose", "false"]
    exec(compile(LLAMA_LAUNCH, "<llama_launch>", "exec"), {"__name__": "__main__"})


if __name__ == "__main__":
    main()
