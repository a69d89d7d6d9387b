"""Verifier replicas: identification questions/s through the ``openai`` backend with two llama.cpp
replicas against one, side by side (target on a machine with the cores for it: >= 1.7x).

Each replica is a llama.cpp server with ``--n_threads 1``; the two-replica backend routes each request
to the least-loaded replica. Rounds alternate (one, two, one, two); the best of each is compared. On a
machine with 2 cores shared with other work the second replica has no free core of its own: the ratio
then measures contention, not the design, and the header says how many cores there are.

    .venv/bin/python bench/bench_replicas.py --items 1 --g 8 --k 4 --concurrency 4
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import Printed, add_record_flag, cpu_line, groups, letter_questions, llama_server_class

from captionrl.backends.base import option_letters
from captionrl.backends.openai_http import OpenAIBackend


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=1)
    ap.add_argument("--g", type=int, default=8)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--length", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=4, help="requests in flight per replica")
    ap.add_argument("--rounds", type=int, default=2)
    add_record_flag(ap)
    args = ap.parse_args()
    say = Printed(__file__)

    captions, candidates = groups(args.items, args.g, args.k, args.length)
    prompts = letter_questions(captions, candidates, args.k)
    letters = option_letters(args.k)
    server_cls = llama_server_class()
    a, b = server_cls(n_threads=1).start(), server_cls(n_threads=1).start()
    try:
        one = OpenAIBackend(a.base_url, model="smollm2", concurrency=args.concurrency, progress=False)
        two = OpenAIBackend([a.base_url, b.base_url], model="smollm2", concurrency=args.concurrency, progress=False)
        say(cpu_line())
        cores = os.cpu_count() or 1
        if cores < 4:
            say(f"NOTE: {cores} cores on this machine (shared with other jobs): two 1-thread replicas need "
                "2 free cores plus the client's; the ratio below is bounded by the free cores, not the routing")
        say(f"{len(prompts)} letter questions ({args.items} items x G={args.g} x K={args.k}); "
            f"llama.cpp --n_threads 1 per replica, concurrency {args.concurrency} per replica")
        two.choose(prompts[:2], letters)  # warm-up both replicas
        best = {"1 replica": float("inf"), "2 replicas": float("inf")}
        for rnd in range(args.rounds):
            times = {}
            for name, backend in (("1 replica", one), ("2 replicas", two)):
                t0 = time.perf_counter()
                res = backend.choose(prompts, letters)
                times[name] = time.perf_counter() - t0
                assert all(r.probs is not None for r in res), [r.error for r in res if r.error][:2]
                best[name] = min(best[name], times[name])
            say(f"round {rnd + 1}: " + ", ".join(f"{k} {v:.2f}s" for k, v in times.items()))
        n = len(prompts)
        say(f"{'verifier':<12} {'best s':>7} {'questions/s':>12}")
        for name, t in best.items():
            say(f"{name:<12} {t:>7.2f} {n / t:>12.2f}")
        say(f"ratio 2 replicas / 1: {best['1 replica'] / best['2 replicas']:.2f}x "
            f"(served per replica: {[s['served'] for s in two.replica_status()]})")
    finally:
        a.stop()
        b.stop()
    say.record(args)


if __name__ == "__main__":
    main()
