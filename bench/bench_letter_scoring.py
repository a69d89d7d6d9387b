"""Letter scoring (one forward pass, the option letters' probabilities) against generate-and-parse,
on the same identification questions, side by side (target: letter scoring >= 5x the questions/s).

Both paths use the same in-process embedded model and batch size; generate-and-parse is what a backend
without probabilities falls back to (``choice_max_tokens`` = 8 new tokens, then ``parse_choice``).
Prints questions/s of each, the ratio, and how often the two pick the same letter.

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_letter_scoring.py --items 1 --g 8 --k 4 --length 16
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import cpu_line, groups, letter_questions

from captionrl.backends.base import ChatRequest, option_letters, parse_choice
from captionrl.backends.hf import HFBackend


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=1)
    ap.add_argument("--g", type=int, default=8, help="captions per item (the paper samples 8)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--length", type=int, default=16)
    ap.add_argument("--max_new_tokens", type=int, default=8, help="generate-and-parse reply length")
    ap.add_argument("--dtype", default="auto")
    args = ap.parse_args()

    captions, candidates = groups(args.items, args.g, args.k, args.length)
    prompts = letter_questions(captions, candidates, args.k)
    letters = option_letters(args.k)
    backend = HFBackend("embedded", dtype=args.dtype, batch_size=8)
    backend._ensure_loaded()
    print(cpu_line())
    print(f"torch threads {os.environ.get('OMP_NUM_THREADS', '(default)')}, dtype {backend.dtype_chosen} "
          f"({backend.dtype_reason})")
    print(f"{len(prompts)} questions ({args.items} items x G={args.g} x K={args.k} rotations), series length {args.length}")
    backend.choose(prompts[:2], letters)  # warm-up both paths
    backend.generate([ChatRequest(p, max_new_tokens=2) for p in prompts[:2]])

    t0 = time.perf_counter()
    scored = backend.choose(prompts, letters)
    t_letter = time.perf_counter() - t0
    t0 = time.perf_counter()
    gens = backend.generate([ChatRequest(p, max_new_tokens=args.max_new_tokens) for p in prompts])
    t_gen = time.perf_counter() - t0

    parsed = [parse_choice(g.text or "", letters) for g in gens]
    same = sum(p is not None and p == s.choice for p, s in zip(parsed, scored, strict=True))
    n = len(prompts)
    print(f"{'path':<22} {'seconds':>8} {'questions/s':>12}")
    print(f"{'letter scoring':<22} {t_letter:>8.2f} {n / t_letter:>12.2f}")
    print(f"{'generate-and-parse':<22} {t_gen:>8.2f} {n / t_gen:>12.2f}")
    print(f"ratio letter/generate: {t_gen / t_letter:.1f}x (target >= 5x)")
    print(f"generate-and-parse: {sum(p is None for p in parsed)}/{n} replies without a letter; "
          f"same letter as scoring on {same}/{n}")


if __name__ == "__main__":
    main()
