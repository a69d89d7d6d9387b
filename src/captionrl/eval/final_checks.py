"""End-of-run checks a trained captioner was not trained on (issue 11: a run must not grade itself).

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
- optionally the **caption-only bottleneck** (``eval.bottleneck``: reconstruction MSE of a predictor that
  reads only the caption), against the empty-caption and shuffled-caption controls.

``run_final_checks`` writes ``final_checks.md`` and ``final_checks.json`` and returns the summary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from captionrl.errors import DataError
from captionrl.judges.claims import COLOURS, audit, extract_rules
from captionrl.judges.transcription import TranscriptionConfig, transcription
from captionrl.records import write_json

TRAIN_VERIFIER = "train-verifier"


def _ends_with_stop(caption: str) -> bool:
    return caption.rstrip().endswith((".", "!", "?"))


def caption_checks(captions: Mapping[str, str], series: Mapping[str, Any], *,
                   guard: TranscriptionConfig | None = None, tolerance: float = 0.35,
                   clipped: Mapping[str, bool] | None = None) -> dict[str, Any]:
    """Span audit, transcription and form of one system's captions (keys: item ids present in ``series``)."""
    guard = guard or TranscriptionConfig()
    ids = [i for i in captions if i in series]
    shares = {k: [] for k in COLOURS}
    red_checkable, green_checkable, trans, copied, runs = [], [], [], [], []
    for i in ids:
        cap, v = captions[i], np.asarray(series[i], dtype=float)
        a = audit(cap, v, extract_rules(cap), tolerance)
        for k in COLOURS:
            shares[k].append(a["share"][k])
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

    row: dict[str, Any] = {
        "n": len(ids),
        "green": mean(shares["green"]), "red": mean(shares["red"]),
        "blue": mean(shares["blue"]), "gray": mean(shares["gray"]),
        "red_of_checkable": mean(red_checkable), "green_of_checkable": mean(green_checkable),
        "transcription": mean(trans), "copied_values": mean(copied), "run_frac": mean(runs),
        "ends_with_stop": mean([float(_ends_with_stop(captions[i])) for i in ids]),
        "clipped_ratio": mean([float(bool(clipped.get(i))) for i in ids]) if clipped is not None else None,
        "length_chars": mean([float(len(captions[i])) for i in ids]),
    }
    return row


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
                     seeds: Sequence[int] = (0, 1, 2), test_fraction: float = 0.3) -> dict[str, float | None]:
    """Caption-only reconstruction MSE per system (and the empty / shuffled controls); lower is better."""
    from captionrl.eval import bottleneck as bn

    cfg = bn.BottleneckConfig(tasks=["reconstruct"], seeds=list(seeds), head="ridge", test_fraction=test_fraction,
                              shuffle_from=next(iter(systems)), out=str(out_dir), quiet=True)
    ids = sorted(set.intersection(*(set(c) for c in systems.values())) & set(series))
    items = bn._assign_splits([bn.Item(i, "all", np.asarray(series[i], dtype=float), None, "") for i in ids], cfg)
    study = bn.Study(items, {name: {i: caps[i] for i in ids} for name, caps in systems.items()}, source="final-checks")
    summary = bn.run(cfg, study=study)
    out: dict[str, float | None] = {}
    for row in summary.rows:
        vals = [v for k, v in row.items() if k.startswith("reconstruct:") and isinstance(v, (int, float))]
        out[str(row.get("system"))] = round(float(vals[0]), 4) if vals else None
    return out


def run_final_checks(systems: Mapping[str, Mapping[str, str]], series: Mapping[str, Any], out_dir: str | Path, *,
                     identification: Mapping[str, Any] | None = None, guard: TranscriptionConfig | None = None,
                     tolerance: float = 0.35, clipped: Mapping[str, Mapping[str, bool]] | None = None,
                     bottleneck: bool = False, bottleneck_seeds: Sequence[int] = (0, 1, 2)) -> dict[str, Any]:
    """Every check above for every system; writes ``final_checks.{md,json}`` under ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ident = identification_columns(identification)
    rows = []
    for name, caps in systems.items():
        row = {"system": name, **caption_checks(caps, series, guard=guard, tolerance=tolerance,
                                                 clipped=(clipped or {}).get(name))}
        row.update(ident.get(name, {}))
        rows.append(row)
    notes = []
    if bottleneck:
        try:
            mse = bottleneck_check(systems, series, out / "bottleneck", bottleneck_seeds)
        except DataError as exc:  # too few items for the predictor: said in the table, the other checks stay
            mse = {}
            notes.append(f"bottleneck skipped: {exc}")
        for row in rows:
            row["bottleneck_mse"] = mse.get(row["system"])
        for control in ("naive", "empty caption", "shuffled caption"):
            if control in mse:
                rows.append({"system": control, "bottleneck_mse": mse[control]})
    if not any(k.endswith("_eval_mean") and v is not None for r in rows for k, v in r.items()):
        notes.append("no evaluation verifier other than the training verifier is configured (eval.verifiers): "
                     "c2s[train] is what the policy was trained on and is no evidence of quality")
    summary = {"protocol": "final-checks", "rows": rows, "columns": _columns(rows), "notes": notes,
               "config": {"tolerance": tolerance, "bottleneck": bottleneck,
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
    cols = [c for c in summary["columns"] if c not in ("blue", "gray")]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in summary["rows"]:
        lines.append("| " + " | ".join(_cell(r.get(c)) for c in cols) + " |")
    lines += ["", "green/red: share of claims the series supports/contradicts (span audit, rules, 0.35 sigma); "
              "transcription: share of the series' values copied; clipped_ratio: captions cut by the token budget; "
              "c2s[train]: identification under the verifier that produced the reward (not in c2s_eval_mean); "
              "bottleneck_mse: caption-only reconstruction MSE (lower is better)."]
    lines += [f"Note: {n}" for n in summary.get("notes", [])]
    return "\n".join(lines) + "\n"


def _cell(v: Any) -> str:
    if v is None:
        return ""
    return f"{v:.3f}" if isinstance(v, float) else str(v)
