"""Identification questions/s through the ``openai`` backend against the same llama.cpp server driven at
full concurrency by a minimal raw client of this bench's own, side by side (target: backend >= 80%).

Both send the identical letter-mode requests (chat completion, 1 token, ``top_logprobs``) at the same
concurrency; the raw client does nothing but POST and read the JSON. Rounds alternate (raw, backend,
raw, backend) so load from other processes falls on both; the best round of each is compared.
llama-cpp-python reuses the KV cache of the longest prefix shared with its previous prompt (its prefix
cache); the judge orders prompts so the G captions of one rotation are consecutive.

    .venv/bin/python bench/bench_openai_http.py --items 1 --g 8 --k 4 --concurrency 4
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx
from _workload import Printed, add_record_flag, cpu_line, groups, letter_questions, llama_server_class

from captionrl.backends.base import ChatRequest, option_letters
from captionrl.backends.openai_http import OpenAIBackend


async def raw_client(url: str, payloads: list[dict], concurrency: int) -> int:
    """POST every payload with ``concurrency`` in flight; returns how many came back with log-probs."""
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def one(p: dict) -> bool:
            async with sem:
                r = await client.post(url + "/chat/completions", json=p)
                return bool(r.json()["choices"][0]["logprobs"]["content"])

        return sum(await asyncio.gather(*(one(p) for p in payloads)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=1)
    ap.add_argument("--g", type=int, default=8)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--length", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--n_threads", type=int, default=1, help="llama.cpp threads")
    add_record_flag(ap)
    args = ap.parse_args()
    say = Printed(__file__)

    captions, candidates = groups(args.items, args.g, args.k, args.length)
    prompts = letter_questions(captions, candidates, args.k)
    letters = option_letters(args.k)
    server = llama_server_class()(n_threads=args.n_threads).start()
    try:
        backend = OpenAIBackend(server.base_url, model="smollm2", concurrency=args.concurrency, progress=False)
        payloads = []
        for p in prompts:
            body = backend._chat_payload(ChatRequest(p, max_new_tokens=1, temperature=0.0))
            body.update(logprobs=True, top_logprobs=backend.top_logprobs)
            payloads.append(body)
        say(cpu_line())
        say(f"llama.cpp server, --n_threads {args.n_threads}; {len(prompts)} letter questions "
            f"({args.items} items x G={args.g} x K={args.k}), concurrency {args.concurrency}")
        backend.choose(prompts[:1], letters)  # warm-up
        best = {"raw client": float("inf"), "openai backend": float("inf")}
        for rnd in range(args.rounds):
            t0 = time.perf_counter()
            ok_raw = asyncio.run(raw_client(server.base_url, payloads, args.concurrency))
            t_raw = time.perf_counter() - t0
            t0 = time.perf_counter()
            res = backend.choose(prompts, letters)
            t_be = time.perf_counter() - t0
            ok_be = sum(r.probs is not None for r in res)
            say(f"round {rnd + 1}: raw {t_raw:.2f}s ({ok_raw} ok), backend {t_be:.2f}s ({ok_be} ok)")
            best["raw client"] = min(best["raw client"], t_raw)
            best["openai backend"] = min(best["openai backend"], t_be)
        n = len(prompts)
        say(f"{'client':<16} {'best s':>7} {'questions/s':>12}")
        for name, t in best.items():
            say(f"{name:<16} {t:>7.2f} {n / t:>12.2f}")
        say(f"ratio backend/raw: {best['raw client'] / best['openai backend']:.0%} of the server's own "
            f"throughput (target >= 80%)")
    finally:
        server.stop()
    say.record(args)


if __name__ == "__main__":
    main()
