"""Pairwise win rate (MoCo Rubric §A.1.4, B.1): every caption pair judged in both orders.

Input: one JSONL file per captioning system, lines ``{id, caption, reference?, image?, benchmark?}``;
the system is named after the file (or ``NAME=PATH``). Items are matched by ``id`` across systems. With
``baseline`` every system is compared with the baseline (the paper's protocol); without it, every pair
of systems is compared. Each pair of captions is judged twice, once in each order, and each order is one
comparison: win rate = (wins + ties/2) / valid comparisons, per benchmark and averaged over benchmarks;
the CapArena-style score is wins - losses. Invalid replies (backend errors, refusals, unparseable text)
are excluded and counted. Outputs: ``records.jsonl`` (one line per ordered comparison, resumable),
``table.md`` and ``summary.json``.
"""

from __future__ import annotations

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
from captionrl.eval.common import (
    JudgedCaptionsConfig,
    Systems,
    backend_from_spec,
    caption_length,
    item_field,
    shared_ids,
    systems_for,
)
from captionrl.eval.result import EvalResult, result_text, write_result
from captionrl.records import RecordWriter

PROTOCOL = "pairwise"
DEFAULT_BENCHMARK = "all"
# ---------------------------------------------------------------------- the protocol
@dataclass
class PairwiseEvalConfig(JudgedCaptionsConfig):
    """The pairwise protocol's settings (saved into summary.json)."""

    out: str = help_field("runs/eval-pairwise", "output folder (rerun with the same folder to resume)")
    baseline: str | None = help_field(None, "compare every system with this one (the paper's protocol); default: every pair")
    mode: str = help_field("choose", "choose (letter probabilities, C = tie) or generate (reply parsed for A/B/Tie)")
    min_mass: float = help_field(0.0, "choose: replies with less probability than this on A/B/C are invalid")
    limit: int | None = help_field(None, "judge at most this many items per pair of systems")
    batch: int = help_field(16, "comparisons per judge call")


CONFIG = PairwiseEvalConfig


def system_pairs(names: Sequence[str], baseline: str | None) -> list[tuple[str, str]]:
    if baseline is None:
        return list(itertools.combinations(names, 2))
    if baseline not in names:
        raise ConfigError("baseline", baseline, "is not one of the systems", f"use one of {list(names)}")
    return [(n, baseline) for n in names if n != baseline]


def run(cfg: PairwiseEvalConfig, *, judge: Any = None, systems: Systems | None = None) -> EvalResult:
    """Judge every pair in both orders, write records/table/summary; ``judge``/``systems`` replace the
    configured ones (tests inject in-process judges)."""
    from captionrl.judges.pairwise import PairwiseConfig, PairwiseJudge, Verdict

    systems = systems if systems is not None else systems_for(cfg.captions, cfg.demo_items, cfg.seed)
    names = list(systems)
    if len(names) < 2:
        raise ConfigError("captions", names, "needs at least two systems", "pass two or more caption files")
    if judge is None:
        judge = PairwiseJudge(backend_from_spec(cfg.judge),
                              PairwiseConfig(mode=cfg.mode, evidence=cfg.evidence, min_mass=cfg.min_mass))
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
                                        f"add a '{ev_field}' field to the caption files (or change evidence=)")
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
    better: dict[str, str | None] = {c: "higher" for c in columns if c.startswith("win_rate")}
    better.update(caparena="higher", wins=None, losses=None, ties=None, invalid="lower", mean_words=None)
    result = EvalResult(PROTOCOL, rows, columns, better=better, config=asdict(cfg), records=str(out / "records.jsonl"),
                        notes=notes, extra={"judge": getattr(judge.backend, "name", "?"), **stats})
    return write_result(result, out)


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
    columns = ["win_rate", *per_bench, "caparena", "wins", "losses", "ties", "invalid", "mean_words"]
    return rows, columns, {"attempted": len(records), "excluded": excluded, "benchmarks": benchmarks}


# ---------------------------------------------------------------------- CLI
def run_command(cfg: PairwiseEvalConfig) -> int:
    result = run(cfg)
    print(result_text(result, cfg.out))
    print(f"{result.extra['excluded']} invalid comparisons excluded")
    return 0
