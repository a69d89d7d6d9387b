"""``captionrl eval recheck RUN_DIR...``: finished LineupRL runs judged again by today's final checks.

The final checks improve (a claim phrasing read, a way of guessing priced) while the runs they judge take
minutes to hours; a run's own ``eval/final_checks.json`` keeps the verdict of the code that wrote it. This
command reads each run's held-out captions (``eval/records.jsonl``), rebuilds their series from the run's own
``config.yaml`` (the same corpus, windows, splits and seed: ``domains.lineup_data.build_lineup_data``), and
runs the final checks' span audit and description checks on them (``eval.final_checks.caption_checks``,
``eval.description``) with the settings its final checks used (instruction, claim tolerance, transcription
guard), then the verdict of the trained model against the model its RL started from (the warm start, where the
run has one, else the initial model: ``eval.final_checks.verdict_references``, as the run's own checks decide).
``bottleneck_mse`` is the run's own: it needs predictors fitted again and does not change with the checks.

With ``controls`` (one per run: a run on the same windows that differs in one setting, such as
``reward.lam=0``), the control's trained captions are judged the same way and compared with the run's, paired
per window: what that one setting adds, beyond what the rest of the run (its other reward terms, its steps)
does.

Printed (and, with ``--out``, written as ``recheck.md`` and ``recheck.json``): per run, the verdict then and
now, each with the model it was taken against, and the mean difference of each check from each reference
(trained minus the warm start, then minus the initial model, then minus the control) with its 95% t-interval
over the windows; over the runs, each difference's mean with its 95% t-interval over the runs
(``eval.stats.mean_interval``) and the verdicts counted.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from captionrl.config import help_field
from captionrl.errors import ConfigError, DataError
from captionrl.eval.description import EVAL_IDENTIFICATION
from captionrl.records import read_jsonl, write_json

CHECKS = (("direction_skill", True), ("other_facts", True), ("direction_right", True), ("key_facts", True),
          (EVAL_IDENTIFICATION, True), ("red", False), ("same_sentence", False), ("degenerate", False),
          ("bottleneck_mse", False))
"""The per-item checks whose differences are shown, and whether higher is better."""


@dataclass
class RecheckConfig:
    """Settings of ``captionrl eval recheck``."""

    runs: list[str] = help_field([], "finished LineupRL run folders (train.out_dir of each run or seed)", positional=True)
    controls: list[str] = help_field(
        [], "each run's control, in the runs' order: a finished run on the same held-out windows that differs in one "
        "setting (reward.lam=0 for what the identification reward adds); adds 'trained - control', paired per window")
    out: str | None = help_field(None, "folder for recheck.md and recheck.json (default: print only)")

    def __post_init__(self) -> None:
        if not self.runs:
            raise ConfigError("runs", [], "no run folders given", "write captionrl eval recheck RUN_DIR [RUN_DIR...]")
        if self.controls and len(self.controls) != len(self.runs):
            raise ConfigError("controls", self.controls, f"names {len(self.controls)} control(s) for "
                              f"{len(self.runs)} run(s)", "give one control per run, in the runs' order, "
                              "e.g. controls=[runs/s0-ctl,runs/s1-ctl]")


CONFIG = RecheckConfig


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(str(path), path.name, f"is not valid JSON ({exc})", "rerun that run's evaluation") from None
    if not isinstance(data, dict):
        raise DataError(str(path), type(data).__name__, "is not a JSON object", "rerun that run's evaluation")
    return data


def _run_files(run: Path) -> tuple[Path, Path, Path]:
    """The run's config, caption records and final checks, each checked to exist."""
    if not run.is_dir():
        raise DataError("RUN_DIR", str(run), "is not a folder", "give run folders that 'captionrl train lineup' wrote")
    files = (run / "config.yaml", run / "eval" / "records.jsonl", run / "eval" / "final_checks.json")
    for f in files:
        if not f.is_file():
            raise DataError("RUN_DIR", str(run), f"has no {f.relative_to(run)} (not a finished LineupRL run with "
                            "final checks)", "give run folders of 'captionrl train lineup' with eval.final_checks on, "
                            "after the run ended")
    return files


def held_out_series(config_path: Path) -> dict[str, Any]:
    """item id -> values of every item the run's data holds, rebuilt from its saved config's ``data``,
    ``reward.k`` and ``seed`` (only those sections are read, so later changes elsewhere do not matter)."""
    import yaml

    from captionrl.config import from_dict
    from captionrl.domains.lineup_data import LineupDataConfig, build_lineup_data

    saved = yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}
    if not isinstance(saved, dict) or not isinstance(saved.get("data"), dict):
        raise DataError(str(config_path), "data", "has no data section (not a LineupRL run's config)",
                        "give run folders that 'captionrl train lineup' wrote")
    try:
        data_cfg = from_dict(LineupDataConfig, saved["data"], prefix="data.")
    except ConfigError as exc:
        raise DataError(str(config_path), exc.value, f"cannot be read by this version ({exc.field}: {exc.problem})",
                        "recheck with the version that wrote the run, or edit the setting as the message says") from None
    k = int((saved.get("reward") or {}).get("k", 4))
    data = build_lineup_data(data_cfg, k, int(saved.get("seed", 0)))
    return {item_id: s.values for item_id, s in data.pool.items()}


def saved_captions(records_path: Path) -> dict[str, dict[str, str]]:
    """system -> item id -> caption of the run's held-out evaluation (controls left out), systems in the
    order the run captioned them."""
    systems: dict[str, dict[str, str]] = {}
    for rec in read_jsonl(records_path, appended=True):
        if rec.get("control") or "system" not in rec or "item_id" not in rec or not isinstance(rec.get("caption"), str):
            continue
        systems.setdefault(str(rec["system"]), {})[str(rec["item_id"])] = rec["caption"]
    return systems


def _guard(settings: Mapping[str, Any]) -> Any:
    """The transcription guard the run's final checks used (its saved fields this version still has)."""
    from captionrl.judges.transcription import TranscriptionConfig

    known = {f.name for f in dataclasses.fields(TranscriptionConfig)}
    return TranscriptionConfig(**{k: v for k, v in (settings.get("guard") or {}).items() if k in known})


def _judged(captions: Mapping[str, Mapping[str, str]], series: Mapping[str, Any], final: Mapping[str, Any],
            records_path: Path, names: Sequence[str]) -> dict[str, dict[str, dict[str, float]]]:
    """system -> check -> item id -> value: today's caption checks of each named system's held-out captions,
    with the run's own held-out identification and ``bottleneck_mse`` where it measured them."""
    from captionrl.eval.description import description_checks
    from captionrl.eval.final_checks import caption_checks, identification_items

    settings = final.get("config") or {}
    tolerance = float(settings.get("tolerance", 0.35))
    guard = _guard(settings)
    identification = identification_items(read_jsonl(records_path, appended=True))
    per_item: dict[str, dict[str, dict[str, float]]] = {}
    for name in names:
        red: dict[str, float] = {}
        caption_checks(captions[name], series, guard=guard, tolerance=tolerance, red_items=red)
        checks = description_checks(captions[name], series, instruction=settings.get("instruction"),
                                    tolerance=tolerance)
        kept = (final.get("per_item") or {}).get(name, {}).get("bottleneck_mse")
        identified = {i: v for i, v in identification.get(name, {}).items() if i in captions[name]}
        per_item[name] = {**checks, "red": red, **({"bottleneck_mse": kept} if kept else {}),
                          **({EVAL_IDENTIFICATION: identified} if identified else {})}
    return per_item


def _control(control: Path, run: Path, series: Mapping[str, Any], windows: set[str]) -> dict[str, dict[str, float]]:
    """The control run's trained captions judged as ``recheck`` judges the run's, after checking that it
    captioned exactly the run's held-out ``windows``, with the same values (same data settings and seed)."""
    config_path, records_path, checks_path = _run_files(control)
    captions = saved_captions(records_path)
    if "trained" not in captions:
        raise DataError(str(records_path), sorted(captions), "holds no trained captions",
                        "give as control a finished run whose evaluation captioned its trained model")
    theirs = held_out_series(config_path)
    differ = sorted(windows ^ set(captions["trained"]))
    differ += [i for i in sorted(windows & set(captions["trained"])) if len(series[i]) != len(theirs.get(i, ()))
               or any(a != b for a, b in zip(series[i], theirs[i], strict=True))]
    if differ:
        raise DataError("controls", str(control), f"did not caption the held-out windows of {run} "
                        f"({len(differ)} differ, e.g. {differ[0]})",
                        "pair each run with a control of the same seed and data settings")
    return _judged(captions, theirs, _read_json(checks_path), records_path, ["trained"])["trained"]


def recheck(run: str | Path, control: str | Path | None = None) -> dict[str, Any]:
    """One run's verdict then and now (each with its reference) and the per-item mean differences of ``CHECKS``
    from each reference (the warm start when the run has one, the initial model) and, given one, from the
    control run's trained captions on the same windows."""
    from captionrl.eval.description import compare, verdict
    from captionrl.eval.final_checks import verdict_references

    run = Path(run)
    config_path, records_path, checks_path = _run_files(run)
    final = _read_json(checks_path)
    captions = saved_captions(records_path)
    old = final.get("verdict") or {}
    first = (old.get("systems") or ["trained"])[0]
    names = [first, *(s for s in captions if s != first)]
    if len(names) < 2 or first not in captions:
        raise DataError(str(records_path), sorted(captions), "holds the captions of fewer than two systems",
                        "recheck runs whose evaluation compared the trained model with its initial one "
                        "(eval.compare_initial: true)")
    series = held_out_series(config_path)
    unknown = sorted({i for caps in captions.values() for i in caps} - set(series))
    if unknown:
        raise DataError(str(records_path), unknown[:3], f"{len(unknown)} captioned item(s) are not items of the data "
                        f"that {config_path} describes", "recheck the run with the data it was trained on "
                        "(a corpus or prepared folder moved or changed since)")
    per_item = _judged(captions, series, final, records_path, names)
    refs = verdict_references(names[1:]) or {names[1]: f"the {names[1]} model"}
    ref = next(iter(refs))  # RL's start point where the run has one, as the run's own checks decide
    now = verdict(per_item[first], per_item[ref], reference=refs[ref])
    pairs = [(first, r) for r in refs]
    if control is not None:
        per_item["control"] = _control(Path(control), run, series, set(captions[first]))
        pairs.append((first, "control"))
    diffs, intervals = {}, {}
    for a, b in pairs:
        found = {c: compare(per_item[a][c], per_item[b][c], c, up) for c, up in CHECKS
                 if c in per_item[a] and c in per_item[b]}
        kept = {c: cmp for c, cmp in found.items() if cmp is not None}
        diffs[f"{a} - {b}"] = {c: round(cmp.diff, 4) for c, cmp in kept.items()}
        intervals[f"{a} - {b}"] = {c: [round(cmp.lo, 4), round(cmp.hi, 4)] for c, cmp in kept.items()}
    return {"run": str(run), **({"control": str(control)} if control is not None else {}),
            "systems": names, "then": old.get("outcome"), "now": now.outcome,
            "then_against": (old.get("systems") or [None, "initial"])[1], "now_against": ref,
            "verdict": now.to_json(), "differences": diffs, "intervals": intervals}


def aggregate(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Each difference's mean and 95% t-interval over the runs, and the verdicts counted."""
    from captionrl.eval.description import verdicts_over_runs
    from captionrl.eval.stats import mean_interval

    pairs = [p for p in rows[0]["differences"] if all(p in r["differences"] for r in rows)]
    over: dict[str, dict[str, Any]] = {}
    for pair in pairs:
        over[pair] = {}
        for check, _up in CHECKS:
            mi = mean_interval([r["differences"][pair][check] for r in rows if check in r["differences"][pair]])
            if mi is not None:
                over[pair][check] = {"mean": round(mi[0], 4), "lo": round(mi[1], 4), "hi": round(mi[2], 4)}
    return {"protocol": "recheck", "runs": list(rows), "over_runs": over,
            "verdicts": verdicts_over_runs([r["verdict"] for r in rows]),
            "then_better": sum(r["then"] == "better" for r in rows)}


def markdown(summary: Mapping[str, Any]) -> str:
    """One table per comparison: a row per run (verdict then and now, mean differences), then the mean and
    95% interval over the runs; each run's verdict line below."""
    rows, n = summary["runs"], len(summary["runs"])
    lines: list[str] = []
    for pair, over in summary["over_runs"].items():
        cols = [c for c, _ in CHECKS if c in over]
        lines += [f"{pair} (per run: mean over held-out windows [95% t-interval, paired per window]; last row: "
                  "mean [95% t-interval] over runs)", "",
                  "| run | verdict then (against) | verdict now (against) | " + " | ".join(cols) + " |",
                  "|---|---|---|" + "---|" * len(cols)]
        for r in rows:
            d, ci = r["differences"][pair], r.get("intervals", {}).get(pair, {})
            cells = [(f"{d[c]:+.3f}" + (f" [{ci[c][0]:+.3f}, {ci[c][1]:+.3f}]" if c in ci else "")) if c in d else ""
                     for c in cols]
            lines.append(f"| {r['run']} | {r['then'] or '-'} ({r['then_against']}) | {r['now']} ({r['now_against']}) | "
                         + " | ".join(cells) + " |")
        cells = [f"{over[c]['mean']:+.3f} [{over[c]['lo']:+.3f}, {over[c]['hi']:+.3f}]" for c in cols]
        lines += [f"| over {n} run(s) | {summary['then_better']} better | {summary['verdicts']['better']} better | "
                  + " | ".join(cells) + " |", ""]
    counts = summary["verdicts"]
    lines.append(f"verdicts now over {n} run(s): {counts['better']} better, "
                 f"{counts['runs'] - counts['better'] - counts['worse']} not better, {counts['worse']} worse "
                 f"({counts['degenerated']} degenerated)")
    lines += [f"- {r['run']}: {r['verdict']['line']}" for r in rows]
    return "\n".join(lines) + "\n"


def run(cfg: RecheckConfig) -> dict[str, Any]:
    """Recheck every run, aggregate, and write ``recheck.{md,json}`` under ``cfg.out`` when it is set."""
    controls = cfg.controls or [None] * len(cfg.runs)
    summary = aggregate([recheck(r, c) for r, c in zip(cfg.runs, controls, strict=True)])
    if cfg.out:
        out = Path(cfg.out)
        write_json(out / "recheck.json", summary)
        (out / "recheck.md").write_text(markdown(summary))
    return summary


def run_command(cfg: RecheckConfig) -> int:
    print(markdown(run(cfg)), end="")
    return 0
