"""Layout readers of ``captionrl data prepare``: one per public benchmark, each returning items per split
(the benchmark's own split, or a stated one), the files read and what was skipped. Every check names the
file, row and fix (``DataError``); nothing here mines, samples or writes."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from captionrl.domains.prepare.settings import ETT_COLUMNS, SPLITS, WHERE_TO_GET, PrepareConfig
from captionrl.domains.timeseries import make_series, split_by_fraction, split_ett, window
from captionrl.errors import ConfigError, DataError
from captionrl.types import Series


@dataclass
class Read:
    """What a layout reader found: items per split, how the split was made, files read, what was skipped."""

    items: dict[str, list[Series]]
    split_rule: dict[str, Any]
    files: list[Path]
    skipped: list[dict[str, Any]] = field(default_factory=list)
    windows: dict[str, Any] | None = None


# ------------------------------------------------------------------------------------------ layouts
def _header_check(path: Path, header: Sequence[str], source: str, need: Sequence[str]) -> None:
    """A wrong layout or missing column fails naming the file, what is missing and what the file looks like."""
    missing = [c for c in need if c not in header]
    if not missing:
        return
    guess = _guess_layout(header)
    fix = (f"this looks like a {guess} file: use source={guess}" if guess and guess != source
           else f"point at {WHERE_TO_GET[source]}, or add the missing column(s)")
    raise DataError(f"{path}:row 1 (header)", list(header)[:12],
                    f"is not a {source} file: missing column(s) {missing} (expected {list(need)})", fix)


def _guess_layout(header: Sequence[str]) -> str | None:
    h = set(header)
    if set(ETT_COLUMNS) <= h:
        return "ett"
    if "series" in h and "annotations" in h:
        return "bedtime"
    if "Text" in h and "OT" in h:
        return "tsfragment"
    if "date" in h and "OT" in h and any(x.isdigit() for x in h):
        return "electricity"
    if len(header) == 2 and header[0].lower() == "date":
        return "saugeen"
    return None


def _split_name(stem: str) -> str | None:
    s = stem.lower()
    for name, pat in (("train", "train|training"), ("val", "val|valid|validation|dev"), ("test", "test|testing")):
        if re.search(rf"(^|[^a-z])({pat})([^a-z]|$)", s):
            return name
    return None


def _input_files(cfg: PrepareConfig, exts: Sequence[str]) -> list[tuple[Path, str | None]]:
    """The file, or a folder's files with the split their name states (``None`` when it states none)."""
    p = Path(cfg.path)
    if p.is_file():
        return [(p, None)]  # one file: its rows are split by the stated item rule
    if not p.is_dir():
        raise DataError("path", cfg.path, "does not exist", f"point at your local copy of {WHERE_TO_GET[cfg.source]}")
    files = sorted(f for f in p.iterdir() if f.is_file() and f.suffix.lower() in exts)
    if not files:
        raise DataError("path", str(p), f"holds no {'/'.join(exts)} file (found: {sorted(x.name for x in p.iterdir())[:10]})",
                        f"point at {WHERE_TO_GET[cfg.source]}")
    named = [(f, _split_name(f.stem)) for f in files]
    if any(s for _, s in named) and not all(s for _, s in named):
        odd = [f.name for f, s in named if not s]
        raise DataError("path", str(p), f"mixes split-named files with files naming no split: {odd}",
                        "name every file *train*/*val*/*test*, or keep one file per folder")
    return named


def _row_error(exc: DataError, where: str) -> DataError:
    return DataError(where, exc.value, exc.problem, exc.fix if "interpolate" not in exc.fix
                     else "clean the cell, or set fill=interpolate to interpolate and record the gaps")


def _parse_values(text: str, where: str) -> Any:
    """A series written in a cell: JSON, a Python literal, or Python's ``str(list)`` with bare nan/inf
    (read as missing, so the NaN check below names the cell instead of a parse failure)."""
    import ast

    from captionrl.domains.corpora import _parse_list

    try:
        return _parse_list(text, where)
    except DataError:
        try:
            return ast.literal_eval(re.sub(r"(?i)-?\b(nan|inf|infinity)\b", "None", text.strip()))
        except (ValueError, SyntaxError):
            raise DataError(where, text[:80], "is not a list of numbers", "write the series as [v1, v2, ...]") from None


def _read_list_csv(cfg: PrepareConfig, series_col: str, caption_col: str, id_col: str | None) -> Read:
    from captionrl.domains.corpora import _captions, _read_csv

    named = _input_files(cfg, (".csv",))
    items: dict[str, list[Series]] = {s: [] for s in SPLITS}
    loose: list[Series] = []
    skipped: list[dict[str, Any]] = []
    short = 0
    for path, split in named:
        header, rows = _read_csv(path)
        _header_check(path, header, cfg.source, [series_col, caption_col])
        s, c = header.index(series_col), header.index(caption_col)
        i = header.index(id_col) if id_col and id_col in header else None
        for r, row in enumerate(rows, start=2):
            where = f"{path}:row {r}, column {series_col}"
            sid = f"{path.stem}:{row[i].strip()}" if i is not None else f"{path.stem}:{r - 2}"
            values = _parse_values(row[s], where)
            if not isinstance(values, list):
                raise DataError(where, row[s][:80], "is not a list of numbers", "write the series as [v1, v2, ...]")
            try:
                ser = make_series(values, id=sid, fill=cfg.fill, domain=cfg.source,  # type: ignore[arg-type]
                                  split=split or "", meta={"captions": _captions(row[c]), "file": path.name, "row": r})
            except DataError as exc:
                raise _row_error(exc, f"{where} ({exc.field})") from None
            if len(ser) < cfg.min_length:
                short += 1
                continue
            (items[split] if split else loose).append(ser)
    if short:
        skipped.append({"what": f"{short} series", "why": f"shorter than min_length={cfg.min_length}"})
    rule: dict[str, Any]
    if loose:
        items = _item_split(loose, cfg.splits, cfg.seed)
        rule = {"rule": "seeded item split (the files name no split)", "fractions": list(cfg.splits), "seed": cfg.seed}
    else:
        rule = {"rule": "the benchmark's files (split named in each file name)",
                "files": {p.name: s for p, s in named}}
        if not items["val"] and items["train"] and cfg.val_fraction > 0:
            items["train"], items["val"] = _hold_out(items["train"], cfg.val_fraction, cfg.seed)
            rule["val"] = f"seeded {cfg.val_fraction:g} of train (the benchmark has no val split)"
    return Read(items, rule, [p for p, _ in named], skipped)


def _item_split(series: Sequence[Series], fractions: Sequence[float], seed: int) -> dict[str, list[Series]]:
    """A seeded split of whole items (a collection of short series has no time order across items)."""
    order = np.random.default_rng([seed, 1]).permutation(len(series))
    cuts = np.round(np.cumsum([0.0, *fractions]) * len(series)).astype(int)
    cuts[-1] = len(series)
    out = {}
    for name, a, b in zip(SPLITS, cuts[:-1], cuts[1:], strict=True):
        out[name] = [_with_split(series[j], name) for j in sorted(order[a:b].tolist())]
    return out


def _hold_out(train: list[Series], fraction: float, seed: int) -> tuple[list[Series], list[Series]]:
    order = np.random.default_rng([seed, 2]).permutation(len(train))
    n_val = round(fraction * len(train))
    val_idx = set(order[:n_val].tolist())
    return ([s for j, s in enumerate(train) if j not in val_idx],
            [_with_split(s, "val") for j, s in enumerate(train) if j in val_idx])


def _with_split(s: Series, split: str) -> Series:
    return Series(id=s.id, values=s.values, source=s.source, start=s.start, domain=s.domain, split=split, meta=s.meta)


def read_cats_bench(cfg: PrepareConfig) -> Read:
    root = Path(cfg.path)
    if not root.is_dir():
        raise DataError("path", cfg.path, "is not a folder" if root.exists() else "does not exist",
                        f"point at {WHERE_TO_GET['cats-bench']}")
    found = sorted(x.name for x in root.iterdir())
    if not any((root / s).is_dir() for s in ("train", "test")):
        raise DataError(f"{root}", found, "is not a CaTS-Bench folder: no train/ or test/ folder",
                        f"point at {WHERE_TO_GET['cats-bench']}")
    items: dict[str, list[Series]] = {s: [] for s in SPLITS}
    files: list[Path] = []
    short = 0
    for split in ("train", "test"):
        ts_dir = root / split / "time series"
        if not (root / split).is_dir():
            raise DataError(f"{root}/{split}", found, "missing: CaTS-Bench has train/ and test/",
                            "restore the missing split folder from the release")
        if not ts_dir.is_dir():
            raise DataError(str(ts_dir), sorted(x.name for x in (root / split).iterdir()), "missing",
                            "each split folder needs a 'time series' folder of .txt files")
        txts = sorted(ts_dir.glob("*.txt"))
        if not txts:
            raise DataError(str(ts_dir), [], f"empty split: no .txt files in {split}/time series",
                            "restore the files from the release, or point at the complete folder")
        for f in txts:
            files.append(f)
            text = f.read_text(encoding="utf-8").strip()
            tokens = [t for t in text.replace("[", " ").replace("]", " ").replace(",", " ").split() if t]
            if not tokens:
                raise DataError(str(f), "", "is empty", "restore its values, or delete the file")
            values: list[float] = []
            for j, t in enumerate(tokens):
                try:
                    values.append(float(t))
                except ValueError:
                    raise DataError(f"{f}:value {j}", t, "is not a number", "fix the file") from None
            parts = f.stem.rsplit("_", 2)
            meta: dict[str, Any] = {"captions": [], "file": f"{split}/time series/{f.name}"}
            cap = root / split / "gt_captions" / f"{f.stem}.txt"
            if cap.is_file():
                files.append(cap)
                meta["captions"] = [cap.read_text(encoding="utf-8").strip()]
            md = root / split / "metadata" / f"{f.stem}.json"
            if md.is_file():
                files.append(md)
                try:
                    meta["metadata"] = json.loads(md.read_text(encoding="utf-8"))
                except json.JSONDecodeError as exc:
                    raise DataError(str(md), md.read_text()[:80], f"is not valid JSON ({exc.msg})", "restore the file") from None
            try:
                s = make_series(values, id=f.stem, fill=cfg.fill, domain=parts[0] if len(parts) == 3 else "cats",  # type: ignore[arg-type]
                                split=split, meta=meta)
            except DataError as exc:
                raise _row_error(exc, f"{f} ({exc.field})") from None
            if len(s) < cfg.min_length:
                short += 1
                continue
            items[split].append(s)
    rule: dict[str, Any] = {"rule": "the benchmark's train/ and test/ folders"}
    if cfg.val_fraction > 0:
        items["train"], items["val"] = _hold_out(items["train"], cfg.val_fraction, cfg.seed)
        rule["val"] = f"seeded {cfg.val_fraction:g} of train/ (CaTS-Bench has no val split)"
    skipped = [{"what": f"{short} series", "why": f"shorter than min_length={cfg.min_length}"}] if short else []
    skipped.append({"what": "plots/ folders", "why": "not read: charts are rendered from the values"})
    return Read(items, rule, files, skipped)


def read_jsonl(cfg: PrepareConfig) -> Read:
    from captionrl.domains.corpora import load_jsonl

    named = _input_files(cfg, (".jsonl",))
    items: dict[str, list[Series]] = {s: [] for s in SPLITS}
    loose: list[Series] = []
    short = 0
    for path, fsplit in named:
        try:
            loaded = load_jsonl(path, fill=cfg.fill)  # type: ignore[arg-type]
        except DataError as exc:
            raise _row_error(exc, f"{path} ({exc.field})") from None
        for n, s in enumerate(loaded, start=1):
            split = str(s.meta.get("split") or fsplit or "")
            if split and split not in SPLITS:
                raise DataError(f"{path}:line {n}.split", split, "unknown split", "use train, val or test")
            if len(s) < cfg.min_length:
                short += 1
                continue
            s = Series(id=s.id, values=s.values, source=s.source, start=s.start, domain=s.domain, split=split,
                       meta={k: v for k, v in s.meta.items() if k != "split"})
            (items[split] if split else loose).append(s)
    if loose and any(items.values()):
        raise DataError(str(cfg.path), "split", "some lines name a split and others do not",
                        "give every line a split, or none (then a seeded item split is made)")
    if loose:
        items = _item_split(loose, cfg.splits, cfg.seed)
        rule: dict[str, Any] = {"rule": "seeded item split (no line names a split)", "fractions": list(cfg.splits),
                                "seed": cfg.seed}
    else:
        rule = {"rule": "the 'split' field of each line (or the file name)"}
    skipped = [{"what": f"{short} series", "why": f"shorter than min_length={cfg.min_length}"}] if short else []
    return Read(items, rule, [p for p, _ in named], skipped)


def read_forecasting(cfg: PrepareConfig) -> Read:
    """ETT, LTSF Electricity, Saugeen: one long series per column, split in time, windowed with ``next``."""
    from captionrl.domains.corpora import _read_csv, load_value_csv, load_wide_csv

    p = Path(cfg.path)
    if not p.is_file():
        raise DataError("path", cfg.path, "is not a file" if p.exists() else "does not exist",
                        f"point at {WHERE_TO_GET[cfg.source]}")
    header, rows = _read_csv(p)
    if cfg.source == "ett":
        _header_check(p, header, "ett", ETT_COLUMNS)
    elif cfg.source == "electricity":
        _header_check(p, header, "electricity", ["date", "OT"])
        if not any(h.isdigit() for h in header):
            raise DataError(f"{p}:row 1 (header)", header[:12], "is not an LTSF electricity file: no client columns 0..N-1",
                            f"point at {WHERE_TO_GET['electricity']}")
    else:
        if len(header) != 2 or header[0].lower() != "date":
            guess = _guess_layout(header)
            raise DataError(f"{p}:row 1 (header)", header[:12],
                            "is not a Saugeen file: expected 2 columns (Date, saugeenRiverflows)",
                            f"use source={guess}" if guess else f"point at {WHERE_TO_GET['saugeen']}")
    _check_cells(p, header, rows, cfg)
    try:
        if cfg.source == "saugeen":
            series = load_value_csv(p, fill=cfg.fill)  # type: ignore[arg-type]
        else:
            target: str | list[str] = "all" if cfg.target == "all" else [t.strip() for t in cfg.target.split(",")]
            if target != "all":
                _header_check(p, header, cfg.source, list(target))
            series = load_wide_csv(p, target, date_column="date", fill=cfg.fill, domain=p.stem)  # type: ignore[arg-type]
    except DataError as exc:
        raise _row_error(exc, exc.field) from None
    segments = []
    if cfg.source == "ett":
        freq = cfg.freq or ("15min" if p.stem.lower().startswith("ettm") else "h" if p.stem.lower().startswith("etth") else None)
        if freq is None:
            raise ConfigError("freq", None, f"cannot tell hourly from 15-minute ETT from the file name {p.name!r}",
                              "set freq=h (ETTh1/ETTh2) or freq=15min (ETTm1/ETTm2)")
        segments = [split_ett(s, freq) for s in series]
        rule: dict[str, Any] = {"rule": "ETT 12/4/4 months (30-day months; split_ett)", "freq": freq,
                                "rows": {k: len(v) for k, v in segments[0].items()}}
        unused = len(series[0]) - sum(len(v) for v in segments[0].values())
        if unused:
            rule["unused_rows"] = f"the last {unused} rows (after 20 months), as in the ETT convention"
    else:
        if min(cfg.splits) <= 0:
            raise ConfigError("splits", cfg.splits, "a time split needs three positive fractions", "use [0.7, 0.1, 0.2]")
        segments = [split_by_fraction(s, cfg.splits) for s in series]
        rule = {"rule": "time-ordered fractions of each column (oldest = train)", "fractions": list(cfg.splits),
                "rows": {k: len(v) for k, v in segments[0].items()}}
    items: dict[str, list[Series]] = {s: [] for s in SPLITS}
    stride = cfg.stride or cfg.length
    for seg in segments:
        for name, s in seg.items():
            try:
                items[name].extend(window(s, cfg.length, stride, next_length=cfg.horizon))
            except ConfigError as exc:
                raise ConfigError(exc.field, exc.value, exc.problem, exc.fix.replace("--", "")) from None
    for name, ws in items.items():
        for w in ws:
            w.meta.setdefault("captions", [])  # type: ignore[union-attr]
        if not ws:
            raise DataError(f"{p} ({name} split)", len(segments[0][name]),
                            f"empty split: {len(segments[0][name])} rows give no window of length={cfg.length} "
                            f"plus horizon={cfg.horizon}", "use a shorter length or horizon")
    return Read(items, rule, [p], [], {"length": cfg.length, "stride": stride, "horizon": cfg.horizon,
                                       "columns": [s.meta.get("column") for s in series]})


def _check_cells(path: Path, header: Sequence[str], rows: Sequence[Sequence[str]], cfg: PrepareConfig) -> None:
    """NaN in a value column fails naming file, row and column (unless fill=interpolate)."""
    if cfg.fill == "interpolate":
        return
    wanted = {t.strip() for t in cfg.target.split(",")}
    cols = [i for i, h in enumerate(header) if i > 0 and (cfg.source == "saugeen" or cfg.target == "all" or h in wanted)]
    for r, row in enumerate(rows, start=2):
        for i in cols:
            cell = row[i].strip().lower()
            if cell in ("", "nan", "na", "n/a", "null", "none") or cell in ("inf", "-inf"):
                raise DataError(f"{path}:row {r}, column {header[i]}", row[i], "missing or non-finite value",
                                "fill the cell, or set fill=interpolate to interpolate and record the gap")


READERS = {
    "tsfragment": lambda cfg: _read_list_csv(cfg, "OT", "Text", None),
    "bedtime": lambda cfg: _read_list_csv(cfg, "series", "annotations", "idx"),
    "cats-bench": read_cats_bench,
    "jsonl": read_jsonl,
    "ett": read_forecasting,
    "electricity": read_forecasting,
    "saugeen": read_forecasting,
}

