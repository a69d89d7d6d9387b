"""``captionrl caption``: caption series with a captioner backend (or the deterministic describer).

Writes ``{id, series, caption, next?, domain}`` JSONL, the input of every LineupRL evaluation; resumable
(items already captioned in the output file are skipped).
"""

from __future__ import annotations

import argparse

from captionrl.backends import Backend, make_backend, parse_backend_spec
from captionrl.domains.captioning import DESCRIBER, caption_series


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--corpus", default="embedded", help="'embedded' or a corpus file/folder (see captionrl.domains.corpora)")
    p.add_argument("--captioner", default="hf:embedded", help="backend spec (hf:embedded, openai:URL#MODEL, ...) or 'describer'")
    p.add_argument("--length", type=int, default=24, help="window length")
    p.add_argument("--split", default="test", help="which time-ordered split to caption: train, val or test")
    p.add_argument("--max-items", type=int, default=32, help="caption at most this many windows (seeded sample)")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="output JSONL file")


def main(args: argparse.Namespace) -> int:
    from captionrl.domains.datasets import eval_windows

    items = eval_windows(args.corpus, args.length, args.split, args.max_items, args.seed)
    captioner: Backend | str = DESCRIBER if args.captioner == DESCRIBER else make_backend(parse_backend_spec(args.captioner))
    caps = caption_series(items, captioner, args.out, max_new_tokens=args.max_new_tokens,
                          temperature=args.temperature, seed=args.seed)
    print(f"{len(caps)} captions in {args.out}")
    return 0
