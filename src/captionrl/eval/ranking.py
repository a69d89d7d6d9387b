"""Blind ranking (MoCo Rubric §A.1.5, RubiCap): unnamed captions of one image scored side by side.

For each item the systems' captions are shuffled (seeded by ``(seed, item id)``; the order is recorded)
and shown as "Caption 1..n" to the ranking judge (``captionrl.judges.ranking``). Each caption's total is
(accuracy + completeness + clarity) / 3 - 1.5 · hallucination_penalty; the captions are ranked by total
(rank 1 = best, ties share the average rank). Per system: mean rank, first-place share (a tie for first
splits the share), mean criterion scores. Items whose reply fails validation are excluded and counted.
Outputs: ``records.jsonl`` (one line per item, resumable), ``table.md``, ``summary.json``.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from captionrl.config import help_field
from captionrl.errors import BackendError, ConfigError, DataError
from captionrl.eval.common import (
    JudgedCaptionsConfig,
    Systems,
    backend_from_spec,
    item_field,
    shared_ids,
    systems_for,
)
from captionrl.eval.result import EvalResult, result_text, write_result
from captionrl.judges.ranking import CRITERIA, RankConfig, RankJudge
from captionrl.records import RecordWriter

PROTOCOL = "ranking"


def shuffled_order(names: Sequence[str], seed: int, item_id: str) -> list[str]:
    """The seeded order in which an item's captions are shown (recorded with the item)."""
    order = list(names)
    random.Random(f"{seed}|{item_id}").shuffle(order)
    return order


def ranks_of(totals: Sequence[float]) -> list[float]:
    """Rank 1 = highest total; tied totals share the average of their ranks."""
    out = [0.0] * len(totals)
    for i, t in enumerate(totals):
        higher = sum(1 for u in totals if u > t + 1e-9)
        equal = sum(1 for u in totals if abs(u - t) <= 1e-9)
        out[i] = higher + (equal + 1) / 2
    return out


@dataclass
class RankingEvalConfig(JudgedCaptionsConfig):
    """The blind-ranking protocol's settings (saved into summary.json)."""

    MODES = ("generate", "choose")

    captions: list[str] = help_field([], "caption files, one per system (the paper ranks five); empty: demo systems on offline data")
    out: str = help_field("runs/eval-ranking", "output folder (rerun with the same folder to resume)")
    mode: str = help_field("generate", "generate (validated JSON reply, the paper's) or choose (expected digit per caption and criterion)")
    seed: int = help_field(0, "seed of the caption shuffles (and of the demo data selection)")
    limit: int | None = help_field(None, "rank at most this many items")
    demo_items: int = help_field(8, "offline demo items when no caption files are given")
    batch: int = help_field(4, "items per judge call")


CONFIG = RankingEvalConfig


def run(cfg: RankingEvalConfig, *, judge: RankJudge | None = None, systems: Systems | None = None) -> EvalResult:
    """Rank every item's shuffled captions; ``judge``/``systems`` replace the configured ones."""
    systems = systems if systems is not None else systems_for(cfg.captions, cfg.demo_items, cfg.seed)
    names = list(systems)
    if not 2 <= len(names) <= 10:
        raise ConfigError("captions", names, f"{len(names)} systems; blind ranking needs 2 to 10",
                          "pass five caption files, as in the paper")
    judge = judge or RankJudge(backend_from_spec(cfg.judge), RankConfig(mode=cfg.mode, evidence=cfg.evidence))
    ev_field = judge.cfg.evidence
    ids = shared_ids(systems, names)[: cfg.limit]
    if not ids:
        raise DataError("captions", names, "no item is captioned by every system", "caption the same ids in every file")
    out = Path(cfg.out)
    notes: list[str] = []
    with RecordWriter(out / "records.jsonl") as writer:
        todo = [i for i in ids if not writer.has(i)]
        for start in tqdm(range(0, len(todo), cfg.batch), desc="ranking", unit="batch", disable=not todo):
            chunk = todo[start : start + cfg.batch]
            orders = [shuffled_order(names, cfg.seed, i) for i in chunk]
            shown = [[systems[s][i]["caption"] for s in order] for i, order in zip(chunk, orders, strict=True)]
            evidence = []
            for i in chunk:
                ev = item_field(systems, names, i, ev_field)
                if ev is None:
                    raise DataError(f"{i}.{ev_field}", None, f"no {ev_field} for this item",
                                    f"add a '{ev_field}' field to the caption files (or change evidence=)")
                evidence.append(ev)
            try:
                results = judge.score(shown, evidence)
            except BackendError as exc:  # e.g. digits not single tokens for this backend's choose
                if judge.cfg.mode != "choose":
                    raise
                notes.append(f"choose unavailable ({exc}); fell back to generate")
                judge = RankJudge(judge.backend, RankConfig(mode="generate", evidence=judge.cfg.evidence))
                results = judge.score(shown, evidence)
            for i, order, res in zip(chunk, orders, results, strict=True):
                rec: dict[str, Any] = {"key": i, "id": i, "order": order, "seed": cfg.seed, "method": res.method,
                                       "raw": res.raw, "error": res.error, "valid": res.scores is not None}
                if res.scores is not None:
                    ranks = ranks_of(res.totals)
                    rec["systems"] = {s: {**res.scores[p], "total": res.totals[p], "rank": ranks[p]}
                                      for p, s in enumerate(order)}
                writer.write(rec)
        records = writer.records()
    rows, columns = aggregate(records, names)
    invalid = sum(not r["valid"] for r in records)
    notes.insert(0, f"{invalid} of {len(records)} items excluded (judge reply failed validation); "
                    "total = (accuracy + completeness + clarity)/3 - 1.5 x hallucination_penalty")
    better: dict[str, str | None] = {c: "higher" for c in columns}
    better.update(mean_rank="lower", hallucination_penalty="lower", items=None)
    result = EvalResult(PROTOCOL, rows, columns, better=better, config=asdict(cfg), records=str(out / "records.jsonl"),
                        notes=notes, extra={"attempted": len(records), "excluded": invalid,
                                            "judge": getattr(judge.backend, "name", "?")})
    return write_result(result, out)


def aggregate(records: Sequence[Mapping[str, Any]], names: Sequence[str]) -> tuple[list[dict[str, Any]], list[str]]:
    acc: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    n_valid = 0
    for r in records:
        if not r.get("valid"):
            continue
        n_valid += 1
        per = r["systems"]
        n_first = sum(1 for v in per.values() if v["rank"] == min(x["rank"] for x in per.values()))
        for s, v in per.items():
            for c in (*CRITERIA, "total", "rank"):
                acc[s][c] += v[c]
            if v["rank"] == min(x["rank"] for x in per.values()):
                acc[s]["first"] += 1.0 / n_first
    rows = []
    for s in names:
        if n_valid == 0:
            rows.append({"system": s, "mean_rank": float("nan"), "first_place": float("nan"), "items": 0})
            continue
        a = acc[s]
        rows.append({"system": s, "mean_rank": a["rank"] / n_valid, "first_place": a["first"] / n_valid,
                     **{c: a[c] / n_valid for c in (*CRITERIA, "total")}, "items": n_valid})
    rows.sort(key=lambda r: r["mean_rank"] if r["mean_rank"] == r["mean_rank"] else 99.0)
    columns = ["mean_rank", "first_place", *CRITERIA, "total", "items"]
    return rows, columns


def run_command(cfg: RankingEvalConfig) -> int:
    result = run(cfg)
    print(result_text(result, cfg.out))
    print(f"{result.extra['excluded']} invalid items excluded")
    return 0
