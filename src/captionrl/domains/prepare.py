"""``captionrl data prepare``: a benchmark's local copy -> one prepared dataset folder (Parquet + manifest).

Training (``data.prepared``), ``captionrl caption`` and ``captionrl eval identify`` read the folder, so every
stage sees the same items, splits and lineups. What it does, and the rules it states in ``manifest.json``:

- **Reads only the user's local copy** (nothing downloads: ``download: true`` fails saying what to fetch).
  Each layout is checked before anything else: wrong or missing columns, NaN, an empty split and a file of
  another benchmark's layout fail with the file, row and fix named (``DataError``), before any model loads.
- **Splits**: the benchmark's own where it has one (CaTS-Bench ``train/`` and ``test/`` folders, with a
  seeded ``val_fraction`` of train held out for checkpoint selection; ETT's 12/4/4 months via
  ``split_ett``; files named ``*train*``/``*val*``/``*test*`` in a folder; a JSONL ``split`` field).
  Otherwise a stated split: time-ordered fractions for a long series (Electricity, Saugeen), seeded item
  fractions for a collection of short captioned series (BEDTime, TSFragment, JSONL).
- **Forecasting corpora** (ETT, Electricity, Saugeen) are cut into windows of ``length`` values inside
  each split, each with its ``next`` target of ``horizon`` values (never crossing a split boundary).
- **Variable lengths** (BEDTime, CaTS-Bench, TSFragment, JSONL): ``lengths: bucket`` (default) keeps every
  series as it is and mines each lineup inside one exact-length bucket, as the paper's "pool of other real
  series of the same length"; buckets with fewer than K items are skipped and recorded. ``lengths:
  resample`` maps every series to ``length`` values by linear interpolation (all items usable; the values
  the verifier reads are then interpolated, and ``orig_length`` keeps the original length).
- **Counts**: ``n_train``/``n_val``/``n_test`` (null = all) are exact: asking for more than exist is an
  error naming both numbers. Samples are seeded and stratified by length bucket.
- **Lineups**: the existing miner (``mine_candidates``: nearest by summary statistics with an overlap limit,
  or random as the ablation) within each split and length bucket, written in the one candidate-file format
  (``candidates.jsonl``, ``domains.candidates.save_candidates``).

Folder: ``manifest.json``, ``{train,val,test}.parquet`` (one row per item: ``id, series, length,
orig_length, split, source, start, domain, captions, next, distractor_ids, distances, meta``; readable by
``datasets.load_dataset("parquet", ...)`` or pandas), ``candidates.jsonl``.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from captionrl.config import help_field
from captionrl.domains.candidates import (
    RULES,
    CandidateSet,
    load_candidate_file,
    mine_candidates,
    save_candidates,
)
from captionrl.domains.timeseries import (
    DEFAULT_STATS,
    STATS,
    make_series,
    split_by_fraction,
    split_ett,
    window,
)
from captionrl.errors import ConfigError, DataError
from captionrl.records import write_json
from captionrl.types import Series

SPLITS = ("train", "val", "test")
FORMAT = "captionrl-prepared/1"
SOURCES = ("tsfragment", "bedtime", "cats-bench", "ett", "electricity", "saugeen", "jsonl")
FORECASTING = ("ett", "electricity", "saugeen")
LENGTH_RULES = ("bucket", "resample")
ETT_COLUMNS = ("date", "HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT")
WHERE_TO_GET = {
    "tsfragment": "the TSFragment-600K CSV files (columns Text, OT) from the authors' release",
    "bedtime": "the BEDTime CSV files (columns idx, series, annotations) from the BEDTime release",
    "cats-bench": "the CaTS-Bench folder (train/ and test/, each with 'time series' and gt_captions)",
    "ett": "ETTh1.csv, ETTh2.csv, ETTm1.csv or ETTm2.csv from github.com/zhouhaoyi/ETDataset",
    "electricity": "electricity.csv of the LTSF benchmark (Autoformer/LTSF-Linear dataset archive)",
    "saugeen": "the Saugeen River daily flow CSV (columns Date, saugeenRiverflows)",
    "jsonl": "a JSONL file of {id, series, caption?, next?, split?} lines (your own data)",
}


@dataclass
class PrepareConfig:
    """Settings of ``captionrl data prepare`` (all of them are saved in manifest.json)."""

    source: str = help_field("", f"benchmark layout of the input: {', '.join(SOURCES)}")
    path: str = help_field("", "your local copy: a file, or a folder (CaTS-Bench root; a folder of CSVs named *train*/*val*/*test*)")
    out: str = help_field("", "output folder of the prepared dataset (must be new or empty, unless overwrite)")
    download: bool = help_field(False, "not supported (machines may be offline): the error says what to fetch by hand")
    target: str = help_field("OT", "column of a wide CSV to use (ETT, Electricity): a name, or 'all' for every column")
    freq: str | None = help_field(None, "ETT only: 'h' (hourly) or '15min'; null = from the file name (ETTh*, ETTm*)")
    length: int = help_field(64, "window length of forecasting corpora; the target length of lengths=resample")
    stride: int | None = help_field(None, "step between forecasting windows (null = length, no overlap)")
    horizon: int = help_field(16, "values of the 'next' forecasting target after each window (0 = none)")
    lengths: str = help_field("bucket", "variable-length series: bucket (lineups within one exact length; buckets with < k items skipped) or resample (linear interpolation to length)")
    min_length: int = help_field(4, "series shorter than this are skipped (recorded in the manifest)")
    splits: list[float] = help_field([0.7, 0.1, 0.2], "train/val/test fractions where the benchmark has no split of its own (time-ordered for a long series, seeded by item for a collection)")
    val_fraction: float = help_field(0.1, "share of a benchmark's train split held out as val when it has none (CaTS-Bench, train/test files); seeded")
    n_train: int | None = help_field(None, "train items to keep (null = all; more than exist is an error)")
    n_val: int | None = help_field(None, "val items to keep (null = all; 0 = none)")
    n_test: int | None = help_field(None, "test items to keep (null = all; 0 = none)")
    k: int = help_field(4, "candidates per lineup (the item and k-1 distractors); smaller K are prefixes")
    rule: str = help_field("nearest", "distractor rule: nearest (summary statistics, the paper's) or random (ablation)")
    max_overlap: float = help_field(0.0, "largest fraction of time steps a same-source distractor may share with the item")
    stats: list[str] = help_field(list(DEFAULT_STATS), f"summary statistics of the nearest rule, from: {', '.join(STATS)}")
    mutual: bool = help_field(True, "apply the overlap limit among distractors too")
    fill: str = help_field("error", "missing values: error (named by file and row), or interpolate and record the gaps")
    seed: int = help_field(0, "seed of item splits, samples and distractor mining")
    overwrite: bool = help_field(False, "replace an existing prepared folder at out")
    quiet: bool = help_field(False, "no progress bar")

    def __post_init__(self) -> None:
        if self.source and self.source not in SOURCES:
            from captionrl.registry import suggest

            raise ConfigError("source", self.source, "unknown benchmark layout", suggest(self.source, list(SOURCES)))
        if self.lengths not in LENGTH_RULES:
            raise ConfigError("lengths", self.lengths, "unknown length rule", "use bucket or resample")
        if self.rule not in RULES:
            raise ConfigError("rule", self.rule, "unknown distractor rule", f"use one of {', '.join(RULES)}")
        if self.fill not in ("error", "interpolate"):
            raise ConfigError("fill", self.fill, "unknown policy", "use error or interpolate")
        if self.length < 2 or self.horizon < 0 or self.min_length < 2:
            raise ConfigError("length/horizon/min_length", (self.length, self.horizon, self.min_length),
                              "need length >= 2, horizon >= 0, min_length >= 2", "use e.g. length=64 horizon=16")
        if self.k < 2:
            raise ConfigError("k", self.k, "needs at least 2 candidates", "use k=4")
        if len(self.splits) != 3 or min(self.splits) < 0 or abs(sum(self.splits) - 1) > 1e-6:
            raise ConfigError("splits", self.splits, "need three non-negative fractions summing to 1", "use [0.7, 0.1, 0.2]")
        if not 0 <= self.val_fraction < 1:
            raise ConfigError("val_fraction", self.val_fraction, "must be in [0, 1)", "use 0.1 (or 0: no val split)")
        for name in ("n_train", "n_val", "n_test"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ConfigError(name, v, "must be >= 0 or null (all)", f"set {name}=null")
        if isinstance(self.stats, str):
            self.stats = [x.strip() for x in self.stats.split(",") if x.strip()]

    def wanted(self) -> dict[str, int | None]:
        return {"train": self.n_train, "val": self.n_val, "test": self.n_test}


CONFIG = PrepareConfig


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


# ------------------------------------------------------------------------------------ lengths, counts
def resample(s: Series, length: int) -> Series:
    """``s`` linearly interpolated onto ``length`` evenly spaced points (the ends are kept exactly)."""
    x = np.linspace(0.0, len(s) - 1.0, length)
    values = np.interp(x, np.arange(len(s)), s.values)
    return Series(id=s.id, values=values, source=s.source, start=0, domain=s.domain, split=s.split,
                  meta={**s.meta, "orig_length": len(s)})


def allocate(sizes: Mapping[int, int], n: int, k: int) -> dict[int, int]:
    """Exactly ``n`` items over length buckets, proportional to their sizes, no bucket below ``k`` (or 0).

    Largest-remainder allocation; a bucket that would get fewer than k gives its share to the largest
    buckets that can take more. Raises when n cannot be placed (every usable bucket is full).
    """
    total = sum(sizes.values())
    raw = {b: n * c / total for b, c in sizes.items()}
    alloc = {b: int(np.floor(v)) for b, v in raw.items()}
    for b in sorted(raw, key=lambda b: (-(raw[b] - alloc[b]), -sizes[b], b))[: n - sum(alloc.values())]:
        alloc[b] += 1
    while True:
        small = [b for b, a in alloc.items() if 0 < a < k]
        if not small:
            break
        b0 = min(small, key=lambda b: (alloc[b], sizes[b], b))
        free, alloc[b0] = alloc[b0], 0
        for b in sorted(alloc, key=lambda b: (-alloc[b], -sizes[b], b)):
            if free == 0:
                break
            if alloc[b] == 0 and free < k:
                continue
            take = min(free, sizes[b] - alloc[b])
            alloc[b] += take
            free -= take
        if free:
            raise DataError("lengths", dict(sizes), f"cannot place {n} items in buckets of at least k={k}",
                            "ask for fewer items, or use lengths=resample")
    return alloc


def _select(split: str, items: list[Series], n: int | None, cfg: PrepareConfig,
            skipped: list[dict[str, Any]]) -> tuple[list[Series], dict[str, Any]]:
    """Eligible items (bucket rule), then exactly ``n`` of them (seeded, stratified by length)."""
    buckets: dict[int, list[Series]] = {}
    for s in items:
        buckets.setdefault(len(s), []).append(s)
    small = {b: len(v) for b, v in buckets.items() if len(v) < cfg.k}
    if small:
        skipped.append({"split": split, "what": f"{sum(small.values())} series in {len(small)} length bucket(s)",
                        "why": f"a bucket holds fewer than k={cfg.k} series of one length (lengths=bucket)",
                        "lengths": dict(sorted(small.items()))})
    usable = {b: v for b, v in buckets.items() if b not in small}
    eligible = sum(len(v) for v in usable.values())
    info = {"read": len(items), "eligible": eligible, "requested": n}
    if n is None:
        return [s for v in usable.values() for s in v], info
    if n > eligible:
        why = f" ({len(items) - eligible} skipped: length buckets with fewer than k={cfg.k})" if eligible < len(items) else ""
        raise DataError(f"n_{split}", n, f"asks for {n} {split} items but only {eligible} exist{why}",
                        f"set n_{split}={eligible} or less (or null for all)")
    if n == 0:
        return [], info
    if n < cfg.k:
        raise DataError(f"n_{split}", n, f"too few items for K={cfg.k}: a lineup needs k series of the split",
                        f"set n_{split} >= {cfg.k}, or lower k")
    alloc = allocate({b: len(v) for b, v in usable.items()}, n, cfg.k)
    rng = np.random.default_rng([cfg.seed, SPLITS.index(split), 3])
    out = []
    for b in sorted(usable):
        if alloc[b]:
            idx = sorted(rng.choice(len(usable[b]), size=alloc[b], replace=False).tolist())
            out.extend(usable[b][j] for j in idx)
    return out, info


def _mine(split: str, items: list[Series], cfg: PrepareConfig) -> list[CandidateSet]:
    buckets: dict[int, list[Series]] = {}
    for s in items:
        buckets.setdefault(len(s), []).append(s)
    out: list[CandidateSet] = []
    for length in sorted(buckets):
        group = buckets[length]
        try:
            out.extend(mine_candidates(group, group, k=cfg.k, rule=cfg.rule, seed=cfg.seed, max_overlap=cfg.max_overlap,
                                       stats=cfg.stats, mutual=cfg.mutual, progress=not cfg.quiet))
        except DataError as exc:
            raise DataError(f"{split} split, length {length}: {exc.field}", exc.value, exc.problem,
                            exc.fix.replace("--", "")) from None
    return out


# ------------------------------------------------------------------------------------------ the command
def file_entry(path: Path, root: Path | None = None) -> dict[str, Any]:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    name = str(path.relative_to(root)) if root and path.is_relative_to(root) else path.name
    return {"path": name, "bytes": path.stat().st_size, "sha256": h.hexdigest()}


def prepare(cfg: PrepareConfig) -> dict[str, Any]:
    """Read, split, window or bucket, sample, mine and write; returns the manifest (also in out/)."""
    if cfg.download:
        raise ConfigError("download", True, "captionrl downloads nothing (these machines may be offline)",
                          f"fetch {WHERE_TO_GET.get(cfg.source, 'the benchmark')} by hand, then pass path=...")
    if not cfg.source:
        raise ConfigError("source", "", "is required", f"set source to one of {', '.join(SOURCES)}")
    if not cfg.path:
        raise ConfigError("path", "", "is required", f"point at your local copy of {WHERE_TO_GET[cfg.source]}")
    if not cfg.out:
        raise ConfigError("out", "", "is required", "give an output folder, e.g. out=data/tsfragment-prepared")
    out = Path(cfg.out)
    ours = {"manifest.json", "candidates.jsonl", *(f"{s}.parquet" for s in SPLITS)}
    if out.exists() and any(out.iterdir()):
        if not cfg.overwrite:
            raise ConfigError("out", str(out), "exists and is not empty", "choose a new folder, or set overwrite=true")
        foreign = sorted(f.name for f in out.iterdir() if f.name not in ours)
        if foreign:
            raise ConfigError("out", str(out), f"holds files a prepared folder does not ({foreign[:5]}); overwrite "
                              "replaces prepared folders only", "choose a new folder")
    read = READERS[cfg.source](cfg)
    _unique_ids(read.items)
    skipped = list(read.skipped)
    if cfg.lengths == "resample" and cfg.source not in FORECASTING:
        read.items = {k: [resample(s, cfg.length) for s in v] for k, v in read.items.items()}
    counts: dict[str, Any] = {}
    chosen: dict[str, list[Series]] = {}
    for split in SPLITS:
        n = cfg.wanted()[split]
        found = read.items.get(split, [])
        if not found and n != 0:
            raise DataError(f"{cfg.path} ({split} split)", 0, f"empty split: no {split} items were read",
                            f"check the {split} files of the copy, or set n_{split}=0 to prepare without it")
        chosen[split], counts[split] = _select(split, found, n, cfg, skipped)
        if n != 0 and found and not chosen[split]:
            raise DataError(f"{split} split", len(chosen[split]), f"too few items for K={cfg.k} "
                            f"({len(found)} read, {len(chosen[split])} usable)",
                            "lower k, use lengths=resample, or add data")
    sets: list[CandidateSet] = []
    for split in SPLITS:
        sets.extend(_mine(split, chosen[split], cfg))
    by_id = {s.id: s for v in chosen.values() for s in v}
    if out.exists() and cfg.overwrite:
        for f in out.iterdir():
            if f.name in ours:
                f.unlink()
    out.mkdir(parents=True, exist_ok=True)
    save_candidates(sets, out / "candidates.jsonl", by_id)
    per_set = {cs.item_id: cs for cs in sets}
    for split in SPLITS:
        _write_parquet(out / f"{split}.parquet", chosen[split], per_set)
        counts[split]["prepared"] = len(chosen[split])
    manifest = _manifest(cfg, read, chosen, counts, skipped, out)
    write_json(out / "manifest.json", manifest)
    return manifest


def _unique_ids(items: Mapping[str, list[Series]]) -> None:
    """Lineups and caption files key items by id: two rows with one id (a repeated ``idx``) fail here."""
    seen: dict[str, Series] = {}
    for s in (s for v in items.values() for s in v):
        if s.id in seen:
            first = seen[s.id]
            where = [f"{x.meta.get('file', '?')}:row {x.meta['row']}" if "row" in x.meta else x.meta.get("file", "?")
                     for x in (first, s)]
            raise DataError("id", s.id, f"is used twice ({where[0]} and {where[1]})",
                            "give every row or line a unique id (idx / id)")
        seen[s.id] = s


def _lengths(cfg: PrepareConfig, read: Read, chosen: Mapping[str, list[Series]]) -> dict[str, Any]:
    all_items = [s for v in chosen.values() for s in v]
    lens = [len(s) for s in all_items] or [0]
    if read.windows is not None:
        rule = f"fixed windows of length={cfg.length} (forecasting corpus; 'next' holds horizon={cfg.horizon} values)"
    elif cfg.lengths == "resample":
        rule = f"resample: every series linearly interpolated to length={cfg.length} (orig_length keeps the original)"
    else:
        rule = "bucket: series kept as they are; each lineup within one exact length; buckets with fewer than k skipped"
    orig = [int(s.meta.get("orig_length", len(s))) for s in all_items] or [0]
    return {"rule": cfg.lengths if read.windows is None else "window", "description": rule,
            "min": min(lens), "max": max(lens), "original_min": min(orig), "original_max": max(orig),
            "per_split": {k: {"min": min((len(s) for s in v), default=0), "max": max((len(s) for s in v), default=0),
                              "buckets": len({len(s) for s in v})} for k, v in chosen.items()}}


def _manifest(cfg: PrepareConfig, read: Read, chosen: Mapping[str, list[Series]], counts: dict[str, Any],
              skipped: list[dict[str, Any]], out: Path) -> dict[str, Any]:
    from dataclasses import asdict

    from captionrl import __version__

    root = Path(cfg.path) if Path(cfg.path).is_dir() else None
    return {
        "format": FORMAT,
        "captionrl_version": __version__,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "source": {"benchmark": cfg.source, "path": str(Path(cfg.path).resolve()), "target": cfg.target
                   if cfg.source in ("ett", "electricity") else None},
        "files_read": [file_entry(p, root) for p in read.files],
        "splits": {**read.split_rule, "names": list(SPLITS)},
        "windows": read.windows,
        "lengths": _lengths(cfg, read, chosen),
        "counts": counts,
        "candidates": {"file": "candidates.jsonl", "k": cfg.k, "rule": cfg.rule, "max_overlap": cfg.max_overlap,
                       "mutual": cfg.mutual, "stats": list(cfg.stats), "seed": cfg.seed,
                       "scope": "distractors from the item's own split and length bucket"},
        "seed": cfg.seed,
        "filled_values": {k: {"items": sum(1 for s in v if s.meta.get("filled")),
                              "values": sum(int(s.meta.get("filled", 0)) for s in v)} for k, v in chosen.items()},
        "fill": cfg.fill,
        "skipped": skipped,
        "files": {s: f"{s}.parquet" for s in SPLITS},
        "columns": ["id", "series", "length", "orig_length", "split", "source", "start", "domain", "captions",
                    "next", "distractor_ids", "distances", "meta"],
        "config": asdict(cfg),
    }


def _write_parquet(path: Path, items: Sequence[Series], sets: Mapping[str, CandidateSet]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    keep = ("captions", "next", "orig_length", "dates")  # own columns, or too long to repeat per window
    rows = {
        "id": [s.id for s in items],
        "series": [s.values.tolist() for s in items],
        "length": [len(s) for s in items],
        "orig_length": [int(s.meta.get("orig_length", len(s))) for s in items],
        "split": [s.split for s in items],
        "source": [s.source for s in items],
        "start": [int(s.start) for s in items],
        "domain": [s.domain for s in items],
        "captions": [[str(c) for c in s.meta.get("captions", [])] for s in items],
        "next": [list(map(float, s.meta["next"])) if s.meta.get("next") is not None else None for s in items],
        "distractor_ids": [list(sets[s.id].distractor_ids) for s in items],
        "distances": [list(sets[s.id].distances) for s in items],
        "meta": [json.dumps({k: v for k, v in s.meta.items() if k not in keep}, default=str) for s in items],
    }
    schema = pa.schema([("id", pa.string()), ("series", pa.list_(pa.float64())), ("length", pa.int64()),
                        ("orig_length", pa.int64()), ("split", pa.string()), ("source", pa.string()),
                        ("start", pa.int64()), ("domain", pa.string()), ("captions", pa.list_(pa.string())),
                        ("next", pa.list_(pa.float64())), ("distractor_ids", pa.list_(pa.string())),
                        ("distances", pa.list_(pa.float64())), ("meta", pa.string())])
    pq.write_table(pa.table(rows, schema=schema), path)


# ------------------------------------------------------------------------------------------ reading
@dataclass
class Prepared:
    """A prepared folder: its manifest, items per split (``meta`` holds captions and next) and lineups."""

    path: Path
    manifest: dict[str, Any]
    items: dict[str, list[Series]]
    sets: list[CandidateSet]

    @property
    def k(self) -> int:
        return int(self.manifest["candidates"]["k"])

    @property
    def pool(self) -> dict[str, Series]:
        return {s.id: s for v in self.items.values() for s in v}


def load_prepared(path: str | Path, field: str = "prepared") -> Prepared:
    """Read a folder written by ``captionrl data prepare``; a missing or foreign folder fails with the fix."""
    import pyarrow.parquet as pq

    p = Path(path)
    mpath = p / "manifest.json"
    if not mpath.is_file():
        raise DataError(field, str(p), "is not a prepared dataset (no manifest.json)",
                        "write it with `captionrl data prepare source=... path=... out=" + str(p) + "`")
    manifest = json.loads(mpath.read_text())
    if manifest.get("format") != FORMAT:
        raise DataError(f"{mpath}.format", manifest.get("format"), f"is not {FORMAT}", "prepare the data again")
    items: dict[str, list[Series]] = {}
    for split in SPLITS:
        fp = p / f"{split}.parquet"
        if not fp.is_file():
            raise DataError(field, str(fp), "missing", "prepare the data again (the folder is incomplete)")
        table = pq.read_table(fp).to_pylist()
        items[split] = []
        for r in table:
            meta = {**json.loads(r["meta"] or "{}"), "captions": list(r["captions"] or [])}
            if r["next"] is not None:
                meta["next"] = list(r["next"])
            if r["orig_length"] != r["length"]:
                meta["orig_length"] = r["orig_length"]
            items[split].append(Series(id=r["id"], values=np.asarray(r["series"], dtype=float), source=r["source"],
                                       start=int(r["start"]), domain=r["domain"], split=r["split"], meta=meta))
    sets, _ = load_candidate_file(p / "candidates.jsonl", field=f"{field}/candidates.jsonl")
    ids = {s.id for v in items.values() for s in v}
    missing = [cs.item_id for cs in sets if cs.item_id not in ids][:3]
    if missing or len(sets) != len(ids):
        raise DataError(field, str(p), f"candidates.jsonl and the split files disagree ({len(sets)} sets, {len(ids)} items)",
                        "prepare the data again")
    return Prepared(p, manifest, items, sets)


def run_command(cfg: PrepareConfig) -> int:
    """Prepare, then print one line per split and what was skipped."""
    m = prepare(cfg)
    c = m["counts"]
    print(f"prepared {cfg.source} -> {cfg.out}: " + ", ".join(f"{s} {c[s]['prepared']}" for s in SPLITS)
          + f"; lengths {m['lengths']['min']}-{m['lengths']['max']} ({m['lengths']['rule']}); K={cfg.k}, {cfg.rule}")
    for s in m["skipped"]:
        print(f"  skipped {s.get('split', '') + ': ' if s.get('split') else ''}{s['what']}: {s['why']}")
    return 0
