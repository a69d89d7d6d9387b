"""The prepared folder on disk: ``{train,val,test}.parquet`` (one row per item), ``candidates.jsonl`` (the
one candidate-file format) and ``manifest.json``; writing the split files and reading a whole folder back
(``load_prepared``, what training, ``caption`` and ``eval identify`` call)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from captionrl.domains.candidates import CandidateSet, load_candidate_file
from captionrl.domains.prepare.settings import SPLITS
from captionrl.errors import DataError
from captionrl.types import Series

FORMAT = "captionrl-prepared/1"


def file_entry(path: Path, root: Path | None = None) -> dict[str, Any]:
    """A manifest line for one input file: its path (relative to the copy's root), size and SHA-256, so a
    prepared folder says exactly which copy it came from."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    name = str(path.relative_to(root)) if root and path.is_relative_to(root) else path.name
    return {"path": name, "bytes": path.stat().st_size, "sha256": h.hexdigest()}


def write_parquet(path: Path, items: Sequence[Series], sets: Mapping[str, CandidateSet]) -> None:
    """One split's items with their lineups as a Parquet table (explicit schema, so an empty split still
    has every column)."""
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
