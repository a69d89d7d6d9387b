"""``captionrl caption``: caption series with a captioner backend (or the deterministic describer).

Writes ``{id, series, caption, next?, domain}`` JSONL, the input of every LineupRL evaluation; resumable
(items already captioned in the output file are skipped).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from tqdm.auto import tqdm

from captionrl.backends import Backend, ChatRequest, make_backend, parse_backend_spec
from captionrl.domains.captioning import caption_messages
from captionrl.domains.describe import describe_series
from captionrl.records import RecordWriter
from captionrl.types import Series

DESCRIBER = "describer"


def caption_series(
    items: Sequence[Series],
    captioner: Backend | str,
    out_path: str | Path,
    *,
    precision: int = 2,
    max_new_tokens: int = 96,
    temperature: float = 0.0,
    seed: int = 0,
    batch: int = 8,
) -> dict[str, str]:
    """Caption ``items`` (resumable JSONL at ``out_path``); ``captioner="describer"`` needs no model."""
    from captionrl.domains.timeseries import render_numbers

    writer = RecordWriter(out_path, key_field="id")
    todo = [it for it in items if not writer.has(it.id)]
    with tqdm(total=len(items), initial=len(items) - len(todo), desc="caption", unit="item") as bar:
        for start in range(0, len(todo), batch):
            chunk = todo[start : start + batch]
            if captioner == DESCRIBER:
                texts: list[str | None] = [describe_series(it, precision) for it in chunk]
                errors: list[str | None] = [None] * len(chunk)
            else:
                assert not isinstance(captioner, str)
                reqs = [
                    ChatRequest(caption_messages(render_numbers(it, precision)[0], len(it)), max_new_tokens=max_new_tokens,
                                temperature=temperature, seed=seed)
                    for it in chunk
                ]
                gens = captioner.generate(reqs)
                texts, errors = [g.text for g in gens], [g.error for g in gens]
            for it, text, err in zip(chunk, texts, errors, strict=True):
                if text is None:  # a failed request is retried on the next run, not stored as empty
                    tqdm.write(f"caption failed for {it.id}: {err}")
                    continue
                rec = {"id": it.id, "series": it.values.tolist(), "caption": text.strip(), "domain": it.domain}
                if "next" in it.meta:
                    rec["next"] = it.meta["next"]
                writer.write(rec)
            bar.update(len(chunk))
    writer.close()
    return {r["id"]: r["caption"] for r in writer.records()}


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
