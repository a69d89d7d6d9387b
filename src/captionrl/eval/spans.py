"""Span audit (LineupRL Figure 4): split captions into claims, check each claim against the series by code.

Colours, as in the paper's case study:

- **green**: a magnitude pinned to a time or interval that the series supports: the stated value lies
  within ``tolerance`` (0.35) standard deviations of the series over the interval it points at (a
  single step: that step's value; "from step a to b": the range of values there; an overall statistic
  such as the mean or the maximum: the whole window);
- **blue**: a position or shape with no magnitude that the series does not contradict ("peaks at step
  40", "rises", "has 64 points");
- **red**: a claim the series contradicts (a wrong value, a peak where the series is low, a wrong trend);
- **gray**: content with no checkable claim about the series.

Claims are extracted either by deterministic rules (regular expressions over "X at step N", "starts at",
"from A to B", statistics and trend words; the default, and the only sensible choice for the small
embedded model) or by an LLM through any backend that must return schema-checked JSON (retried, else the
item is unscored). Checking is always code. Steps are 0-based unless ``index_base=1``.
Outputs: ``records.jsonl`` (claims and colours per system and item, resumable), ``table.md`` and
``summary.json`` (per-captioner shares of claims and of characters per colour), ``spans.html``.
"""

from __future__ import annotations

import argparse
import html
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from captionrl.errors import ConfigError, DataError
from captionrl.judges.claims import COLOURS, Claim, audit, check, extract_llm, extract_rules
from captionrl.records import RecordWriter, read_jsonl, write_json

PROTOCOL = "spans"
__all__ = ["COLOURS", "Claim", "audit", "check", "extract_llm", "extract_rules"]
HTML_COLOURS = {"green": "#b7e4b0", "blue": "#b3d4f5", "red": "#f5b3b3", "gray": "#e4e4e4"}


def load_items(specs: Sequence[str]) -> tuple[dict[str, dict[str, str]], dict[str, np.ndarray]]:
    systems: dict[str, dict[str, str]] = {}
    series: dict[str, np.ndarray] = {}
    for spec in specs:
        name, _, path = spec.partition("=") if "=" in spec else (Path(spec).stem, "", spec)
        p = Path(path)
        if not p.exists():
            raise DataError("--captions", spec, "file not found", "give JSONL files of {id, series, caption}")
        caps = {}
        for n, rec in enumerate(read_jsonl(p, unique_key="id"), 1):
            if "id" not in rec or not isinstance(rec.get("caption"), str) or "series" not in rec:
                raise DataError(f"{p.name}:{n}", sorted(rec), "needs 'id', 'series' and a string 'caption'",
                                'write {"id": "x", "series": [1, 2, 3], "caption": "..."}')
            arr = np.asarray(rec["series"], dtype=float)
            if arr.ndim != 1 or arr.size < 2 or not np.isfinite(arr).all():
                raise DataError(f"{p.name}:{n}.series", rec["series"], "must be >= 2 finite numbers", "clean it")
            series.setdefault(str(rec["id"]), arr)
            caps[str(rec["id"])] = rec["caption"]
        systems[name] = caps
    return systems, series


def demo_items(n_items: int = 12, seed: int = 0) -> tuple[dict[str, dict[str, str]], dict[str, np.ndarray]]:
    """Embedded windows captioned by the describer, and the describer's caption of another window."""
    from captionrl.domains.describe import describer_demo

    chosen, caps, other = describer_demo(n_items, seed)
    return {"describer": caps, "other window": other}, {w.id: np.asarray(w.values) for w in chosen}


def run(systems: Mapping[str, Mapping[str, str]], series: Mapping[str, np.ndarray], out: str | Path, *,
        extractor: str = "rules", backend: Any = None, tolerance: float = 0.35, index_base: int = 0,
        retries: int = 2, progress: bool = True) -> dict[str, Any]:
    from tqdm.auto import tqdm

    if extractor not in ("rules", "llm"):
        raise ConfigError("extractor", extractor, "unknown extractor", "use 'rules' or 'llm'")
    if extractor == "llm" and backend is None:
        raise ConfigError("backend", None, "the llm extractor needs a backend", "pass --backend hf:embedded or use rules")
    out = Path(out)
    tag = f"{extractor}:{getattr(backend, 'name', '') if extractor == 'llm' else 'v1'}|tol={tolerance}|base={index_base}"
    with RecordWriter(out / "records.jsonl") as w:
        todo = [(s, i) for s, caps in systems.items() for i in caps if not w.has(f"{s}|{i}|{tag}")]
        bar = tqdm(total=len(todo), desc="spans", disable=not progress)
        for start in range(0, len(todo), 8):
            chunk = todo[start : start + 8]
            caps = [systems[s][i] for s, i in chunk]
            if extractor == "rules":
                got = [(extract_rules(c, index_base), {"attempts": 0}) for c in caps]
            else:
                got = extract_llm(backend, caps, index_base, retries)
            for (s, i), cap, (claims, info) in zip(chunk, caps, got, strict=True):
                rec: dict[str, Any] = {"key": f"{s}|{i}|{tag}", "system": s, "id": i, "tag": tag, "caption": cap,
                                       "extractor": extractor, **{k: v for k, v in info.items() if k != "raw"}}
                if claims is None:
                    rec.update(score=None, error="no valid claims after retries", raw=info.get("raw"))
                else:
                    rec.update(audit(cap, series[i], claims, tolerance))
                    rec["score"] = rec["char_share"]["green"]
                w.write(rec)
            bar.update(len(chunk))
        bar.close()
        records = [r for r in w.records() if r.get("tag") == tag]
    rows = []
    for s in systems:
        mine = [r for r in records if r["system"] == s and r.get("score") is not None]
        row: dict[str, Any] = {"system": s, "n_scored": len(mine),
                               "n_unscored": sum(1 for r in records if r["system"] == s) - len(mine)}
        for k in COLOURS:
            row[k] = float(np.mean([r["share"][k] for r in mine])) if mine else None
            row[f"{k}_chars"] = float(np.mean([r["char_share"][k] for r in mine])) if mine else None
        rows.append(row)
    columns = [*COLOURS, *(f"{k}_chars" for k in COLOURS), "n_scored", "n_unscored"]
    summary = {"protocol": PROTOCOL, "rows": rows, "columns": columns,
               "better": {"green": "higher", "red": "lower", "green_chars": "higher", "red_chars": "lower"},
               "config": {"extractor": extractor, "backend": getattr(backend, "name", None), "tolerance": tolerance,
                          "index_base": index_base, "retries": retries}}
    write_json(out / "summary.json", summary)
    (out / "table.md").write_text(_table(summary))
    (out / "spans.html").write_text(render_html(records))
    return summary


def _table(summary: Mapping[str, Any]) -> str:
    cols = summary["columns"]
    lines = ["Span audit: mean share of claims (and of characters) per colour; tolerance "
             f"{summary['config']['tolerance']} sigma.", "", "| Captioner | " + " | ".join(cols) + " |",
             "|---|" + "---|" * len(cols)]
    for r in summary["rows"]:
        cells = ["" if r[c] is None else f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols]
        lines.append(f"| {r['system']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_caption_html(caption: str, claims: Sequence[Mapping[str, Any]]) -> str:
    """The caption with each claim's characters on its colour (hover shows the reason)."""
    parts, pos = [], 0
    for c in sorted(claims, key=lambda c: c["start"]):
        if c["start"] < pos:
            continue
        parts.append(html.escape(caption[pos : c["start"]]))
        colour = HTML_COLOURS[c["colour"]]
        parts.append(f'<span class="{c["colour"]}" style="background:{colour}" title="{html.escape(c["reason"])}">'
                     f"{html.escape(caption[c['start'] : c['end']])}</span>")
        pos = c["end"]
    parts.append(html.escape(caption[pos:]))
    return "".join(parts)


def render_html(records: Sequence[Mapping[str, Any]]) -> str:
    legend = " ".join(f'<span style="background:{v}">{k}</span>' for k, v in HTML_COLOURS.items())
    body = [f"<html><head><meta charset='utf-8'><title>span audit</title></head><body><h1>Span audit</h1><p>{legend}</p>"]
    for s in dict.fromkeys(r["system"] for r in records):
        body.append(f"<h2>{html.escape(s)}</h2>")
        for r in records:
            if r["system"] != s:
                continue
            text = (render_caption_html(r["caption"], r["claims"]) if r.get("claims") is not None
                    else html.escape(r["caption"]) + " <i>(unscored)</i>")
            body.append(f"<p><b>{html.escape(str(r['id']))}</b>: {text}</p>")
    body.append("</body></html>")
    return "\n".join(body)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--captions", nargs="+", default=[], metavar="[NAME=]FILE",
                   help="JSONL {id, series, caption} per captioner; default: a demo on the embedded corpus")
    p.add_argument("--out", required=True)
    p.add_argument("--extractor", default="rules", choices=("rules", "llm"))
    p.add_argument("--backend", default="hf:embedded", help="LLM for --extractor llm")
    p.add_argument("--tolerance", type=float, default=0.35, help="green/red threshold in series standard deviations")
    p.add_argument("--index-base", type=int, default=0, choices=(0, 1), help="whether captions count steps from 0 or 1")
    p.add_argument("--retries", type=int, default=2, help="LLM extractor retries on invalid JSON")
    p.add_argument("--quiet", action="store_true")


def main(args: argparse.Namespace) -> int:
    systems, series = load_items(args.captions) if args.captions else demo_items()
    backend = None
    if args.extractor == "llm":
        from captionrl.backends import make_backend, parse_backend_spec

        backend = make_backend(parse_backend_spec(args.backend))
    summary = run(systems, series, args.out, extractor=args.extractor, backend=backend, tolerance=args.tolerance,
                  index_base=args.index_base, retries=args.retries, progress=not args.quiet)
    print(_table(summary))
    return 0
