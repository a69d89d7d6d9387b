"""Recheck finished LineupRL runs with today's description checks: their held-out captions (``eval/records.jsonl``)
are read again by ``eval.description`` against their windows, and the verdict is recomputed.

Why: the checks improve (a claim phrasing read, a way of guessing priced) while the runs they judge took
minutes to hours; a run's own ``final_checks.json`` keeps the verdict of its day. This prints, per run, the
verdict then and now, and the trained-minus-initial means of the direction and key-fact checks, as a
Markdown table, with a last row of their mean and 95% t-interval over the runs; a warm-started run adds
trained minus its warm start (``WARM_COLUMNS``: what RL added). The embedded corpus and the run's own window
length are used; ``red`` and
``bottleneck_mse`` are the run's own, since they do not change with the description checks; the instruction
and the claim tolerance are those its final checks used).

    .venv/bin/python scripts/recheck_verdicts.py runs/seeds/seed-0 runs/seeds/seed-1 ... > rechecked.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import yaml

COLUMNS = ("direction_right", "direction_skill", "key_facts", "other_facts", "same_sentence")
WARM_COLUMNS = ("direction_right", "direction_skill", "key_facts")


def recheck(run: Path) -> dict:
    """The run's verdict then and now, and the trained-minus-initial means of ``COLUMNS``."""
    from captionrl.domains.datasets import split_windows
    from captionrl.eval.description import description_checks, verdict

    config = yaml.safe_load((run / "config.yaml").read_text())
    data = config["data"]
    if data.get("corpus") != "embedded" or data.get("prepared"):
        raise SystemExit(f"{run}: data.corpus={data.get('corpus')!r}, data.prepared={data.get('prepared')!r}: "
                         "this script rebuilds the embedded corpus's windows only")
    windows = {w.id: np.asarray(w.values, dtype=float)
               for w in split_windows("embedded", int(data["window"]), stride=data.get("stride"))["test"]}
    records = [json.loads(line) for line in (run / "eval" / "records.jsonl").read_text().splitlines() if line]
    final = json.loads((run / "eval" / "final_checks.json").read_text())
    settings = final.get("config", {})  # the run's own instruction and claim tolerance, as its final checks used
    systems = {}
    present = {r["system"] for r in records}
    for system in ("trained", "initial", "warm start"):
        if system == "warm start" and system not in present:
            continue
        captions = {r["item_id"]: r["caption"] for r in records if r["system"] == system and not r.get("control")}
        unknown = [i for i in captions if i not in windows]
        if unknown:
            raise SystemExit(f"{run}: held-out items {unknown[:3]} are not windows of the embedded corpus")
        checks = description_checks(captions, {i: windows[i] for i in captions},
                                    instruction=settings.get("instruction"), tolerance=settings.get("tolerance", 0.35))
        for kept in ("red", "bottleneck_mse"):
            if kept in final["per_item"].get(system, {}):
                checks[kept] = final["per_item"][system][kept]
        systems[system] = checks
    now = verdict(systems["trained"], systems["initial"])
    def mean(system: str, check: str) -> float:
        return float(np.mean(list(systems[system][check].values())))

    diffs = {c: mean("trained", c) - mean("initial", c) for c in COLUMNS}
    if "warm start" in systems:
        diffs.update({f"{c} vs warm start": mean("trained", c) - mean("warm start", c) for c in WARM_COLUMNS})
    return {"run": str(run), "then": final["verdict"]["outcome"], "now": now.outcome, "line": now.line(), **diffs}


def interval(values: list[float]) -> str:
    """``mean [lo, hi]``: the 95% t-interval over runs (``eval.stats.mean_interval``)."""
    from captionrl.eval.stats import mean_interval

    m = mean_interval(values)
    return "" if m is None else f"{m[0]:+.3f} [{m[1]:+.3f}, {m[2]:+.3f}]"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run folders (train.out_dir of each seed)")
    args = ap.parse_args(argv)
    rows = [recheck(run) for run in args.runs]
    columns = list(COLUMNS) + [f"{c} vs warm start" for c in WARM_COLUMNS if all(f"{c} vs warm start" in r for r in rows)]
    print("| run | verdict then | verdict now | " + " | ".join(
        c.replace(" vs warm start", " (trained - warm start)") if "warm" in c else f"{c} (trained - initial)"
        for c in columns) + " |")
    print("|---|---|---|" + "---|" * len(columns))
    for r in rows:
        print(f"| {r['run']} | {r['then']} | {r['now']} | " + " | ".join(f"{r[c]:+.3f}" for c in columns) + " |")
    better = sum(r["now"] == "better" for r in rows)
    print(f"| mean [95% interval] over {len(rows)} runs | | {better} better | "
          + " | ".join(interval([r[c] for r in rows]) for c in columns) + " |")
    print()
    for r in rows:
        print(f"- {r['run']}: {r['line']}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    main()
