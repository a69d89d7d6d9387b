"""Schema-constrained vs unconstrained generation of a MoCo rubric on the embedded model, side by side.

The same Generator prompt (``judges.roles.generator_messages`` with the image's text rendering) is
answered by the in-process embedded SmolLM2 twice per round, once decoding under the rubric JSON schema
(``backends.structured``: an xgrammar mask per step) and once free, greedy, same token budget. Prints, per
path, the tokens written, seconds, ms per token and the time a 512-token rubric takes at that rate, and
for the constrained path the time spent inside the mask (fill + apply) and the one-off grammar compile,
so the constraint's share of a step can be read off (target: it must not dominate).

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_constrained.py            # short: 1 round, 512 tokens
    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_constrained.py --rounds 3 --max_items 12
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import Printed, add_record_flag, cpu_line

from captionrl.backends import structured as S
from captionrl.backends.base import ChatRequest
from captionrl.backends.hf import HFBackend
from captionrl.judges.online_rubric import parse_generator_reply
from captionrl.judges.roles import generator_messages, rubric_schema, structured

REFERENCES = ["Two red circles and a blue square on a white background; the square is left of the circles.",
              "A white image with a small blue square at the left and two red circles at the right."]
CANDIDATES = ["Two red circles and a square.", "A blue square next to circles on white.",
              "Three red circles.", "A picture with shapes."]


class MaskTimer:
    """Adds up the seconds spent inside the schema processor's ``__call__`` (the constraint's own cost)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self._orig = S.SchemaLogitsProcessor.__call__

    def __enter__(self) -> MaskTimer:
        timer, orig = self, self._orig

        def timed(proc, input_ids, scores):
            t0 = time.perf_counter()
            try:
                return orig(proc, input_ids, scores)
            finally:
                timer.seconds += time.perf_counter() - t0
                timer.calls += 1

        S.SchemaLogitsProcessor.__call__ = timed  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        S.SchemaLogitsProcessor.__call__ = self._orig  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--rounds", type=int, default=1, help="constrained/free pairs (alternating, so load drifts hit both)")
    ap.add_argument("--max_new_tokens", type=int, default=512)
    ap.add_argument("--max_items", type=int, default=12, help="rubric_schema(3, max_items): the paper preset's 12")
    add_record_flag(ap)
    args = ap.parse_args()
    say = Printed(__file__)
    say(cpu_line())

    backend = HFBackend(args.model, dtype="float32", batch_size=1)
    backend._ensure_loaded()
    msgs = generator_messages(REFERENCES, CANDIDATES, image_text=REFERENCES[0])
    schema = rubric_schema(3, args.max_items)
    t0 = time.perf_counter()
    S.grammar_cache(backend.tokenizer, S.model_vocab_size(backend.model)).grammar(schema)
    compile_s = time.perf_counter() - t0
    tok = backend.tokenizer
    rows: dict[str, list[tuple[int, float, str, bool]]] = {"constrained": [], "free": []}
    mask_s = 0.0
    for _ in range(args.rounds):
        for path in ("constrained", "free"):
            extra = structured(schema) if path == "constrained" else {}
            req = ChatRequest(msgs, max_new_tokens=args.max_new_tokens, temperature=0.0, **extra)
            with MaskTimer() as timer:
                t1 = time.perf_counter()
                g = backend.generate([req])[0]
                dt = time.perf_counter() - t1
            mask_s += timer.seconds
            try:
                parse_generator_reply(g.text, 3, args.max_items)
                ok, why = True, ""
            except ValueError as exc:  # what the recipe's parser says of this reply
                ok, why = False, str(exc)[:160]
            rows[path].append((len(tok(g.text or "", add_special_tokens=False)["input_ids"]), dt, g.finish_reason or "?", ok))
            if why:
                say(f"{path}: not a usable rubric: {why}")
    say(f"model {backend.name} (float32, batch 1), rubric schema 3..{args.max_items} items, budget "
        f"{args.max_new_tokens} tokens, {args.rounds} round(s); grammar compile {compile_s:.3f} s (once per schema)")
    say(f"{'path':<12} {'tokens':>7} {'seconds':>8} {'ms/token':>9} {'512-token rubric s':>19} {'parses':>7}  finish")
    rate = {}
    for path, rs in rows.items():
        n = sum(r[0] for r in rs)
        s = sum(r[1] for r in rs)
        rate[path] = s / max(1, n)
        say(f"{path:<12} {n:>7} {s:>8.2f} {1000 * rate[path]:>9.1f} {512 * rate[path]:>19.1f} "
            f"{sum(r[3] for r in rs):>3}/{len(rs):<3}  {','.join(r[2] for r in rs)}")
    c_tokens = sum(r[0] for r in rows["constrained"])
    c_s = sum(r[1] for r in rows["constrained"])
    say(f"constrained/free time per token: {rate['constrained'] / rate['free']:.2f}x; time inside the mask: "
        f"{mask_s:.2f} s = {100 * mask_s / max(c_s, 1e-9):.1f}% of constrained generation "
        f"({1000 * mask_s / max(1, c_tokens):.2f} ms/token)")
    say.record(args)


if __name__ == "__main__":
    main()
