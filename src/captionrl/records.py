"""Per-sample JSONL records that make every run inspectable and resumable.

Each judgment (or caption, rubric, prediction) is one JSON line with a unique ``key``. A run given the same
output folder reads the keys already written and skips them, so an interrupted run completes only what
is missing. Lines are flushed and fsynced as they are written; a last line cut short by a kill is
ignored on resume (and rewritten), never fatal.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "to_record"):
        return obj.to_record()
    if hasattr(obj, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(obj)
    return repr(obj)


def _clean(value: Any) -> Any:
    """JSON has no NaN: write unscored floats as null."""
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def dumps(record: dict[str, Any]) -> str:
    return json.dumps(_clean(record), default=_default, ensure_ascii=False)


def read_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    """Yield the complete JSON lines of ``path``; a truncated last line (killed writer) is skipped."""
    p = Path(path)
    if not p.exists():
        return
    with p.open(encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


class RecordWriter:
    """Append-only JSONL writer keyed by ``key``; knows which keys a previous run already wrote.

    >>> with RecordWriter(out / "judgments.jsonl") as w:  # doctest: +SKIP
    ...     for item in items:
    ...         if w.has(item.key):
    ...             continue
    ...         w.write({"key": item.key, ...})
    """

    def __init__(self, path: str | Path, key_field: str = "key") -> None:
        self.path = Path(path)
        self.key_field = key_field
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._records: dict[str, dict[str, Any]] = {}
        for rec in read_jsonl(self.path):
            if key_field in rec:
                self._records[str(rec[key_field])] = rec
        self._repair_tail()
        self._fh: IO[str] | None = None

    def _repair_tail(self) -> None:
        """Rewrite the file without a torn last line, so appended lines start on a fresh line."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            with self.path.open("w", encoding="utf-8") as f:
                for rec in self._records.values():
                    f.write(dumps(rec) + "\n")

    @property
    def done_keys(self) -> set[str]:
        return set(self._records)

    def has(self, key: str) -> bool:
        return str(key) in self._records

    def get(self, key: str) -> dict[str, Any] | None:
        return self._records.get(str(key))

    def records(self) -> list[dict[str, Any]]:
        return list(self._records.values())

    def write(self, record: dict[str, Any]) -> None:
        self.write_many([record])

    def write_many(self, records: Iterable[dict[str, Any]]) -> None:
        """Append many records with one flush and one fsync (a crash loses at most this batch)."""
        batch = list(records)
        for r in batch:
            if self.key_field not in r:
                raise KeyError(f"record has no {self.key_field!r} field: {sorted(r)}")
        if not batch:
            return
        if self._fh is None:
            self._fh = self.path.open("a", encoding="utf-8")
        self._fh.write("".join(dumps(r) + "\n" for r in batch))
        self._fh.flush()
        os.fsync(self._fh.fileno())
        for r in batch:
            self._records[str(r[self.key_field])] = r

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_json(path: str | Path, obj: Any) -> None:
    """Write a JSON summary atomically (write to a temporary file, then rename)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps(_clean(obj), default=_default, indent=2, ensure_ascii=False) + "\n")
    tmp.replace(p)
