"""One result type for every evaluation protocol, and the one writer of its files.

A protocol's ``run(cfg)`` returns an ``EvalResult``: its rows (one per system, each with a ``system``
name), the columns in table order, which way each column is better (``"higher"``, ``"lower"`` or
``None`` for counts and labels), the config that produced it and the records file that holds the
evidence. ``write_result`` turns it into ``table.md``, ``summary.json`` and ``table.html``;
``captionrl report`` reads ``summary.json`` back with ``EvalResult.from_summary`` and nothing else.

Optional row fields the writer and the report understand: ``std`` (``{column: std}``, printed as
``mean ± std``), ``per_seed`` (``{column: [values]}``, for paired tests) and ``baseline`` (never marked).
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from captionrl.errors import DataError
from captionrl.records import write_json

DIRECTIONS = ("higher", "lower", None)
_FIELDS = ("protocol", "rows", "columns", "better", "labels", "config", "records", "notes", "marked")


@dataclass(frozen=True)
class EvalResult:
    """What a protocol measured. Frozen: build a new one rather than editing a result that was written."""

    protocol: str
    rows: list[dict[str, Any]]
    columns: list[str]
    better: dict[str, str | None] = field(default_factory=dict)
    labels: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    records: str | None = None
    notes: list[str] = field(default_factory=list)
    marked: dict[str, list[str]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for c, way in self.better.items():
            if way not in DIRECTIONS:
                raise DataError(f"better.{c}", way, "is not higher, lower or null", "use 'higher' or 'lower'")
        for r in self.rows:
            if "system" not in r:
                raise DataError("rows", sorted(r), "a row has no 'system'", "name every row's system")
        if "system" in self.columns:
            raise DataError("columns", self.columns, "list 'system'", "columns name the values beside the system")

    def summary(self) -> dict[str, Any]:
        """The ``summary.json`` object: the fields above, then the protocol's extra figures at top level."""
        better = {**self.better, **dict.fromkeys(self.labels)}
        return {"protocol": self.protocol, "rows": self.rows, "columns": self.columns, "better": better,
                "labels": self.labels, "config": self.config, "records": self.records, "notes": self.notes,
                "marked": self.marked, **self.extra}

    @classmethod
    def from_summary(cls, data: Mapping[str, Any], where: str = "summary.json") -> EvalResult:
        """Read a ``summary.json`` object back (older files listed ``system`` among the columns)."""
        if not isinstance(data.get("protocol"), str) or not isinstance(data.get("rows"), list):
            raise DataError(where, sorted(data), "lacks 'protocol' or 'rows'",
                            'write {"protocol": ..., "rows": [{"system": ...}], "columns": [...]}')
        columns = data.get("columns") or list(dict.fromkeys(k for r in data["rows"] for k in r))
        columns = [c for c in columns if c not in ("system", "std", "per_seed", "baseline")]
        return cls(data["protocol"], list(data["rows"]), columns, better=dict(data.get("better") or {}),
                   labels=list(data.get("labels") or []), config=dict(data.get("config") or {}),
                   records=data.get("records"), notes=list(data.get("notes") or []),
                   marked={k: list(v) for k, v in (data.get("marked") or {}).items()},
                   extra={k: v for k, v in data.items() if k not in _FIELDS})


def format_cell(row: Mapping[str, Any], column: str) -> str:
    """A table cell: floats to 4 decimals (``mean ± std`` when the row has a std), NaN as ``-``."""
    v = row.get(column)
    if v is None:
        return ""
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        text = f"{v:.4f}" if abs(v) < 100 else f"{v:.1f}"
        std = row.get("std")
        sd = std.get(column) if isinstance(std, Mapping) else None
        ci = row.get(f"{column}_ci")
        if isinstance(ci, (list, tuple)) and len(ci) == 2:
            text += f" [{ci[0]:.3f}, {ci[1]:.3f}]"
        return text + (f" ± {sd:.4f}" if sd else "")
    return str(v)


def shown_columns(result: EvalResult) -> list[str]:
    """Table columns: an interval column (``X_ci``) is shown inside its column ``X``, not on its own."""
    return [c for c in result.columns if not (c.endswith("_ci") and c[:-3] in result.columns)]


def markdown(result: EvalResult, title: bool = True) -> str:
    shown = shown_columns(result)
    cols = ["system", *shown]
    lines = [f"# {result.protocol}", ""] if title else []
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in result.rows:
        cells = [str(r["system"])]
        for c in shown:
            text = format_cell(r, c)
            cells.append(f"**{text}**" if text and r["system"] in result.marked.get(c, []) else text)
        lines.append("| " + " | ".join(cells) + " |")
    if result.notes:
        lines += [""] + [f"- {n}" for n in result.notes]
    return "\n".join(lines) + "\n"


def html_table(result: EvalResult) -> str:
    shown = shown_columns(result)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ["system", *shown])
    body = []
    for r in result.rows:
        tds = [f"<td>{html.escape(str(r['system']))}</td>"]
        for c in shown:
            text = html.escape(format_cell(r, c))
            tds.append(f"<td><b>{text}</b></td>" if text and r["system"] in result.marked.get(c, []) else f"<td>{text}</td>")
        body.append(f"<tr>{''.join(tds)}</tr>")
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in result.notes)
    return (f"<h2>{html.escape(result.protocol)}</h2><table border='1' cellspacing='0' cellpadding='3'>"
            f"<tr>{head}</tr>{''.join(body)}</table>" + (f"<ul>{notes}</ul>" if notes else ""))


def write_result(result: EvalResult, out: str | Path) -> EvalResult:
    """Write ``table.md``, ``summary.json`` and ``table.html`` into ``out``; returns the result."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(markdown(result))
    write_json(out / "summary.json", result.summary())
    page = html_table(result)
    (out / "table.html").write_text(f"<html><head><meta charset='utf-8'><title>{html.escape(result.protocol)}"
                                    f"</title></head><body>{page}</body></html>\n")
    return result


def result_text(result: EvalResult, out: str | Path) -> str:
    """What every ``captionrl eval`` command prints when it ends: the table and where the files are."""
    return f"{markdown(result)}\nrecords.jsonl, table.md, table.html and summary.json in {out}"
