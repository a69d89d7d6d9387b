"""Benchmark: how far the rule claim checker (``judges.claims`` + ``judges.shape_claims``) agrees with people,
per claim kind, on the hand-labelled captions of real series in ``tests/data/shape_captions.jsonl``; and what
it costs per caption.

Splits: ``dev`` (the rules were written and their tolerances set while reading these), ``holdout`` and
``holdout2`` (labelled and committed before the checker ran on them; the rules were revised after reading
each, so they are held out only in their first-measured tables: docs/results/shape-claims-holdout-first-measured.md).
Definitions: ``captionrl.judges.claim_labels``.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_shape_claims.py            # table per split, misses
    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_shape_claims.py --misses   # also list every disagreement
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import ROOT, Printed, add_record_flag, cpu_line

from captionrl.judges.claim_labels import LABEL_KINDS, load_labelled, score, table
from captionrl.judges.claims import check, extract_rules


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT / "tests" / "data" / "shape_captions.jsonl"))
    ap.add_argument("--misses", action="store_true", help="list every disagreement with the labels")
    add_record_flag(ap)
    args = ap.parse_args()
    say = Printed(__file__)
    say(cpu_line())
    records = load_labelled(args.data)
    names = list(dict.fromkeys(r.get("split", "dev") for r in records))
    splits = {**{n: [r for r in records if r.get("split", "dev") == n] for n in names}, "all": records}
    for name, recs in splits.items():
        if not recs:
            continue
        say(f"\n{name}: {len(recs)} captions of {len({r['source'] for r in recs})} windows")
        scores = score(recs)
        say(table(scores))
        if args.misses:
            for k in LABEL_KINDS:
                for m in scores[k].misses:
                    say(f"  {k}: {m}")
    # cost: extraction (uncached: every caption is new to the cache once) and checking
    from captionrl.judges import claims as claims_module

    claims_module._extract_rules.cache_clear()
    caps = [r["caption"] for r in records]
    t0 = time.process_time()  # CPU time: the machine is shared, wall time would measure the neighbours
    found = [extract_rules(c) for c in caps]
    t_extract = (time.process_time() - t0) / len(caps)
    t0 = time.process_time()
    for rec, cl in zip(records, found, strict=True):
        v = np.asarray(rec["series"], dtype=float)
        for c in cl:
            check(c, v)
    t_check = (time.process_time() - t0) / len(caps)
    say(f"\nCPU time per caption ({len(caps)} captions, 16-64 values, first time each): extract "
        f"{1e3 * t_extract:.2f} ms, check {1e3 * t_check:.2f} ms")
    say.record(args)


if __name__ == "__main__":
    main()
