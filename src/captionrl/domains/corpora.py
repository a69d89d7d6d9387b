"""Corpus loaders: the embedded default corpus and the public file layouts users bring.

The embedded corpus is made of real series shipped inside the statsmodels wheel (a core dependency), so
tests, demos and the CPU pipeline run with no download. User layouts: ETT and LTSF wide CSVs, a
``date,value`` CSV (Saugeen), CaTS-Bench folders, BEDTime and TSFragment CSVs, and plain JSONL. Every
loader returns ``list[Series]`` (reference captions in ``meta["captions"]``) and fails with a
``DataError`` naming file, row and column, never a pandas traceback.
"""

from __future__ import annotations

import ast
import csv
import importlib.util
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from captionrl.domains.timeseries import Fill, _to_float, make_series
from captionrl.errors import ConfigError, DataError
from captionrl.records import read_jsonl
from captionrl.types import Series

csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # BEDTime/TSFragment put whole series in one cell


# ------------------------------------------------------------------------------------ the embedded corpus
@dataclass(frozen=True)
class EmbeddedSeries:
    """One series of the embedded corpus: a column of a CSV inside statsmodels' datasets folder."""

    name: str
    file: str
    column: str | Sequence[str]  # a list of columns is read row by row, in order (elnino's 12 months)
    domain: str
    freq: str


_MACRO = ("realgdp", "realcons", "realinv", "realgovt", "realdpi", "cpi", "m1", "tbilrate", "unemp",
          "pop", "infl", "realint")
_MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")

EMBEDDED: tuple[EmbeddedSeries, ...] = (
    EmbeddedSeries("co2", "co2/co2.csv", "co2", "atmosphere", "weekly"),
    EmbeddedSeries("sunspots", "sunspots/sunspots.csv", "SUNACTIVITY", "solar", "yearly"),
    EmbeddedSeries("elec_equip", "elec_equip/elec_equip.csv", "STS.M.I7.W.TOVT.NS0016.4.000", "industry", "monthly"),
    EmbeddedSeries("nile", "nile/nile.csv", "volume", "hydrology", "yearly"),
    EmbeddedSeries("elnino", "elnino/elnino.csv", _MONTHS, "ocean", "monthly"),
    *(EmbeddedSeries(f"macro_{c}", "macrodata/macrodata.csv", c, "economy", "quarterly") for c in _MACRO),
    EmbeddedSeries("e6_inflation", "interest_inflation/E6.csv", "Dp", "economy", "quarterly"),
    EmbeddedSeries("e6_interest", "interest_inflation/E6.csv", "R", "economy", "quarterly"),
)


def statsmodels_datasets_dir() -> Path:
    """The installed ``statsmodels/datasets`` folder (found without importing statsmodels)."""
    spec = importlib.util.find_spec("statsmodels")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("corpus", "embedded", "statsmodels is not installed",
                        "pip install statsmodels (a captionrl dependency), or pass a corpus file")
    return Path(next(iter(spec.submodule_search_locations))) / "datasets"


def load_embedded_corpus(names: Sequence[str] | None = None) -> list[Series]:
    """The embedded default corpus: real series from the statsmodels wheel, six domains, no download.

    Missing values (co2 has 59 empty weeks) are interpolated and reported in ``meta["gaps"]``.
    """
    known = {e.name: e for e in EMBEDDED}
    chosen = list(known) if names is None else list(names)
    for n in chosen:
        if n not in known:
            from captionrl.registry import suggest

            raise ConfigError("corpus.names", n, "not in the embedded corpus", suggest(n, list(known)))
    root = statsmodels_datasets_dir()
    out = []
    for n in chosen:
        e = known[n]
        header, rows = _read_csv(root / e.file)
        cols = [e.column] if isinstance(e.column, str) else list(e.column)
        idx = [_column_index(header, c, root / e.file) for c in cols]
        raw = [row[i] for row in rows for i in idx]
        dates = [row[0] for row in rows for _ in idx] if len(idx) == 1 else None
        meta: dict[str, Any] = {"freq": e.freq, "file": f"statsmodels/datasets/{e.file}"}
        if dates is not None:
            meta["dates"] = dates
        out.append(make_series(raw, id=e.name, fill="interpolate", domain=e.domain, meta=meta))
    return out


# ------------------------------------------------------------------------------------------ CSV helpers
def _read_csv(path: str | Path) -> tuple[list[str], list[list[str]]]:
    """Header (stripped, BOM removed) and rows; empty files and ragged rows fail with the row number."""
    p = Path(path)
    if not p.is_file():
        raise DataError("path", str(p), "does not exist or is not a file", "check the path")
    try:
        with p.open(newline="", encoding="utf-8-sig") as f:
            rows = [r for r in csv.reader(f, skipinitialspace=True) if any(c.strip() for c in r)]
    except UnicodeDecodeError as exc:
        raise DataError(str(p), exc.object[exc.start:exc.start + 8], f"is not UTF-8 text (byte {exc.object[exc.start]:#04x})",
                        "save the file as UTF-8") from None
    if not rows:
        raise DataError(str(p), "", "is empty (no header, no rows)", "point at a CSV with a header and data rows")
    header = [h.strip() for h in rows[0]]
    if len(rows) < 2:
        raise DataError(str(p), header, "has a header but no data rows", "point at a CSV with data rows")
    for r, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise DataError(f"{p}:row {r}", row[:8], f"has {len(row)} fields but the header has {len(header)}",
                            "fix the row (a missing or extra comma)")
    return header, rows[1:]


def _column_index(header: list[str], column: str, path: Path | str) -> int:
    if column not in header:
        raise DataError(f"{path}:column", column, f"not found; columns found: {header}",
                        "pass one of the columns found (e.g. target=...)")
    return header.index(column)


def _numbers(rows: list[list[str]], col: int, name: str, path: Path | str) -> list[float]:
    out = []
    for r, row in enumerate(rows, start=2):
        try:
            out.append(_to_float(row[col], ""))
        except DataError:
            raise DataError(f"{path}:row {r}, column {name}", row[col], "is not a number",
                            "fix the cell (missing values may be empty or NaN)") from None
    return out


def load_wide_csv(path: str | Path, target: str | Sequence[str] = "OT", *, date_column: str | None = "date",
                  fill: Fill = "error", domain: str | None = None) -> list[Series]:
    """One ``Series`` per target column of a wide CSV with a date column: ETT
    (``date,HUFL,HULL,MUFL,MULL,LUFL,LULL,OT``, the default target ``OT`` is oil temperature), LTSF
    electricity/traffic (``date,0,1,...,N-1,OT``: ``OT`` or client column names), ...

    ``target="all"`` takes every column except the date. Dates are kept as ``meta["dates"]`` so windows
    can report their time span.
    """
    p = Path(path)
    header, rows = _read_csv(p)
    d = _column_index(header, date_column, p) if date_column else None
    targets = [h for i, h in enumerate(header) if i != d] if target == "all" else (
        [target] if isinstance(target, str) else list(target))
    dates = [row[d].strip() for row in rows] if d is not None else None
    out = []
    for t in targets:
        c = _column_index(header, t, p)
        meta: dict[str, Any] = {"file": str(p), "column": t}
        if dates is not None:
            meta["dates"] = dates
        sid = p.stem if len(targets) == 1 else f"{p.stem}:{t}"
        out.append(make_series(_numbers(rows, c, t, p), id=sid, fill=fill, domain=domain or p.stem, meta=meta))
    return out


def load_value_csv(path: str | Path, value_column: str | None = None, *, fill: Fill = "error") -> list[Series]:
    """A two-column ``date,value`` CSV (Saugeen: ``Date, saugeenRiverflows``); the value is column 2."""
    p = Path(path)
    header, _ = _read_csv(p)
    if value_column is None:
        if len(header) != 2:
            raise DataError(f"{p}:columns", header, f"expected 2 columns (date, value), found {len(header)}",
                            "pass value_column=..., or use load_wide_csv")
        value_column = header[1]
    return load_wide_csv(p, value_column, date_column=header[0], fill=fill)


def _parse_list(text: str, field: str) -> Any:
    """A list written in a cell: JSON first, then a Python literal (BEDTime writes either)."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError):
        pass
    try:
        return ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        raise DataError(field, text, "is not a list of numbers", "write the series as [v1, v2, ...]") from None


def _captions(value: Any) -> list[str]:
    if value is None or value == "":
        return []
    if isinstance(value, str):
        s = value.strip()
        if s.startswith("["):
            try:
                parsed = _parse_list(s, "captions")
                if isinstance(parsed, list):
                    return [str(x) for x in parsed]
            except DataError:
                pass
        return [value]
    if isinstance(value, list):
        return [str(x) for x in value]
    return [str(value)]


def _list_csv(path: str | Path, series_column: str, caption_column: str, id_column: str | None,
              fill: Fill, domain: str | None) -> list[Series]:
    p = Path(path)
    header, rows = _read_csv(p)
    s = _column_index(header, series_column, p)
    c = _column_index(header, caption_column, p)
    i = header.index(id_column) if id_column and id_column in header else None
    out = []
    for r, row in enumerate(rows, start=2):
        sid = row[i].strip() if i is not None else f"{p.stem}_{r - 2}"
        values = _parse_list(row[s], f"{p}:row {r}, column {series_column}")
        meta = {"captions": _captions(row[c]), "file": str(p), "row": r}
        out.append(make_series(values, id=sid, fill=fill, domain=domain or p.stem, meta=meta))
    return out


def load_bedtime_csv(path: str | Path, *, fill: Fill = "error", domain: str | None = None) -> list[Series]:
    """BEDTime CSV: ``series`` (a list string) and ``annotations`` (a caption or list of captions)."""
    return _list_csv(path, "series", "annotations", "idx", fill, domain)


def load_tsfragment_csv(path: str | Path, *, fill: Fill = "error", domain: str | None = None) -> list[Series]:
    """TSFragment CSV: ``Text`` (the caption) and ``OT`` (the series as a list string)."""
    return _list_csv(path, "OT", "Text", None, fill, domain)


def load_jsonl(path: str | Path, *, fill: Fill = "error", domain: str | None = None) -> list[Series]:
    """Plain JSONL, one ``{"id", "series", "caption"?, "next"?}`` per line (caption may be a list)."""
    p = Path(path)
    if not p.is_file():
        raise DataError("path", str(p), "does not exist or is not a file", "check the path")
    out = []
    for n, rec in enumerate(read_jsonl(p, unique_key="id"), start=1):  # strict: named errors for bad JSON, non-UTF-8, repeated ids
        if "series" not in rec:
            raise DataError(f"{p}:line {n}", sorted(rec), "has no 'series' field", 'write {"id": ..., "series": [...]}')
        sid = str(rec.get("id", f"{p.stem}_{n - 1}"))
        # An explicit "caption": "" is a captioner's (empty) output, which evaluations must score, not a
        # missing caption; CSV cells cannot tell the two apart, so only JSONL keeps it.
        given = rec.get("caption", rec.get("captions"))
        if not (given is None or isinstance(given, str) or (isinstance(given, list) and all(isinstance(c, str) for c in given))):
            key = "caption" if "caption" in rec else "captions"
            raise DataError(f"{p}:line {n}.{key}", given, "is not text (a caption is a string, or a list of strings)",
                            f'write the caption in quotes, e.g. "{key}": "The series rises from 1 to 8."')
        meta: dict[str, Any] = {"captions": [""] if given == "" else _captions(given)}
        if "next" in rec:
            meta["next"] = make_series(rec["next"], id=f"{sid}.next").values.tolist()
        extra = {k: v for k, v in rec.items() if k not in ("id", "series", "caption", "captions", "next")}
        meta.update(extra)
        out.append(make_series(rec["series"], id=sid, fill=fill, domain=str(rec.get("domain", domain or p.stem)),
                               meta=meta))
    if not out:
        raise DataError(str(p), "", "is empty (no JSON lines)", "point at a JSONL file with one item per line")
    return out


def load_cats_bench(root: str | Path, split: str | None = None, *, fill: Fill = "error") -> list[Series]:
    """CaTS-Bench: ``<root>/{train,test}/{time series,gt_captions,metadata}/<domain>_<idx>_<split>.*``."""
    r = Path(root)
    splits = [split] if split else [s for s in ("train", "test") if (r / s).is_dir()]
    if not splits:
        found = sorted(x.name for x in r.iterdir()) if r.is_dir() else "not a folder"
        raise DataError("cats_bench.root", str(r), f"has no train/ or test/ folder (found: {found})",
                        "point at the CaTS-Bench root holding train/ and test/")
    out = []
    for s in splits:
        ts_dir = r / s / "time series"
        if not ts_dir.is_dir():
            found = sorted(x.name for x in (r / s).iterdir()) if (r / s).is_dir() else "missing"
            raise DataError("cats_bench.folder", str(ts_dir), f"missing (found: {found})",
                            "each split needs a 'time series' folder of .txt files")
        files = sorted(ts_dir.glob("*.txt"))
        if not files:
            raise DataError(str(ts_dir), "", "is empty (no .txt files)", "check the download")
        for f in files:
            stem = f.stem
            parts = stem.rsplit("_", 2)
            dom = parts[0] if len(parts) == 3 else "cats"
            text = f.read_text(encoding="utf-8").strip()
            if not text:
                raise DataError(str(f), "", "is empty", "remove the file or restore its values")
            tokens = [t for t in text.replace("[", " ").replace("]", " ").replace(",", " ").split() if t]
            values = []
            for j, t in enumerate(tokens):
                try:
                    values.append(_to_float(t, ""))
                except DataError:
                    raise DataError(f"{f}:value {j}", t, "is not a number", "fix the file") from None
            meta: dict[str, Any] = {"captions": [], "file": str(f)}
            cap = r / s / "gt_captions" / f"{stem}.txt"
            if cap.is_file():
                meta["captions"] = [cap.read_text(encoding="utf-8").strip()]
            md = r / s / "metadata" / f"{stem}.json"
            if md.is_file():
                meta["metadata"] = json.loads(md.read_text(encoding="utf-8"))
            out.append(make_series(values, id=stem, fill=fill, domain=dom, split=s, meta=meta))
    return out


def load_corpus(spec: str | Path, *, target: str = "OT", fill: Fill = "error") -> list[Series]:
    """``"embedded"`` or a path; the layout is recognised from the folder structure or the CSV header."""
    if str(spec) == "embedded":
        return load_embedded_corpus()
    p = Path(spec)
    if p.is_dir():
        return load_cats_bench(p, fill=fill)
    if not p.exists():
        raise DataError("corpus", str(spec), "is neither 'embedded' nor an existing file or folder",
                        "pass --corpus embedded or a path to a CSV, JSONL or CaTS-Bench folder")
    if p.suffix in (".jsonl", ".json"):
        return load_jsonl(p, fill=fill)
    header, _ = _read_csv(p)
    if "series" in header and "annotations" in header:
        return load_bedtime_csv(p, fill=fill)
    if "Text" in header and "OT" in header:
        return load_tsfragment_csv(p, fill=fill)
    if len(header) == 2:
        return load_value_csv(p, fill=fill)
    return load_wide_csv(p, target, date_column="date" if "date" in header else None, fill=fill)
