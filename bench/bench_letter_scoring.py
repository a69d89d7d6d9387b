"""Letter scoring (one forward pass, the option letters' probabilities) against generate-and-parse,
on the same identification questions, side by side (target: letter scoring >= 5x the questions/s).

Both paths use the same in-process embedded model and batch size; generate-and-parse is what a backend
without probabilities falls back to: greedy generation, then parsing the letter. For a fair baseline it
generates the fewest new tokens that let every reply of a probe batch name a letter (SmolLM2 answers
"The description describes the series A, ...", so the letter is its 6th token; ``parse_choice`` plus
"series/description/option X" phrasing), found before timing; ``--max_new_tokens`` fixes it instead.
Prints questions/s of each, the ratio, and how often the two pick the same letter.

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_letter_scoring.py --items 1 --g 8 --k 4 --length 16
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import Printed, add_record_flag, cpu_line, groups, letter_questions

from captionrl.backends.base import ChatRequest, option_letters, parse_choice
from captionrl.backends.hf import HFBackend


def parse_letter(text: str, letters: list[str]) -> str | None:
    """``parse_choice``, or the letter in "the series B" / "description C" / "option D" phrasing."""
    got = parse_choice(text, letters)
    if got is None:
        m = re.search(r"\b(?:series|description|option|letter)\s+\(?([A-Z])\b", text)
        got = m.group(1) if m and m.group(1) in letters else None
    return got


def fewest_tokens_that_parse(backend: HFBackend, prompts: list, letters: list[str], cap: int = 16) -> int:
    """Greedy replies of ``prompts`` with ``cap`` new tokens; the fewest tokens after which all parse."""
    tok = backend.tokenizer
    need = 1
    for g in backend.generate([ChatRequest(p, max_new_tokens=cap) for p in prompts]):
        ids = tok(g.text or "", add_special_tokens=False)["input_ids"]
        n = next((j for j in range(1, len(ids) + 1) if parse_letter(tok.decode(ids[:j]), letters)), None)
        if n is None:
            return cap  # some reply names no letter within the cap: generate the cap
        need = max(need, n)
    return need


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=1)
    ap.add_argument("--g", type=int, default=8, help="captions per item (the paper samples 8)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--length", type=int, default=16)
    ap.add_argument("--max_new_tokens", type=int, default=0,
                    help="generate-and-parse reply length (0: the fewest tokens that parse on a probe batch)")
    ap.add_argument("--dtype", default="auto")
    add_record_flag(ap)
    args = ap.parse_args()
    say = Printed(__file__)

    captions, candidates = groups(args.items, args.g, args.k, args.length)
    prompts = letter_questions(captions, candidates, args.k)
    letters = option_letters(args.k)
    backend = HFBackend("embedded", dtype=args.dtype, batch_size=8)
    backend._ensure_loaded()
    say(cpu_line())
    say(f"torch threads {os.environ.get('OMP_NUM_THREADS', '(default)')}, dtype {backend.dtype_chosen} "
        f"({backend.dtype_reason})")
    say(f"{len(prompts)} questions ({args.items} items x G={args.g} x K={args.k} rotations), series length {args.length}")
    backend.choose(prompts[:2], letters)  # warm-up both paths (the probe below warms generation)
    max_new = args.max_new_tokens or fewest_tokens_that_parse(backend, prompts[: backend.batch_size], letters)
    say(f"generate-and-parse: greedy, max_new_tokens {max_new}"
        f"{' (the fewest that parse on a probe batch)' if not args.max_new_tokens else ''}, batch {backend.batch_size}")

    t0 = time.perf_counter()
    scored = backend.choose(prompts, letters)
    t_letter = time.perf_counter() - t0
    plain = HFBackend.from_model(backend.model, backend._processor, share_prefix=False, batch_size=backend.batch_size)
    t0 = time.perf_counter()
    unshared = plain.choose(prompts, letters)
    t_plain = time.perf_counter() - t0
    diff = max(abs(a.probs[o] - b.probs[o]) for a, b in zip(scored, unshared, strict=True) for o in letters)
    t0 = time.perf_counter()
    gens = backend.generate([ChatRequest(p, max_new_tokens=max_new) for p in prompts])
    t_gen = time.perf_counter() - t0

    parsed = [parse_letter(g.text or "", letters) for g in gens]
    same = sum(p is not None and p == s.choice for p, s in zip(parsed, scored, strict=True))
    n = len(prompts)
    say(f"{'path':<22} {'seconds':>8} {'questions/s':>12}")
    say(f"{'letter scoring':<22} {t_letter:>8.2f} {n / t_letter:>12.2f}")
    say(f"{'letter, no sharing':<22} {t_plain:>8.2f} {n / t_plain:>12.2f}")
    say(f"{'generate-and-parse':<22} {t_gen:>8.2f} {n / t_gen:>12.2f}")
    say(f"ratio letter/generate: {t_gen / t_letter:.1f}x (target >= 5x); prefix sharing alone: "
        f"{t_plain / t_letter:.1f}x; max |probability difference| shared vs plain: {diff:.1e}")
    say(f"generate-and-parse: {sum(p is None for p in parsed)}/{n} replies without a letter; "
        f"same letter as scoring on {same}/{n}")
    say.record(args)


if __name__ == "__main__":
    main()
