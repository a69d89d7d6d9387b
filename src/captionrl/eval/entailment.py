"""``captionrl eval entail``: the fraction of reference captions each captioner's captions entail.

Input: one JSONL file per captioner, lines ``{id, caption, references?}`` (system named after the file
stem or ``NAME=PATH``), and optionally ``--references FILE`` with lines ``{id, references: [...]}`` for
files that carry no references. Items are matched by id; only ids every system captioned are scored.
The judge is ``captionrl.judges.entail.EntailmentJudge`` (an LLM through any backend, or a local NLI
model). ``--demo`` builds a self-check from the embedded corpus: the references are the sentences of the
describer's caption, and the two systems are the describer itself (should entail nearly all) and the
describer's caption of *another* window (should entail few); a judge that cannot separate them cannot
be trusted on real captioners. Outputs in ``--out``: ``records.jsonl`` (one line per system and item,
resumable), ``table.md``, ``summary.json``.
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from captionrl.errors import ConfigError, DataError
from captionrl.judges.entail import EntailmentJudge, references_of
from captionrl.records import RecordWriter, read_jsonl, write_json

PROTOCOL = "entailment"
Systems = dict[str, dict[str, str]]


def load_inputs(specs: Sequence[str], references: str | None) -> tuple[Systems, dict[str, list[str]]]:
    """Caption files (and an optional references file) -> (system -> id -> caption, id -> references)."""
    systems: Systems = {}
    refs: dict[str, list[str]] = {}
    if references:
        rp = Path(references)
        if not rp.exists():
            raise DataError("--references", references, "file not found", "give a JSONL file of {id, references}")
        for n, rec in enumerate(read_jsonl(rp, unique_key="id"), 1):
            if "id" not in rec or "references" not in rec:
                raise DataError(f"{rp.name}:{n}", sorted(rec), "needs 'id' and 'references'",
                                'write {"id": "x", "references": ["..."]}')
            refs[str(rec["id"])] = references_of(rec["references"], f"{rp.name}:{n}.references")
    for spec in specs:
        name, _, path = spec.partition("=") if "=" in spec else (Path(spec).stem, "", spec)
        p = Path(path)
        if not p.exists():
            raise DataError("--captions", spec, "file not found", "give JSONL files of {id, caption, references?}")
        if name in systems:
            raise ConfigError("--captions", spec, f"system name {name!r} repeats", "use NAME=PATH to name files")
        caps: dict[str, str] = {}
        for n, rec in enumerate(read_jsonl(p, unique_key="id"), 1):
            if "id" not in rec or not isinstance(rec.get("caption"), str):
                raise DataError(f"{p.name}:{n}", sorted(rec), "needs 'id' and a string 'caption'",
                                'write {"id": "x", "caption": "...", "references": ["..."]}')
            caps[str(rec["id"])] = rec["caption"]
            if rec.get("references") is not None:
                refs.setdefault(str(rec["id"]), references_of(rec["references"], f"{p.name}:{n}.references"))
        systems[name] = caps
    return systems, refs


def demo_inputs(n_items: int = 12, seed: int = 0) -> tuple[Systems, dict[str, list[str]]]:
    """Self-check systems from the embedded corpus (see module doc); the other-window pairing is seeded."""
    from captionrl.domains.describe import describer_demo

    _windows, caps, other = describer_demo(n_items, seed)
    refs = {i: [s for s in re.split(r"(?<=\.)\s+", c) if s] for i, c in caps.items()}
    return {"describer": caps, "other window": other}, refs


def run(systems: Systems, refs: Mapping[str, Sequence[str]], judge: EntailmentJudge, out: str | Path,
        progress: bool = True, batch: int = 8, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Judge every (system, item) not yet in ``out/records.jsonl``; write table and summary."""
    from tqdm.auto import tqdm

    out = Path(out)
    ids = sorted(set.intersection(*(set(c) for c in systems.values())) & set(refs))
    if not ids:
        raise DataError("items", sorted(systems), "no item has a caption from every system and references",
                        "give references for the captioned ids (in the caption files or --references)")
    t0 = time.perf_counter()
    with RecordWriter(out / "records.jsonl") as w:
        todo = [(s, i) for s in systems for i in ids if not w.has(f"{s}|{i}|{judge.name}")]
        bar = tqdm(total=len(systems) * len(ids), initial=len(systems) * len(ids) - len(todo), desc="entail",
                   disable=not progress)
        for start in range(0, len(todo), batch):
            chunk = todo[start : start + batch]
            caps = [systems[s][i] for s, i in chunk]
            for (s, i), j in zip(chunk, judge.judge(caps, {"references": [list(refs[i]) for _, i in chunk]}),
                                 strict=True):
                w.write({"key": f"{s}|{i}|{judge.name}", "system": s, "id": i, "judge": judge.name,
                         "caption": systems[s][i], "references": list(refs[i]), **j.to_record()})
            bar.update(len(chunk))
        bar.close()
        records = [r for r in w.records() if r.get("judge") == judge.name]
    rows = []
    for s in systems:
        mine = [r for r in records if r["system"] == s and r["id"] in set(ids)]
        scored = [r for r in mine if r["score"] is not None]
        rows.append({
            "system": s,
            "entailment": float(np.mean([r["hard"] for r in scored])) if scored else None,
            "entailment_soft": float(np.mean([r["soft"] for r in scored])) if scored else None,
            "length_chars": float(np.mean([len(systems[s][i]) for i in ids])),
            "n_scored": len(scored), "n_unscored": len(mine) - len(scored),
        })
    columns = ["entailment", "entailment_soft", "length_chars", "n_scored", "n_unscored"]
    summary = {"protocol": PROTOCOL, "rows": rows, "columns": columns,
               "better": {"entailment": "higher", "entailment_soft": "higher"},
               "config": {"judge": judge.name, "method": judge.method, "threshold": judge.threshold,
                          **dict(config or {})},
               "meta": {"n_items": len(ids), "wall_s": round(time.perf_counter() - t0, 1)}}
    write_json(out / "summary.json", summary)
    (out / "table.md").write_text(render_table(summary))
    return summary


def render_table(summary: Mapping[str, Any]) -> str:
    cols = summary["columns"]
    lines = [f"Entailment: share of reference captions entailed ({summary['config']['judge']}).", "",
             "| Captioner | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for r in summary["rows"]:
        cells = ["" if r.get(c) is None else f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols]
        lines.append(f"| {r['system']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--captions", nargs="+", default=[], metavar="[NAME=]FILE",
                   help="JSONL {id, caption, references?} per captioner")
    p.add_argument("--references", default=None, help="JSONL {id, references: [...]} (if caption files lack them)")
    p.add_argument("--demo", action="store_true", help="self-check on the embedded corpus (no files needed)")
    p.add_argument("--out", required=True, help="output folder (rerun to resume)")
    p.add_argument("--backend", default="hf:embedded",
                   help="judge LLM: hf:embedded, hf:PATH, openai:URL#MODEL, vllm:MODEL (+ ,key=value)")
    p.add_argument("--method", default="yesno", choices=("yesno", "letters", "nli"))
    p.add_argument("--nli", default=None, help="local NLI sequence-classification folder (with --method nli)")
    p.add_argument("--threshold", type=float, default=0.5, help="P(entails) above which a reference counts")
    p.add_argument("--soft", action="store_true", help="score = mean P(entails) instead of the share")
    p.add_argument("--quiet", action="store_true")


def main(args: argparse.Namespace) -> int:
    if args.demo:
        systems, refs = demo_inputs()
    elif args.captions:
        systems, refs = load_inputs(args.captions, args.references)
    else:
        raise ConfigError("--captions", None, "no captions given", "pass --captions FILE... or --demo")
    backend = None
    if args.method != "nli":
        from captionrl.backends import make_backend, parse_backend_spec

        backend = make_backend(parse_backend_spec(args.backend))
    judge = EntailmentJudge(backend, method=args.method, nli_model=args.nli, threshold=args.threshold,
                            soft=args.soft)
    summary = run(systems, refs, judge, args.out, progress=not args.quiet,
                  config={"backend": args.backend if backend else None, "demo": bool(args.demo)})
    print(render_table(summary))
    return 0
