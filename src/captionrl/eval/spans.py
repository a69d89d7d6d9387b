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

import html
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from captionrl.config import help_field
from captionrl.errors import ConfigError, DataError
from captionrl.eval.common import backend_from_spec, check_spec, split_spec
from captionrl.eval.result import EvalResult, result_text, write_result
from captionrl.judges.claims import COLOURS, Claim, audit, check, extract_llm, extract_rules
from captionrl.records import RecordWriter, check_caption, read_jsonl

PROTOCOL = "spans"
__all__ = ["COLOURS", "Claim", "audit", "check", "extract_llm", "extract_rules"]
HTML_COLOURS = {"green": "#b7e4b0", "blue": "#b3d4f5", "red": "#f5b3b3", "gray": "#e4e4e4"}


@dataclass
class SpansEvalConfig:
    """Settings of ``captionrl eval spans`` (saved into summary.json)."""

    captions: list[str] = help_field([], "JSONL {id, series, caption} per captioner ([NAME=]FILE); empty: a demo on the embedded corpus")
    out: str = help_field("runs/eval-spans", "output folder (rerun with the same folder to resume)")
    extractor: str = help_field("rules", "claim extractor: rules (regular expressions) or llm (schema-checked JSON from backend)")
    backend: str = help_field("hf:embedded", "LLM backend spec for extractor llm (hf:embedded, openai:URL#MODEL, ...)")
    tolerance: float = help_field(0.35, "green/red threshold in series standard deviations")
    index_base: int = help_field(0, "whether captions count steps from 0 or 1")
    retries: int = help_field(2, "LLM extractor retries on invalid JSON")
    quiet: bool = help_field(False, "no progress bars")

    def __post_init__(self) -> None:
        if self.extractor not in ("rules", "llm"):
            raise ConfigError("extractor", self.extractor, "unknown extractor", "use 'rules' or 'llm'")
        if self.index_base not in (0, 1):
            raise ConfigError("index_base", self.index_base, "must be 0 or 1", "use 0 (first step is 0) or 1")
        if self.extractor == "llm":
            check_spec("backend", self.backend)


CONFIG = SpansEvalConfig


def load_items(specs: Sequence[str]) -> tuple[dict[str, dict[str, str]], dict[str, np.ndarray]]:
    systems: dict[str, dict[str, str]] = {}
    series: dict[str, np.ndarray] = {}
    for spec in specs:
        name, path = split_spec(spec)
        p = Path(path)
        if not p.exists():
            raise DataError("--captions", spec, "file not found", "give JSONL files of {id, series, caption}")
        caps = {}
        for n, rec in enumerate(read_jsonl(p, unique_key="id"), 1):
            if "id" not in rec or "caption" not in rec or "series" not in rec:
                raise DataError(f"{p.name}:{n}", sorted(rec), "needs 'id', 'series' and a string 'caption'",
                                'write {"id": "x", "series": [1, 2, 3], "caption": "..."}')
            check_caption(rec["caption"], f"{p.name}:{n}.caption")
            arr = np.asarray(rec["series"], dtype=float)
            if arr.ndim != 1 or arr.size < 2 or not np.isfinite(arr).all():
                raise DataError(f"{p.name}:{n}.series", rec["series"], "must be >= 2 finite numbers", "clean it")
            if str(rec["id"]) in caps:
                raise DataError(f"{p.name}:{n}.id", str(rec["id"]), "repeats an earlier line's id (which caption counts?)",
                                "give every item one caption per file")
            old = series.setdefault(str(rec["id"]), arr)
            if old.shape != arr.shape or not np.allclose(old, arr):
                raise DataError(f"{p.name}:{n}.series", rec["id"], "differs from the same id in another captions file",
                                "pass files captioning the same items (same id -> same series)")
            caps[str(rec["id"])] = rec["caption"]
        if not caps:
            raise DataError("--captions", str(p), "is empty (no caption lines)", "give a JSONL file of {id, series, caption} lines")
        systems[name] = caps
    return systems, series


def demo_items(n_items: int = 12, seed: int = 0) -> tuple[dict[str, dict[str, str]], dict[str, np.ndarray]]:
    """Embedded windows captioned by the describer, and the describer's caption of another window."""
    from captionrl.domains.describe import describer_demo

    chosen, caps, other = describer_demo(n_items, seed)
    return {"describer": caps, "other window": other}, {w.id: np.asarray(w.values) for w in chosen}


def run(cfg: SpansEvalConfig, *, inputs: tuple[Mapping[str, Mapping[str, str]], Mapping[str, np.ndarray]] | None = None,
        backend: Any = None) -> EvalResult:
    """Audit every (system, item) not yet in ``out/records.jsonl``; write table, summary and spans.html.

    ``inputs`` (systems, series) and ``backend`` (the llm extractor's) replace the configured ones.
    """
    from tqdm.auto import tqdm

    systems, series = inputs if inputs is not None else (load_items(cfg.captions) if cfg.captions else demo_items())
    extractor, tolerance, index_base, retries = cfg.extractor, cfg.tolerance, cfg.index_base, cfg.retries
    if extractor == "llm" and backend is None:
        backend = backend_from_spec(cfg.backend)
    out = Path(cfg.out)
    tag = f"{extractor}:{getattr(backend, 'name', '') if extractor == 'llm' else 'v1'}|tol={tolerance}|base={index_base}"
    with RecordWriter(out / "records.jsonl") as w:
        todo = [(s, i) for s, caps in systems.items() for i in caps if not w.has(f"{s}|{i}|{tag}")]
        bar = tqdm(total=len(todo), desc="spans", disable=cfg.quiet)
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
    better: dict[str, str | None] = dict.fromkeys(columns)
    better.update(green="higher", red="lower", green_chars="higher", red_chars="lower", n_unscored="lower")
    result = EvalResult(PROTOCOL, rows, columns, better=better,
                        config={**asdict(cfg), "backend_name": getattr(backend, "name", None)},
                        records=str(out / "records.jsonl"),
                        notes=[f"mean share of claims (and of characters) per colour; tolerance {tolerance} sigma; "
                               "spans.html shows every caption coloured"])
    write_result(result, out)
    (out / "spans.html").write_text(render_html(records))
    return result


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


def run_command(cfg: SpansEvalConfig) -> int:
    print(result_text(run(cfg), cfg.out))
    return 0
