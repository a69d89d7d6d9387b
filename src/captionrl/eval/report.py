"""``captionrl report RUN_DIR... --out DIR``: gather any protocols' results into the paper's tables.

Every evaluation protocol writes ``summary.json`` from one ``captionrl.eval.result.EvalResult``
(``{"protocol", "rows": [{"system", metric: value, ...}], "columns", "better", "labels", "config", ...}``);
this module reads it back with ``EvalResult.from_summary`` and needs nothing else, so a new protocol shows
up in reports without code here. What it uses:

- ``better``: ``{column: "lower" | "higher" | null}`` (null and ``labels``: never marked; a column it does
  not name: MSE/loss/error/Rel. columns are lower-is-better, counts ``n_*`` and lengths unmarked, the rest
  higher-is-better);
- ``rows[i]["per_seed"][column]``: per-seed values; then every non-baseline row not significantly worse
  than the best (paired t-test, p >= 0.05) is marked too, as the paper's bold;
- ``rows[i]["std"][column]``: printed as ``mean ± std``; ``rows[i]["baseline"]``: never marked.

Runs of the same protocol are merged into one table (a system name that repeats gets its run's folder
name). Outputs: ``report.md``, ``report.html`` (tables plus every PNG found in the runs, copied into
``figures/``) and ``summary.json`` (the merged tables and their marks).
"""

from __future__ import annotations

import html
import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from captionrl.config import help_field
from captionrl.errors import ConfigError, DataError
from captionrl.eval import stats
from captionrl.eval.result import EvalResult, format_cell
from captionrl.records import write_json

LOWER_WORDS = ("mse", "loss", "error", "rel.", "red")
UNMARKED_PREFIXES = ("n_", "length", "len")


@dataclass
class ReportConfig:
    """Settings of ``captionrl report``."""

    out: str = help_field(help="where report.md, report.html, summary.json and figures/ go")
    runs: list[str] = help_field([], "folders written by evaluation runs (searched recursively)", positional=True)

    def __post_init__(self) -> None:
        if not self.runs:
            raise ConfigError("runs", [], "no run folders given", "write captionrl report RUN_DIR... --out DIR")


CONFIG = ReportConfig


def find_summaries(run_dirs: Sequence[str | Path]) -> list[tuple[Path, EvalResult]]:
    """Every ``summary.json`` under the given folders (a folder may itself be one run)."""
    found: list[tuple[Path, EvalResult]] = []
    for d in run_dirs:
        p = Path(d)
        if not p.exists():
            raise DataError("RUN_DIR", str(d), "does not exist", "pass folders that evaluation runs wrote (--out)")
        files = [p] if p.is_file() else sorted(p.rglob("summary.json"))
        for f in files:
            try:
                data = json.loads(f.read_text(encoding="utf-8"))
            except json.JSONDecodeError as exc:
                raise DataError(str(f), "summary.json", f"is not valid JSON ({exc})", "rerun that evaluation") from exc
            except UnicodeDecodeError as exc:
                raise DataError(str(f), "summary.json", f"is not UTF-8 text ({exc.reason} at byte {exc.start})",
                                "rerun that evaluation") from None
            if not isinstance(data, dict) or data.get("protocol") == "report":
                continue
            found.append((f, EvalResult.from_summary(data, str(f))))
    if not found:
        raise DataError("RUN_DIR", [str(d) for d in run_dirs], "no summary.json found", "run an evaluation first")
    return found


def direction(column: str, better: Mapping[str, str | None]) -> str | None:
    """'lower', 'higher' or None (not a quality column)."""
    if column in better:
        return better[column]
    low = column.lower()
    if low.startswith(UNMARKED_PREFIXES):
        return None
    return "lower" if any(w in low for w in LOWER_WORDS) else "higher"


def merge(summaries: Sequence[tuple[Path, EvalResult]]) -> dict[str, dict[str, Any]]:
    """protocol -> {"rows", "columns", "better", "runs"}: runs of one protocol in one table."""
    tables: dict[str, dict[str, Any]] = {}
    for path, s in summaries:
        t = tables.setdefault(s.protocol, {"rows": [], "columns": [], "better": {}, "runs": []})
        t["runs"].append(str(path.parent))
        for c in s.columns:
            if c not in t["columns"]:
                t["columns"].append(c)
        t["better"].update(s.better)
        t["better"].update(dict.fromkeys(s.labels))
        names = {r["system"] for r in t["rows"]}
        for r in s.rows:
            row = dict(r)
            if row["system"] in names:
                row["system"] = f"{row['system']} ({path.parent.name})"
            t["rows"].append(row)
    for t in tables.values():
        t["marks"] = mark(t["rows"], t["columns"], t["better"])
    return tables


def mark(rows: Sequence[Mapping[str, Any]], columns: Sequence[str],
         better: Mapping[str, str | None]) -> dict[str, list[str]]:
    """Per column: the best row, plus rows not significantly worse where per-seed values allow a test."""
    marks: dict[str, list[str]] = {}
    for c in columns:
        way = direction(c, better)
        vals = {r["system"]: r[c] for r in rows
                if isinstance(r.get(c), (int, float)) and not isinstance(r.get(c), bool) and not r.get("baseline")}
        if way is None or not vals:
            continue
        lower = way == "lower"
        best = stats.best_row(vals, lower_is_better=lower)
        chosen = [best]
        seeds = {r["system"]: r["per_seed"][c] for r in rows
                 if r["system"] in vals and isinstance(r.get("per_seed"), Mapping) and c in r["per_seed"]}
        if best in seeds and len(seeds[best]) >= 2:
            n = len(seeds[best])
            same = {k: v for k, v in seeds.items() if len(v) == n}
            res = stats.not_worse_than_best(same, lower_is_better=lower)
            if res[best]["best"]:  # the test's best (mean of seeds) agrees with the table's
                chosen = [k for k, v in res.items() if v["marked"]]
        marks[c] = chosen
    return marks


def markdown(protocol: str, table: Mapping[str, Any]) -> str:
    cols = table["columns"]
    lines = [f"## {protocol}", "", f"Runs: {', '.join(table['runs'])}. **Bold**: best, or not significantly "
             "worse than the best (paired t-test across seeds, p >= 0.05) where per-seed values exist.", "",
             "| System | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for r in table["rows"]:
        cells = []
        for c in cols:
            text = format_cell(r, c)
            cells.append(f"**{text}**" if text and r["system"] in table["marks"].get(c, []) else text)
        lines.append(f"| {r['system']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def html_table(protocol: str, table: Mapping[str, Any]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table["columns"])
    body = []
    for r in table["rows"]:
        tds = []
        for c in table["columns"]:
            text = html.escape(format_cell(r, c))
            tds.append(f"<td><b>{text}</b></td>" if text and r["system"] in table["marks"].get(c, []) else f"<td>{text}</td>")
        body.append(f"<tr><td>{html.escape(str(r['system']))}</td>{''.join(tds)}</tr>")
    return (f"<h2>{html.escape(protocol)}</h2><table border='1' cellspacing='0' cellpadding='3'>"
            f"<tr><th>System</th>{head}</tr>{''.join(body)}</table>")


def build(run_dirs: Sequence[str | Path], out: str | Path) -> dict[str, Any]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summaries = find_summaries(run_dirs)
    tables = merge(summaries)
    md = ["# captionrl report", ""] + [markdown(p, t) for p, t in tables.items()]
    (out / "report.md").write_text("\n".join(md))
    figures = []
    for path, _ in summaries:
        for png in sorted(path.parent.rglob("*.png")):
            if out.resolve() in png.resolve().parents:
                continue
            dest = out / "figures" / f"{path.parent.name}_{png.name}"
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(png, dest)
            figures.append(dest.relative_to(out).as_posix())
    parts = ["<html><head><meta charset='utf-8'><title>captionrl report</title></head><body><h1>captionrl report</h1>"]
    parts += [html_table(p, t) for p, t in tables.items()]
    parts += [f"<figure><img src='{html.escape(f)}'><figcaption>{html.escape(f)}</figcaption></figure>" for f in figures]
    parts.append("</body></html>")
    (out / "report.html").write_text("\n".join(parts))
    summary = {"protocol": "report", "tables": tables, "figures": figures,
               "rows": [], "columns": [], "config": {"runs": [str(d) for d in run_dirs]}}
    write_json(out / "summary.json", summary)
    return summary


def run_command(cfg: ReportConfig) -> int:
    summary = build(cfg.runs, cfg.out)
    print(Path(cfg.out, "report.md").read_text())
    print(f"{len(summary['tables'])} table(s), {len(summary['figures'])} figure(s) -> {cfg.out}/report.html")
    return 0
