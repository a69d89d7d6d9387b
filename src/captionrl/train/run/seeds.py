"""Several seeds of one run, and their spread: a claim of learning is a mean with an interval, not one run.

``captionrl train lineup --config X seeds=0,1,2`` trains the config once per seed (``train.out_dir/seed-N``;
each seed folder resumes on its own, and a seed whose ``result.json`` exists is not rerun), then writes
``seeds.json``, ``seeds.md`` and ``seeds.png`` in ``train.out_dir``:

- per seed, the final checks of the trained model, the model its RL started from (the warm start, where
  the run has one) and the initial model (``eval/final_checks.json``);
- over seeds, each check's mean with a 95% Student-t interval, per model and for the paired differences
  (trained minus its RL start point, then trained minus initial, seed by seed);
- the reward's first and last logged value per seed, and each seed's reward curve in ``seeds.png``.

The initial model differs between seeds only through its sampled held-out windows and distractors (greedy
captions), so its rows show how much of the spread is the data's.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from captionrl.errors import ConfigError
from captionrl.eval.final_checks import WARM_START as WARM  # the warm-started model's row
from captionrl.records import write_json

logger = logging.getLogger(__name__)

CHECKS = ("direction_skill", "direction_right", "direction_stated", "other_facts", "key_facts", "extrema_right", "degenerate", "same_sentence", "red",
          "green", "red_of_checkable", "green_of_checkable", "c2s[claims]", "c2s_eval_mean", "bottleneck_mse",
          "transcription", "ends_with_stop", "clipped_ratio", "length_chars", "c2s[train]")
"""Final-check columns aggregated over seeds (``c2s[train]``, the reward's own verifier, last)."""
LOWER_IS_BETTER = {"red", "red_of_checkable", "bottleneck_mse", "transcription", "clipped_ratio", "degenerate",
                   "same_sentence"}


def parse_seeds(value: Any, field: str = "seeds") -> list[int]:
    """``[0, 1, 2]``, ``"0,1,2"`` or ``3`` (meaning 0, 1, 2) as a list of distinct seeds."""
    if value in (None, "", []):
        return []
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ConfigError(field, value, "a seed count must be >= 1", "use e.g. seeds=3 or seeds=0,1,2")
        return list(range(value))
    items = value.split(",") if isinstance(value, str) else list(value)
    try:
        seeds = [int(str(s).strip()) for s in items if str(s).strip()]
    except ValueError as exc:
        raise ConfigError(field, value, "seeds must be integers", "use e.g. seeds=0,1,2") from exc
    if len(set(seeds)) != len(seeds):
        raise ConfigError(field, value, "a seed is repeated", "list each seed once")
    return seeds


def seed_config(cfg: Any, seed: int) -> Any:
    """``cfg`` for one seed: its seed everywhere, its own folder, no further seeds."""
    out = Path(cfg.train.out_dir) / f"seed-{seed}"
    train = dataclasses.replace(cfg.train, seed=seed, out_dir=str(out))
    return dataclasses.replace(cfg, seed=seed, seeds=[], train=train)


def run_seeds(cfg: Any, run_one: Callable[[Any], Mapping[str, Any]]) -> dict[str, Any]:
    """Run ``run_one(seed_config(cfg, s))`` for every seed not already finished; aggregate and write."""
    base = Path(cfg.train.out_dir)
    base.mkdir(parents=True, exist_ok=True)
    per_seed: list[dict[str, Any]] = []
    for seed in cfg.seeds:
        c = seed_config(cfg, seed)
        done = Path(c.train.out_dir) / "result.json"
        if done.is_file():
            logger.info(f"seed {seed}: finished earlier ({done})")
            result = json.loads(done.read_text())
        else:
            logger.info(f"seed {seed}: training in {c.train.out_dir}")
            result = dict(run_one(c))
        per_seed.append(seed_row(seed, Path(c.train.out_dir), result))
    summary = aggregate(per_seed)
    write_json(base / "seeds.json", summary)
    (base / "seeds.md").write_text(markdown(summary))
    plot_rewards(per_seed, base / "seeds.png")
    return {**summary, "table": str(base / "seeds.md")}


def seed_row(seed: int, out: Path, result: Mapping[str, Any]) -> dict[str, Any]:
    """One seed's final checks per system, its reward ends and its timing."""
    checks_path = out / "eval" / "final_checks.json"
    systems: dict[str, dict[str, Any]] = {}
    verdict = None
    if checks_path.is_file():
        checks = json.loads(checks_path.read_text())
        for row in checks["rows"]:
            systems[str(row["system"])] = {k: row[k] for k in CHECKS if isinstance(row.get(k), (int, float))}
        verdict = checks.get("verdict")
    rewards = _rewards(out / "metrics.jsonl")
    return {"seed": seed, "out_dir": str(out), "systems": systems, "rewards": rewards, "verdict": verdict,
            "reward_first": result.get("reward_first"), "reward_last": result.get("reward_last"),
            "train_seconds": result.get("train_seconds"), "steps": result.get("steps")}


def _rewards(path: Path) -> list[float]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line).get("reward")
        except json.JSONDecodeError:
            continue  # a line cut by an interruption
        if isinstance(r, (int, float)) and r == r:
            out.append(float(r))
    return out


def aggregate(per_seed: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Mean and 95% interval over seeds of every check, per system and for trained minus its RL start point (the
    warm start, where the runs have one) and minus the initial model."""
    from captionrl.eval.stats import mean_interval

    rows = []
    warm = any(WARM in s["systems"] for s in per_seed)  # a warm-started run: what RL added to the warm start too
    # what RL added (trained minus its start point) first; trained minus the untrained model is a second reference
    pairs = [*([("trained", WARM)] if warm else []), ("trained", "initial")]
    for system in ("trained", *([WARM] if warm else []), "initial", *(f"{a} - {b}" for a, b in pairs)):
        row: dict[str, Any] = {"system": system}
        for check in CHECKS:
            vals = []
            for s in per_seed:
                sys_rows = s["systems"]
                if " - " in system:
                    first, second = system.split(" - ")
                    a, b = sys_rows.get(first, {}).get(check), sys_rows.get(second, {}).get(check)
                    if a is not None and b is not None:
                        vals.append(a - b)
                elif sys_rows.get(system, {}).get(check) is not None:
                    vals.append(sys_rows[system][check])
            mi = mean_interval(vals)
            if mi is not None:
                row[check] = {"mean": round(mi[0], 4), "lo": round(mi[1], 4), "hi": round(mi[2], 4), "n": len(vals)}
        rows.append(row)
    ends = [(s["reward_first"], s["reward_last"]) for s in per_seed
            if s.get("reward_first") is not None and s.get("reward_last") is not None]
    from captionrl.eval.description import verdicts_over_runs

    verdicts = [s["verdict"] for s in per_seed if s.get("verdict")]
    counts = verdicts_over_runs(verdicts)
    line = (f"verdicts over {len(per_seed)} seed(s): {counts['better']} better, "
            f"{counts['runs'] - counts['better'] - counts['worse']} not better, {counts['worse']} worse "
            f"({counts['degenerated']} degenerated)"
            + ("" if counts["runs"] == len(per_seed) else f"; {len(per_seed) - counts['runs']} without a verdict"))
    return {"protocol": "seeds", "seeds": [s["seed"] for s in per_seed], "rows": rows, "per_seed": list(per_seed),
            "reward_first_last": ends, "columns": list(CHECKS), "verdicts": counts, "verdicts_line": line}


def markdown(summary: Mapping[str, Any]) -> str:
    """The over-seeds table (mean [95% interval]) and each seed's own numbers below it."""
    cols = [c for c in summary["columns"] if any(c in r for r in summary["rows"])]
    lines = [f"Seeds: {', '.join(map(str, summary['seeds']))} (mean [95% t-interval over seeds])", "",
             "| system | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for r in summary["rows"]:
        cells = []
        for c in cols:
            v = r.get(c)
            cells.append("" if v is None else f"{v['mean']:.3f} [{v['lo']:.3f}, {v['hi']:.3f}]")
        lines.append(f"| {r['system']} | " + " | ".join(cells) + " |")
    lines += ["", "| seed | system | " + " | ".join(cols) + " | reward first -> last |",
              "|---|---|" + "---|" * len(cols) + "---|"]
    for s in summary["per_seed"]:
        for name, vals in s["systems"].items():
            cells = ["" if vals.get(c) is None else f"{vals[c]:.3f}" for c in cols]
            ends = ""
            if name == "trained" and s.get("reward_first") is not None:
                ends = f"{s['reward_first']:.3f} -> {s['reward_last']:.3f}"
            lines.append(f"| {s['seed']} | {name} | " + " | ".join(cells) + f" | {ends} |")
    lines += ["", summary.get("verdicts_line", "")]
    for s in summary["per_seed"]:
        if s.get("verdict"):
            lines.append(f"- seed {s['seed']}: {s['verdict']['line']}")
    lines += ["", "Lower is better for " + ", ".join(sorted(LOWER_IS_BETTER)) + "; c2s[train] is the verifier "
              "that produced the reward (no evidence of quality); red/green and c2s[claims] use the claim checker "
              "the reward's factuality term also uses; bottleneck_mse (caption-only reconstruction) shares nothing "
              "with the reward."]
    return "\n".join(lines) + "\n"


def plot_rewards(per_seed: Sequence[Mapping[str, Any]], path: Path) -> Path | None:
    """Every seed's logged reward per step, one line each."""
    if not any(s["rewards"] for s in per_seed):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for s in per_seed:
        if s["rewards"]:
            ax.plot(range(1, len(s["rewards"]) + 1), s["rewards"], label=f"seed {s['seed']}", alpha=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title("LineupRL reward per seed")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
