"""Benchmark: nearest-distractor mining on a 100,000-window pool, fast path against the naive scan.

The pool is real: every stride-1 window of the embedded corpus (statsmodels series), plus affine copies
of each source series (seeded scale and offset, each copy its own source) until the pool reaches
``--pool``. Stride-1 windows are the hardest case for the overlap limit: each item's nearest neighbours
are its own shifted copies, which must all be skipped. The naive per-item scan runs on a subsample;
its time is extrapolated linearly to the whole pool (it is O(n log n) per item) and its distractors are
checked to equal the fast path's on that subsample.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_candidates.py --pool 100000 --length 64 --k 8
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import Printed, add_record_flag, cpu_line

from captionrl.domains.candidates import mine_candidates, mine_candidates_naive
from captionrl.domains.corpora import load_embedded_corpus
from captionrl.domains.timeseries import window
from captionrl.types import Series


def build_pool(size: int, length: int, seed: int) -> list[Series]:
    corpus = load_embedded_corpus()
    rng = np.random.default_rng(seed)
    pool: list[Series] = []
    copy = 0
    while len(pool) < size:
        for s in corpus:
            if copy == 0:
                src = s
            else:
                a, b = rng.uniform(0.5, 2.0), rng.normal(0.0, float(s.values.std()) or 1.0)
                src = Series(id=f"{s.id}~{copy}", values=s.values * a + b, domain=s.domain)
            pool.extend(window(src, length, 1))
        copy += 1
    return pool[:size]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", type=int, default=100_000)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--naive-items", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    add_record_flag(ap)
    args = ap.parse_args()
    say = Printed(__file__)
    say(cpu_line())

    import scipy.spatial  # noqa: F401  (import time is not mining time)

    t0 = time.perf_counter()
    pool = build_pool(args.pool, args.length, args.seed)
    say(f"pool: {len(pool):,} windows of length {args.length} from {len({s.source for s in pool})} sources "
        f"(built in {time.perf_counter() - t0:.1f} s)")

    t0, c0 = time.perf_counter(), time.process_time()
    fast = mine_candidates(pool, pool, k=args.k, seed=args.seed, progress=False)
    t_fast, c_fast = time.perf_counter() - t0, time.process_time() - c0

    rng = np.random.default_rng(args.seed)
    sub_idx = rng.choice(len(pool), size=args.naive_items, replace=False)
    sub = [pool[i] for i in sub_idx]
    t0, c0 = time.perf_counter(), time.process_time()
    naive = mine_candidates_naive(sub, pool, k=args.k, seed=args.seed)
    t_naive, c_naive = time.perf_counter() - t0, time.process_time() - c0
    per_item = c_naive / len(sub)
    est_naive = per_item * len(pool)
    agree = sum(fast[i].distractor_ids == nv.distractor_ids for i, nv in zip(sub_idx, naive, strict=True))

    # CPU seconds are the comparison: wall time on a shared machine measures the neighbours too.
    say(f"{'method':<28}{'items':>10}{'CPU s':>10}{'wall s':>10}{'CPU s/item':>12}")
    say(f"{'fast (k-d tree, vectorised)':<28}{len(pool):>10,}{c_fast:>10.2f}{t_fast:>10.2f}"
        f"{c_fast / len(pool):>12.2e}")
    say(f"{'naive per-item scan':<28}{len(sub):>10,}{c_naive:>10.2f}{t_naive:>10.2f}{per_item:>12.2e}")
    say(f"naive extrapolated to {len(pool):,} items: {est_naive:,.0f} CPU s; "
        f"speed-up {est_naive / c_fast:,.0f}x")
    say(f"same distractors on the subsample: {agree}/{len(sub)}")
    say.record(args)


if __name__ == "__main__":
    main()
