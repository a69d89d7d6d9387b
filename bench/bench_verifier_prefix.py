"""Verifier throughput with and without prefix sharing, on the same inputs, side by side.

The training reward scores the G captions of an item against the same K candidates, so the candidate
series (most of the tokens) form a shared prefix: in likelihood mode each candidate's context is one
prefix for G continuations; in letter mode each rotation's prompt is shared up to the caption. This runs
the identification judge on identical groups with ``share_prefix`` on and off and prints judgments per
second and the ratio, and checks that both paths give the same scores.

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_verifier_prefix.py --items 2 --g 8 --length 48
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import Printed, add_record_flag, cpu_line

from captionrl.backends.hf import HFBackend
from captionrl.domains.candidates import mine_candidates
from captionrl.domains.datasets import split_windows
from captionrl.domains.describe import describe_series
from captionrl.judges.identification import IdentificationJudge, IdentifyConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=2)
    ap.add_argument("--g", type=int, default=8, help="captions per item (the GRPO/RLOO group)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--length", type=int, default=48)
    ap.add_argument("--modes", nargs="+", default=["likelihood", "letter"])
    ap.add_argument("--dtype", default="float32")
    add_record_flag(ap)
    args = ap.parse_args()
    say = Printed(__file__)
    say(cpu_line())

    windows = split_windows("embedded", args.length)["train"]
    rng = np.random.default_rng(0)
    items = [windows[i] for i in rng.choice(len(windows), args.items, replace=False)]
    by_id = {w.id: w for w in windows}
    sets = mine_candidates(items, windows, k=args.k, seed=0, progress=False)
    captions, candidates = [], []
    for it, cs in zip(items, sets, strict=True):
        cands = [it.values.tolist(), *[by_id[d].values.tolist() for d in cs.distractor_ids]]
        base = describe_series(it)
        for g in range(args.g):  # G distinct captions of one item, as a policy group would sample
            captions.append(base if g == 0 else f"{base} Sample {g}: {describe_series(by_id[cs.distractor_ids[g % (args.k - 1)]])}")
            candidates.append(cands)
    shared = HFBackend("embedded", dtype=args.dtype, share_prefix=True)
    shared._ensure_loaded()
    plain = HFBackend.from_model(shared.model, shared._processor, share_prefix=False)
    n = len(captions)
    say(f"{args.items} items x G={args.g} captions, K={args.k}, series length {args.length}, dtype {args.dtype}")
    say(f"{'mode':<11} {'shared j/s':>11} {'plain j/s':>10} {'speed-up':>9} {'max |diff|':>11}")
    for mode in args.modes:
        cfg = IdentifyConfig(mode=mode, k=args.k, signal="soft")
        timings, scores = {}, {}
        for name, backend in (("plain", plain), ("shared", shared)):
            judge = IdentificationJudge(backend, cfg)
            judge.judge(captions[:1], {"candidates": candidates[:1]})  # warm-up
            t0 = time.perf_counter()
            out = judge.judge(captions, {"candidates": candidates})
            timings[name] = time.perf_counter() - t0
            scores[name] = np.array([j.score for j in out], dtype=float)
        diff = float(np.max(np.abs(scores["shared"] - scores["plain"])))
        say(f"{mode:<11} {n / timings['shared']:>11.2f} {n / timings['plain']:>10.2f} "
            f"{timings['plain'] / timings['shared']:>8.2f}x {diff:>11.2e}")
    say.record(args)


if __name__ == "__main__":
    main()
