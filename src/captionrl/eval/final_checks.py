"""End-of-run checks a trained captioner was not trained on (a run must not grade itself).

For each system (the trained captioner, the initial one, ...) on the held-out items:

- **span audit** (``judges.claims``, rules, 0.35 sigma): share of claims the series supports (green) and
  contradicts (red), over all claims and over checkable ones;
- **transcription** (``judges.transcription``, the guard's own rule): share of the series' values copied,
  mean copied values per caption, share of captions with a run of consecutive values;
- **form**: share of captions ending with a full stop, clipped ratio (the generation hit its token budget),
  mean length;
- **identification** under every configured verifier, with the training verifier in its own column
  (``c2s[train]``) and never in the mean (``c2s_eval_mean``): a verifier that produced the reward cannot
  grade the captions it shaped;
- **description** (``eval.description``): whether each caption states the direction and whether it is right,
  the extrema it names with their position, its number of distinct correct key facts, the share of
  degenerate captions (under 5 words, no words, the instruction echoed) and of one template sentence;
- optionally the **caption-only bottleneck** (``eval.bottleneck``: reconstruction MSE of a predictor that
  reads only the caption, cross-fitted so that every window is scored), against the empty-caption and
  shuffled-caption controls, with the paired difference between the first two systems.

Every share and accuracy carries a 95% interval over the held-out windows (``*_ci``). The first system is
compared item by item with its references (by default the second system; a warm-started run names the model
its RL started from first and the initial model second), and the summary ends with a one-line **verdict**
against the first reference: better, not better or worse, naming the checks that decided it
(``eval.description.verdict``); the verdicts against the other references follow as reference lines.

``run_final_checks`` writes ``final_checks.md`` and ``final_checks.json`` and returns the summary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from captionrl.errors import DataError
from captionrl.eval.description import EVAL_IDENTIFICATION
from captionrl.eval.stats import mean_interval
from captionrl.judges.claims import COLOURS, audit, extract_rules
from captionrl.judges.transcription import TranscriptionConfig, transcription
from captionrl.records import write_json

TRAIN_VERIFIER = "train-verifier"

WARM_START = "warm start"
"""The final checks' row of the warm-started model: the model a warm-started run's RL started from."""

REFERENCE_NAMES = {WARM_START: "RL's start point (the warm start)", "initial": "the initial model"}


def verdict_references(systems: Sequence[str]) -> dict[str, str]:
    """The trained captioner's references in the final checks, the deciding one first: the model its RL
    started from (the warm start, where the run has one; else the initial model), then the initial model as
    a second reference, so a warm start's gain is never credited to RL."""
    return {name: REFERENCE_NAMES[name] for name in (WARM_START, "initial") if name in systems}


def _ends_with_stop(caption: str) -> bool:
    return caption.rstrip().endswith((".", "!", "?"))


def caption_checks(captions: Mapping[str, str], series: Mapping[str, Any], *,
                   guard: TranscriptionConfig | None = None, tolerance: float = 0.35,
                   clipped: Mapping[str, bool] | None = None,
                   red_items: dict[str, float] | None = None) -> dict[str, Any]:
    """Span audit, transcription and form of one system's captions (keys: item ids present in ``series``);
    ``red_items``, when given, receives each item's red share (the verdict compares them item by item)."""
    guard = guard or TranscriptionConfig()
    ids = [i for i in captions if i in series]
    shares = {k: [] for k in COLOURS}
    red_checkable, green_checkable, trans, copied, runs = [], [], [], [], []
    for i in ids:
        cap, v = captions[i], np.asarray(series[i], dtype=float)
        a = audit(cap, v, extract_rules(cap), tolerance)
        for k in COLOURS:
            shares[k].append(a["share"][k])
        if red_items is not None:
            red_items[i] = a["share"]["red"]
        cols = [c["colour"] for c in a["claims"]]
        checkable = sum(c != "gray" for c in cols)
        if checkable:
            red_checkable.append(cols.count("red") / checkable)
            green_checkable.append(cols.count("green") / checkable)
        t = transcription(cap, v, guard)
        trans.append(t.share)
        copied.append(t.copied)
        runs.append(float(t.has_run))

    def mean(xs: Sequence[float]) -> float | None:
        return round(float(np.mean(xs)), 4) if len(xs) else None

    def interval(xs: Sequence[float]) -> list[float] | None:
        mi = mean_interval(xs)
        return None if mi is None else [round(mi[1], 4), round(mi[2], 4)]

    row: dict[str, Any] = {
        "n": len(ids),
        "green": mean(shares["green"]), "red": mean(shares["red"]),
        "blue": mean(shares["blue"]), "gray": mean(shares["gray"]),
        "red_of_checkable": mean(red_checkable), "green_of_checkable": mean(green_checkable),
        "transcription": mean(trans), "copied_values": mean(copied), "run_frac": mean(runs),
        "ends_with_stop": mean([float(_ends_with_stop(captions[i])) for i in ids]),
        "clipped_ratio": mean([float(bool(clipped.get(i))) for i in ids]) if clipped is not None else None,
        "length_chars": mean([float(len(captions[i])) for i in ids]),
        # 95% intervals over the held-out windows (a mean without one is an anecdote)
        "green_ci": interval(shares["green"]), "red_ci": interval(shares["red"]),
        "red_of_checkable_ci": interval(red_checkable), "green_of_checkable_ci": interval(green_checkable),
    }
    return row


def identification_items(records: Sequence[Mapping[str, Any]], train_verifier: str = TRAIN_VERIFIER,
                         direction: str = "c2s") -> dict[str, dict[str, float]]:
    """system -> item id -> mean soft identification over the evaluation verifiers, from identification records
    (``eval/records.jsonl``): controls, the training verifier and unscored judgments are left out, so a window a
    verifier failed on is averaged over the verifiers that scored it, and dropped when none did."""
    scores: dict[str, dict[str, list[float]]] = {}
    for rec in records:
        if (rec.get("control") or rec.get("direction") != direction or rec.get("verifier") in (None, train_verifier)
                or not isinstance(rec.get("soft"), (int, float)) or "system" not in rec or "item_id" not in rec):
            continue
        scores.setdefault(str(rec["system"]), {}).setdefault(str(rec["item_id"]), []).append(float(rec["soft"]))
    return {name: {i: float(np.mean(v)) for i, v in items.items()} for name, items in scores.items()}


def identification_columns(summary: Mapping[str, Any] | None, train_verifier: str = TRAIN_VERIFIER,
                           direction: str = "c2s") -> dict[str, dict[str, Any]]:
    """system -> {``c2s[train]``, ``c2s[<eval verifier>]``..., ``c2s_eval_mean``} from an identification
    summary; the training verifier is kept apart and never averaged in (None mean: no evaluation verifier)."""
    out: dict[str, dict[str, Any]] = {}
    if not summary:
        return out
    for row in summary.get("rows", []):
        cols: dict[str, Any] = {}
        evals = []
        for key, value in row.items():
            if key.startswith(f"{direction}[") and key.endswith("]_ci") and isinstance(value, list):
                name = key[len(direction) + 1: -4]
                cols[f"{direction}[train]_ci" if name == train_verifier else key] = value
                continue
            if not key.startswith(f"{direction}[") or not isinstance(value, (int, float)):
                continue
            name = key[len(direction) + 1: -1]
            if name == train_verifier:
                cols[f"{direction}[train]"] = value
            else:
                cols[key] = value
                evals.append(float(value))
        cols[f"{direction}_eval_mean"] = round(float(np.mean(evals)), 4) if evals else None
        out[str(row["system"])] = cols
    return out


def bottleneck_check(systems: Mapping[str, Mapping[str, str]], series: Mapping[str, Any], out_dir: str | Path,
                     folds: int = 5, seed: int = 0) -> dict[str, dict[str, Any]]:
    """Caption-only reconstruction MSE per system and for the empty / shuffled controls (lower is better):
    ``{system: {"mse", "ci", "n", "items"}}``, cross-fitted so that every held-out window is scored
    (``eval.bottleneck.cross_fitted_reconstruction``); per-item errors land in ``out_dir/items.json``."""
    from captionrl.eval import bottleneck as bn
    from captionrl.eval.stats import mean_interval

    first = next(iter(systems))
    ids = sorted(set(series).intersection(*(set(c) for c in systems.values())))
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(ids))
    controls = {"empty caption": dict.fromkeys(ids, ""),
                "shuffled caption": {i: systems[first][ids[j]] for i, j in zip(ids, perm, strict=True)}}
    errors = bn.cross_fitted_reconstruction({**systems, **controls}, series, folds=folds, seed=seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "items.json", {"folds": folds, "seed": seed, "item_mse": errors})
    result: dict[str, dict[str, Any]] = {}
    for name, per_item in errors.items():
        mi = mean_interval(list(per_item.values()))
        if mi is not None:
            result[name] = {"mse": round(mi[0], 4), "ci": [round(mi[1], 4), round(mi[2], 4)], "n": len(per_item),
                            "items": per_item}
    return result


def summarise_item_errors(items: Mapping[str, Mapping[str, float]], keep: set[str]) -> dict[str, dict[str, Any]]:
    """``bottleneck_check``'s summary from per-item errors already computed, over the items in ``keep``."""
    out: dict[str, dict[str, Any]] = {}
    for name, per_item in items.items():
        mine = {i: e for i, e in per_item.items() if i in keep}
        mi = mean_interval(list(mine.values()))
        if mi is not None:
            out[name] = {"mse": round(mi[0], 4), "ci": [round(mi[1], 4), round(mi[2], 4)], "n": len(mine), "items": mine}
    return out


def run_final_checks(systems: Mapping[str, Mapping[str, str]], series: Mapping[str, Any], out_dir: str | Path, *,
                     identification: Mapping[str, Any] | None = None, guard: TranscriptionConfig | None = None,
                     tolerance: float = 0.35, clipped: Mapping[str, Mapping[str, bool]] | None = None,
                     bottleneck: bool = False, bottleneck_folds: int = 5,
                     instruction: str | None = None,
                     references: Mapping[str, str] | None = None,
                     bottleneck_items: Mapping[str, Mapping[str, float]] | None = None,
                     identification_records: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Every check above for every system, and the first system's verdict against each reference; writes
    ``final_checks.{md,json}`` under ``out_dir``. ``instruction``: the captioning instruction (echo check).
    ``references``: system name -> how the verdict line names it, the deciding reference first (default: the
    second system, named "the <name> model"); the bottleneck's paired difference is taken against it too.
    ``bottleneck_items``: system -> item -> reconstruction error already computed (cross-fitted over a larger
    set of windows), read for the items of ``series`` instead of fitting the predictor again.
    ``identification_records``: the held-out identification's records, whose evaluation verifiers' scores per
    window (``identification_items``) join the per-item checks as ``c2s_eval`` and the verdict."""
    from captionrl.eval.description import description_checks, summarise, verdict

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = list(systems)
    refs = dict(references) if references is not None else (
        {names[1]: f"the {names[1]} model"} if len(names) >= 2 else {})
    unknown = [r for r in refs if r not in systems or r == names[0]]
    if unknown:
        raise DataError("references", unknown, f"not among the compared systems {names[1:]}",
                        "name systems given to run_final_checks, other than the first")
    ident = identification_columns(identification)
    identified = identification_items(identification_records or [])
    rows = []
    per_item: dict[str, dict[str, dict[str, float]]] = {}
    for name, caps in systems.items():
        red: dict[str, float] = {}
        row = {"system": name, **caption_checks(caps, series, guard=guard, tolerance=tolerance,
                                                 clipped=(clipped or {}).get(name), red_items=red)}
        described = description_checks(caps, series, instruction=instruction, tolerance=tolerance)
        row.update(summarise(described))
        row.update(ident.get(name, {}))
        per_item[name] = {**described, "red": red}
        mine = {i: v for i, v in identified.get(name, {}).items() if i in caps}
        if mine:
            per_item[name][EVAL_IDENTIFICATION] = mine
            mi = mean_interval(list(mine.values()))
            row[EVAL_IDENTIFICATION] = round(mi[0], 4) if mi else None
            if mi:
                row[EVAL_IDENTIFICATION + "_ci"] = [round(mi[1], 4), round(mi[2], 4)]
        rows.append(row)
    notes = []
    if bottleneck or bottleneck_items:
        try:
            mse = (summarise_item_errors(bottleneck_items, set(series)) if bottleneck_items else
                   bottleneck_check(systems, series, out / "bottleneck", bottleneck_folds))
        except DataError as exc:  # too few items for the predictor: said in the table, the other checks stay
            mse = {}
            notes.append(f"bottleneck skipped: {exc}")
        for row in rows:
            if row["system"] in mse:
                row["bottleneck_mse"] = mse[row["system"]]["mse"]
                row["bottleneck_mse_ci"] = mse[row["system"]]["ci"]
                per_item[row["system"]]["bottleneck_mse"] = dict(mse[row["system"]]["items"])
        first = names[0]
        for ref in refs:  # paired: the same folds, item by item
            if first in mse and ref in mse:
                a, b = mse[first]["items"], mse[ref]["items"]
                diff = mean_interval([a[i] - b[i] for i in a if i in b])
                if diff is not None:
                    rows[0]["bottleneck_vs_" + ref] = round(diff[0], 4)
                    rows[0]["bottleneck_vs_" + ref + "_ci"] = [round(diff[1], 4), round(diff[2], 4)]
        for control in ("empty caption", "shuffled caption"):
            if control in mse:
                rows.append({"system": control, "bottleneck_mse": mse[control]["mse"],
                             "bottleneck_mse_ci": mse[control]["ci"]})
    if not any(k.endswith("_eval_mean") and v is not None for r in rows for k, v in r.items()):
        notes.append("no evaluation verifier other than the training verifier is configured (eval.verifiers): "
                     "c2s[train] is what the policy was trained on and is no evidence of quality")
    judged = []
    for ref, label in refs.items():
        v = verdict(per_item[names[0]], per_item[ref], reference=label).to_json()
        v["systems"] = [names[0], ref]
        judged.append(v)
    summary = {"protocol": "final-checks", "rows": rows, "columns": _columns(rows), "notes": notes,
               "verdict": judged[0] if judged else None, "reference_verdicts": judged[1:], "per_item": per_item,
               "config": {"tolerance": tolerance, "bottleneck": bottleneck, "instruction": instruction,
                          "guard": vars(guard or TranscriptionConfig())}}
    write_json(out / "final_checks.json", summary)
    (out / "final_checks.md").write_text(markdown(summary))
    return summary


def _columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    return cols


def markdown(summary: Mapping[str, Any]) -> str:
    """One row per system; a column with an interval shows ``mean [lo, hi]`` (95%, over held-out windows)."""
    cols = [c for c in summary["columns"] if c not in ("blue", "gray") and not c.endswith("_ci")]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in summary["rows"]:
        cells = []
        for c in cols:
            ci = r.get(f"{c}_ci")
            cells.append(_cell(r.get(c)) + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci and r.get(c) is not None else ""))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "green/red: share of claims the series supports/contradicts (span audit, rules, 0.35 sigma); "
              "transcription: share of the series' values copied; clipped_ratio: captions cut by the token budget; "
              "direction_stated/direction_right: the caption says whether the series rises, falls or stays flat "
              "(a hedge is no statement) / and the series agrees; direction_skill: direction_right less the share of "
              "windows with the stated direction (0 for one direction said of every window); extrema_named/extrema_right: peaks and troughs "
              "named with their position / right; key_facts: distinct correct key facts (other_facts: besides the direction); degenerate: under 5 words, "
              "no words, or the instruction echoed; same_sentence: one sentence for every item, numbers changed; "
              "c2s[train]: identification under the verifier that produced the reward (not in c2s_eval_mean); "
              "bottleneck_mse: caption-only reconstruction MSE, cross-fitted over every window (lower is better); "
              "bottleneck_vs_*: paired difference to the named system (negative: the first system's captions "
              "carry more of the series). [lo, hi]: 95% t-interval over the held-out windows."]
    lines += [f"Note: {n}" for n in summary.get("notes", [])]
    if summary.get("verdict"):
        v = summary["verdict"]
        lines += ["", f"**{v['systems'][0]} vs {v['systems'][1]}**: {v['line']}"]
    for v in summary.get("reference_verdicts", []):
        lines += ["", f"Reference, {v['systems'][0]} vs {v['systems'][1]}: {v['line']}"]
    return "\n".join(lines) + "\n"


def _cell(v: Any) -> str:
    if v is None:
        return ""
    return f"{v:.3f}" if isinstance(v, float) else str(v)


BY_GROUP_COLUMNS = ("n", "direction_right", "direction_skill", "other_facts", "key_facts", "extrema_right", EVAL_IDENTIFICATION,
                    "red", "degenerate", "same_sentence", "bottleneck_mse")
"""The columns of the per-corpus table (each with its interval over that corpus's windows)."""


def run_final_checks_by_group(systems: Mapping[str, Mapping[str, str]], series: Mapping[str, Any],
                              groups: Mapping[str, Sequence[str]], out_dir: str | Path,
                              bottleneck_items: Mapping[str, Mapping[str, float]] | None = None,
                              **kwargs: Any) -> dict[str, Any]:
    """The final checks once per group of items (a corpus or domain): ``out_dir/<group>/final_checks.*`` each,
    and ``out_dir/by_corpus.{md,json}`` with one row per group and system and each group's verdict, so a gain
    on one corpus cannot hide a loss on another. The caption-only reconstruction is not fitted per group (too
    few windows): ``bottleneck_items``, the errors cross-fitted over every window, are averaged per group, so
    a corpus of large values does not decide the comparison on another."""
    out = Path(out_dir)
    table: list[dict[str, Any]] = []
    verdicts: dict[str, Any] = {}
    for group, ids in groups.items():
        keep = set(ids)
        records = [r for r in kwargs.get("identification_records") or [] if r.get("item_id") in keep]
        sub = run_final_checks({name: {i: c for i, c in caps.items() if i in keep} for name, caps in systems.items()},
                               {i: v for i, v in series.items() if i in keep}, out / group,
                               **{**kwargs, "bottleneck": False, "identification": None,
                                  "identification_records": records},
                               bottleneck_items=bottleneck_items)
        for row in sub["rows"]:
            table.append({"corpus": group, "system": row["system"],
                          **{c: row.get(c) for c in BY_GROUP_COLUMNS},
                          **{f"{c}_ci": row.get(f"{c}_ci") for c in BY_GROUP_COLUMNS if row.get(f"{c}_ci")}})
        verdicts[group] = [sub["verdict"], *sub.get("reference_verdicts", [])] if sub.get("verdict") else []
    summary = {"protocol": "final-checks-by-corpus", "rows": table, "verdicts": verdicts,
               "columns": ["corpus", "system", *BY_GROUP_COLUMNS]}
    write_json(out / "by_corpus.json", summary)
    lines = ["| " + " | ".join(summary["columns"]) + " |", "|" + "---|" * len(summary["columns"])]
    for r in table:
        cells = [str(r["corpus"]), str(r["system"])]
        for c in BY_GROUP_COLUMNS:
            ci = r.get(f"{c}_ci")
            cells.append(_cell(r.get(c)) + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci and r.get(c) is not None else ""))
        lines.append("| " + " | ".join(cells) + " |")
    for group, vs in verdicts.items():
        lines += [f"- {group}: " + " / ".join(v["line"] for v in vs)] if vs else []
    (out / "by_corpus.md").write_text("\n".join(lines) + "\n")
    return summary
