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

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from captionrl.domains.candidates import CandidateSet, mine_candidates, save_candidates
from captionrl.domains.prepare.folder import FORMAT, Prepared, file_entry, load_prepared, write_parquet
from captionrl.domains.prepare.layouts import READERS, Read
from captionrl.domains.prepare.settings import FORECASTING, SOURCES, SPLITS, WHERE_TO_GET, PrepareConfig
from captionrl.errors import ConfigError, DataError
from captionrl.records import write_json
from captionrl.types import Series

__all__ = ["CONFIG", "FORMAT", "PrepareConfig", "Prepared", "allocate", "load_prepared", "prepare", "resample",
           "run_command"]

CONFIG = PrepareConfig

logger = logging.getLogger(__name__)


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
        write_parquet(out / f"{split}.parquet", chosen[split], per_set)
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



def run_command(cfg: PrepareConfig) -> int:
    """Prepare, then print one line per split; what was skipped is logged as warnings."""
    m = prepare(cfg)
    c = m["counts"]
    print(f"prepared {cfg.source} -> {cfg.out}: " + ", ".join(f"{s} {c[s]['prepared']}" for s in SPLITS)
          + f"; lengths {m['lengths']['min']}-{m['lengths']['max']} ({m['lengths']['rule']}); K={cfg.k}, {cfg.rule}")
    for s in m["skipped"]:
        logger.warning(f"  skipped {s.get('split', '') + ': ' if s.get('split') else ''}{s['what']}: {s['why']}")
    return 0
