"""Pairwise win rate (MoCo Rubric §A.1.4, B.1): every caption pair judged in both orders.

Input: one JSONL file per captioning system, lines ``{id, caption, reference?, image?, benchmark?}``;
the system is named after the file (or ``NAME=PATH``). Items are matched by ``id`` across systems. With
``--baseline`` every system is compared with the baseline (the paper's protocol); without it, every pair
of systems is compared. Each pair of captions is judged twice, once in each order, and each order is one
comparison: win rate = (wins + ties/2) / valid comparisons, per benchmark and averaged over benchmarks;
the CapArena-style score is wins - losses. Invalid replies (backend errors, refusals, unparseable text)
are excluded and counted. Outputs: ``records.jsonl`` (one line per ordered comparison, resumable),
``table.md`` and ``summary.json``.

This module also holds the helpers the other protocols share: caption-file loading, demo systems built
from the offline data, backend options and the report writer.
"""

from __future__ import annotations

import argparse
import itertools
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from captionrl.config import help_field
from captionrl.errors import ConfigError, DataError
from captionrl.records import RecordWriter, read_jsonl, write_json

PROTOCOL = "pairwise"
DEFAULT_BENCHMARK = "all"
Systems = dict[str, dict[str, dict[str, Any]]]
"""system name -> item id -> caption record (``caption`` plus optional reference/image/benchmark)."""


# ---------------------------------------------------------------------- shared helpers
def load_caption_file(path: str | Path) -> dict[str, dict[str, Any]]:
    """Read one system's captions (JSONL ``{id, caption, ...}``), validating every line."""
    p = Path(path)
    if not p.exists():
        raise DataError("captions", str(path), "file not found", "give a JSONL file with {id, caption} lines")
    out: dict[str, dict[str, Any]] = {}
    for n, rec in enumerate(read_jsonl(p, unique_key="id")):
        if "id" not in rec or "caption" not in rec:
            raise DataError(f"{p.name}:line {n + 1}", sorted(rec), "needs 'id' and 'caption' fields",
                            'write lines like {"id": "img1", "caption": "A red circle."}')
        if not isinstance(rec["caption"], str):
            raise DataError(f"{p.name}:{rec['id']}.caption", rec["caption"], "must be a string",
                            "write the caption as text ('' for an empty caption)")
        key = str(rec["id"])
        if key in out:
            raise DataError(f"{p.name}:id", key, "appears twice", "give every item one caption per system")
        out[key] = rec
    if not out:
        raise DataError("captions", str(path), "holds no caption lines", "check the file")
    return out


def load_systems(specs: Sequence[str]) -> Systems:
    """``["sysA.jsonl", "name=sysB.jsonl"]`` -> {name: {id: record}}; names default to file stems."""
    systems: Systems = {}
    for spec in specs:
        name, _, path = spec.rpartition("=") if "=" in spec else ("", "", spec)
        name = name or Path(path).stem
        if name in systems:
            raise ConfigError("captions", spec, f"system name {name!r} is used twice",
                              "name the files differently or write NAME=PATH")
        systems[name] = load_caption_file(path)
    return systems


def caption_length(text: str) -> int:
    """Caption length in words (the unit CapArena reports)."""
    return len(text.split())


def demo_systems(items: Sequence[Mapping[str, Any]]) -> Systems:
    """Systems of known quality built from offline items, for runs without caption files.

    ``reference`` (the item's reference caption), ``other_item`` (the next different reference: fluent
    but wrong), ``generic`` (generic image words) and ``empty``: a working judge must order them
    reference > other_item/generic > empty, which makes the default run a check of the judge itself.
    """
    from captionrl.probes import GENERIC_WORDS, other_text

    systems: Systems = {"reference": {}, "other_item": {}, "generic": {}, "empty": {}}
    refs = [it["reference"] for it in items]
    for i, it in enumerate(items):
        base = {k: it[k] for k in ("id", "reference", "image", "benchmark") if k in it}
        captions = {
            "reference": it["reference"],
            "other_item": other_text(refs, i),
            "generic": GENERIC_WORDS,
            "empty": "",
        }
        for name, cap in captions.items():
            systems[name][str(it["id"])] = {**base, "caption": cap}
    return systems


def shared_ids(systems: Systems, names: Sequence[str]) -> list[str]:
    """Item ids captioned by every one of ``names``, in the first system's order."""
    first = systems[names[0]]
    return [i for i in first if all(i in systems[n] for n in names[1:])]


def item_field(systems: Systems, names: Sequence[str], item_id: str, field: str) -> Any:
    """A per-item field (reference, image, benchmark) from the first system that has it."""
    for n in names:
        v = systems[n].get(item_id, {}).get(field)
        if v not in (None, ""):
            return v
    return None


def add_backend_arguments(p: argparse.ArgumentParser, role: str = "judge") -> None:
    p.add_argument("--backend", nargs="*", default=[], metavar="KEY=VALUE",
                   help=f"{role} backend settings (BackendConfig), e.g. kind=hf model=embedded dtype=bfloat16; "
                        "default: the embedded SmolLM2 in-process")


def backend_from_args(settings: Sequence[str]) -> Any:
    from captionrl.backends import make_backend
    from captionrl.config import apply_overrides

    return make_backend(apply_overrides({}, list(settings)))


def fmt_cell(v: Any) -> str:
    if isinstance(v, float):
        return "-" if math.isnan(v) else f"{v:.3f}"
    return "-" if v is None else str(v)


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_report(
    out: str | Path, protocol: str, rows: list[dict[str, Any]], columns: list[str], config: Any,
    notes: Sequence[str] = (), **extra: Any,
) -> dict[str, Any]:
    """Write ``table.md`` and ``summary.json`` (the shape ``captionrl report`` gathers) and return it."""
    out = Path(out)
    cfg = asdict(config) if hasattr(config, "__dataclass_fields__") else dict(config)
    summary = {"protocol": protocol, "rows": rows, "columns": columns, "config": cfg, "notes": list(notes), **extra}
    out.mkdir(parents=True, exist_ok=True)
    text = f"# {protocol}\n\n" + markdown_table(rows, columns)
    if notes:
        text += "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    (out / "table.md").write_text(text)
    write_json(out / "summary.json", summary)
    return summary


# ---------------------------------------------------------------------- the protocol
@dataclass
class PairwiseEvalConfig:
    """The pairwise protocol's settings (saved into summary.json)."""

    captions: list[str] = help_field([], "caption files, one per system (JSONL {id, caption, reference?, image?, benchmark?}); empty: demo systems on offline data")
    out: str = help_field("runs/eval-pairwise", "output folder (rerun with the same folder to resume)")
    baseline: str | None = help_field(None, "compare every system with this one (the paper's protocol); default: every pair")
    mode: str = help_field("choose", "choose (letter probabilities, C = tie) or generate (reply parsed for A/B/Tie)")
    evidence: str = help_field("reference", "reference (text-only judge reads the reference caption) or image (VLM judge)")
    min_mass: float = help_field(0.0, "choose: replies with less probability than this on A/B/C are invalid")
    limit: int | None = help_field(None, "judge at most this many items per pair of systems")
    demo_items: int = help_field(12, "items of the offline demo data when no caption files are given")
    seed: int = help_field(0, "seed of the demo data selection")
    batch: int = help_field(16, "comparisons per judge call")
    backend: list[str] = help_field([], "judge backend settings KEY=VALUE (default: embedded SmolLM2)")


def system_pairs(names: Sequence[str], baseline: str | None) -> list[tuple[str, str]]:
    if baseline is None:
        return list(itertools.combinations(names, 2))
    if baseline not in names:
        raise ConfigError("baseline", baseline, "is not one of the systems", f"use one of {list(names)}")
    return [(n, baseline) for n in names if n != baseline]


def systems_for(caption_files: Sequence[str], demo_items: int, seed: int) -> Systems:
    """The systems of an image-caption evaluation: the user's caption files, or the offline demo systems."""
    if caption_files:
        return load_systems(caption_files)
    from captionrl.eval.qa import offline_items

    return demo_systems(offline_items(demo_items, seed=seed))


def run(cfg: PairwiseEvalConfig, judge: Any = None, systems: Systems | None = None) -> dict[str, Any]:
    """Judge every pair in both orders, write records/table/summary; returns the summary."""
    from captionrl.judges.pairwise import PairwiseConfig, PairwiseJudge, Verdict

    systems = systems if systems is not None else systems_for(cfg.captions, cfg.demo_items, cfg.seed)
    names = list(systems)
    if len(names) < 2:
        raise ConfigError("captions", names, "needs at least two systems", "pass two or more caption files")
    if judge is None:
        judge = PairwiseJudge(backend_from_args(cfg.backend),
                              PairwiseConfig(mode=cfg.mode, evidence=cfg.evidence, min_mass=cfg.min_mass))  # type: ignore[arg-type]
    ev_field = judge.config.evidence
    out = Path(cfg.out)
    todo: list[dict[str, Any]] = []
    with RecordWriter(out / "records.jsonl") as writer:
        for x, y in system_pairs(names, cfg.baseline):
            ids = shared_ids(systems, [x, y])[: cfg.limit]
            for item_id in ids:
                for order, (a, b) in enumerate(((x, y), (y, x)), start=1):
                    key = f"{x}|{y}|{item_id}|{order}"
                    if writer.has(key):
                        continue
                    ev = item_field(systems, [x, y], item_id, ev_field)
                    if ev is None:
                        raise DataError(f"{x}/{y}:{item_id}.{ev_field}", None, f"no {ev_field} for this item",
                                        f"add a '{ev_field}' field to the caption files (or change --evidence)")
                    todo.append({
                        "key": key, "id": item_id, "pair": [x, y], "order": order, "system_a": a, "system_b": b,
                        "benchmark": item_field(systems, [x, y], item_id, "benchmark") or DEFAULT_BENCHMARK,
                        "caption_a": systems[a][item_id]["caption"], "caption_b": systems[b][item_id]["caption"],
                        "evidence": ev,
                    })
        for start in tqdm(range(0, len(todo), cfg.batch), desc="pairwise", unit="batch", disable=not todo):
            chunk = todo[start : start + cfg.batch]
            verdicts: list[Verdict] = judge.decide([t["caption_a"] for t in chunk], [t["caption_b"] for t in chunk],
                                                   [t["evidence"] for t in chunk])
            for t, v in zip(chunk, verdicts, strict=True):
                winner_system = {"A": t["system_a"], "B": t["system_b"], "tie": "tie"}.get(v.winner or "")
                ev = t.pop("evidence")
                writer.write({**t, "evidence": ev if isinstance(ev, str) else str(ev), "decision": v.winner,
                              "winner": winner_system, "valid": v.valid, "invalid": v.invalid, "probs": v.probs,
                              "mass": v.mass, "raw": v.raw, "method": v.method, **v.extra})
        records = writer.records()
    rows, columns, stats = aggregate(records, systems)
    notes = [f"{stats['excluded']} of {stats['attempted']} comparisons excluded as invalid "
             f"(errors, refusals, unparseable replies); win rate = (wins + ties/2) / valid comparisons, "
             "each pair judged in both orders"]
    return write_report(out, PROTOCOL, rows, columns, cfg, notes=notes, judge=getattr(judge.backend, "name", "?"),
                        **stats)


def aggregate(records: Sequence[Mapping[str, Any]], systems: Systems) -> tuple[list[dict[str, Any]], list[str], dict[str, Any]]:
    """Per-system wins/losses/ties per benchmark -> rows (win rate per benchmark and averaged)."""
    tally: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0, 0, 0]))
    benchmarks: list[str] = []
    excluded = 0
    for r in records:
        bench = r.get("benchmark") or DEFAULT_BENCHMARK
        if bench not in benchmarks:
            benchmarks.append(bench)
        pair = r["pair"]
        if not r.get("valid"):
            excluded += 1
            for s in pair:
                tally[s][bench][3] += 1
            continue
        for s in pair:
            t = tally[s][bench]
            if r["winner"] == "tie":
                t[2] += 1
            elif r["winner"] == s:
                t[0] += 1
            else:
                t[1] += 1
    rows = []
    for s in systems:
        if s not in tally:
            continue
        row: dict[str, Any] = {"system": s}
        rates = []
        wins = losses = ties = invalid = 0
        for b in benchmarks:
            w, lo, ti, inv = tally[s][b]
            valid = w + lo + ti
            rate = (w + 0.5 * ti) / valid if valid else float("nan")
            row[f"win_rate/{b}"] = rate
            if valid:
                rates.append(rate)
            wins, losses, ties, invalid = wins + w, losses + lo, ties + ti, invalid + inv
        row["win_rate"] = sum(rates) / len(rates) if rates else float("nan")
        row.update(caparena=wins - losses, wins=wins, losses=losses, ties=ties, invalid=invalid)
        caps = [rec["caption"] for rec in systems[s].values()]
        row["mean_words"] = sum(caption_length(c) for c in caps) / len(caps)
        rows.append(row)
    rows.sort(key=lambda r: -r["win_rate"] if not math.isnan(r["win_rate"]) else 1.0)
    per_bench = [f"win_rate/{b}" for b in benchmarks] if len(benchmarks) > 1 else []
    columns = ["system", "win_rate", *per_bench, "caparena", "wins", "losses", "ties", "invalid", "mean_words"]
    return rows, columns, {"attempted": len(records), "excluded": excluded, "benchmarks": benchmarks}


# ---------------------------------------------------------------------- CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--captions", nargs="*", default=[], metavar="[NAME=]FILE",
                   help="caption files, one per system; omit for demo systems on offline data")
    p.add_argument("--out", default="runs/eval-pairwise", help="output folder (rerun to resume)")
    p.add_argument("--baseline", default=None, help="compare every system with this one")
    p.add_argument("--mode", default="choose", choices=["choose", "generate"])
    p.add_argument("--evidence", default="reference", choices=["reference", "image"])
    p.add_argument("--min-mass", type=float, default=0.0, help="choose: mass on A/B/C below this = invalid")
    p.add_argument("--limit", type=int, default=None, help="at most this many items per pair of systems")
    p.add_argument("--demo-items", type=int, default=12, help="offline demo items when no captions are given")
    p.add_argument("--seed", type=int, default=0)
    add_backend_arguments(p)


def main(args: argparse.Namespace) -> int:
    cfg = PairwiseEvalConfig(captions=list(args.captions), out=args.out, baseline=args.baseline, mode=args.mode,
                             evidence=args.evidence, min_mass=args.min_mass, limit=args.limit,
                             demo_items=args.demo_items, seed=args.seed, backend=list(args.backend))
    summary = run(cfg)
    print((Path(cfg.out) / "table.md").read_text())
    print(f"records, table.md and summary.json in {cfg.out} ({summary['excluded']} invalid excluded)")
    return 0
