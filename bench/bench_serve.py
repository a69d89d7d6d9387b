"""The reward service against in-process reward calls on the same batch, side by side.

Three ways to score the same captions with the same judge object (embedded verifier, in-process):
1. in-process: one ``judge.judge`` call on the whole batch (what a TRL reward function does);
2. service, one request: the batch POSTed as one OpenRLHF request (HTTP + JSON overhead);
3. service, one request per caption from concurrent clients (verl's per-sample reward calls), pooled by
   the service's batching window into shared judge calls.
Prints seconds, captions/s and each service path's ratio to in-process, and checks the rewards agree.

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_serve.py --items 2 --g 4 --k 4
"""

from __future__ import annotations

import argparse
import math
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx
from _workload import Printed, add_record_flag, cpu_line, groups

from captionrl.adapters.engine import encode_label
from captionrl.backends.hf import HFBackend
from captionrl.config import from_dict
from captionrl.judges.identification import IdentificationJudge, IdentifyConfig
from captionrl.serve.config import RewardServiceConfig
from captionrl.serve.reward import make_server


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=2)
    ap.add_argument("--g", type=int, default=4)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--length", type=int, default=16)
    ap.add_argument("--window_ms", type=float, default=50.0)
    ap.add_argument("--dtype", default="auto")
    add_record_flag(ap)
    args = ap.parse_args()
    say = Printed(__file__)

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from servers import free_port

    captions, candidates = groups(args.items, args.g, args.k, args.length)
    backend = HFBackend("embedded", dtype=args.dtype)
    backend._ensure_loaded()
    icfg = IdentifyConfig(mode="likelihood", k=args.k, signal="soft")
    judge = IdentificationJudge(backend, icfg)
    cfg = from_dict(RewardServiceConfig, {"reward": "identification", "port": free_port(), "records": None,
                                          "batch_window_ms": args.window_ms, "identify": vars(icfg)})
    server = make_server(cfg, judge)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{cfg.port}/reward"
    prompt = "Describe the series.\n"
    labels = [encode_label(c) for c in candidates]
    n = len(captions)
    say(cpu_line())
    say(f"{n} captions ({args.items} items x G={args.g}), K={args.k}, likelihood verifier "
        f"{backend.dtype_chosen}; batching window {args.window_ms:g} ms")
    judge.judge(captions[:1], {"candidates": candidates[:1]})  # warm-up

    t0 = time.perf_counter()
    local = [j.score for j in judge.judge(captions, {"candidates": candidates})]
    t_local = time.perf_counter() - t0

    t0 = time.perf_counter()
    body = {"query": [prompt + c for c in captions], "prompts": [prompt] * n, "labels": labels}
    one = httpx.post(url, json=body, timeout=600).json()["rewards"]
    t_one = time.perf_counter() - t0

    def single(i: int) -> float:
        r = httpx.post(url, json={"query": [prompt + captions[i]], "prompts": [prompt], "labels": [labels[i]]},
                       timeout=600)
        return r.json()["rewards"][0]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=n) as pool:
        per_sample = list(pool.map(single, range(n)))
    t_many = time.perf_counter() - t0
    health = httpx.get(url.replace("/reward", "/health"), timeout=10).json()
    server.should_exit = True
    thread.join(timeout=10)

    def agree(xs: list[float]) -> float:
        return max(abs(a - b) for a, b in zip(xs, local, strict=True) if not (math.isnan(a) or b is None))

    say(f"{'path':<34} {'seconds':>8} {'captions/s':>11} {'vs in-process':>14} {'max |diff|':>11}")
    say(f"{'in-process judge call':<34} {t_local:>8.2f} {n / t_local:>11.2f} {1.0:>13.2f}x {0.0:>11.1e}")
    say(f"{'service, 1 request':<34} {t_one:>8.2f} {n / t_one:>11.2f} {t_local / t_one:>13.2f}x {agree(one):>11.1e}")
    say(f"{f'service, {n} concurrent requests':<34} {t_many:>8.2f} {n / t_many:>11.2f} {t_local / t_many:>13.2f}x "
        f"{agree(per_sample):>11.1e}")
    say(f"judge calls made by the service: {health['batches']} for {health['requests']} requests")
    say.record(args)


if __name__ == "__main__":
    main()
