"""Per-sample JSONL records that make every run inspectable and resumable.

Each judgment (or caption, rubric, prediction) is one JSON line with a unique ``key``. A run given the same
output folder reads the keys already written and skips them, so an interrupted run completes only what
is missing. Lines are flushed and fsynced as they are written; a last line cut short by a kill is
ignored on resume (and rewritten), never fatal.

Files a user gives (captions, labels, candidate sets, rubric stores, SFT records) are read strictly by
the same reader: a line that does not parse anywhere is a ``DataError`` naming file, line and fix, never
a silently smaller data set.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np

from captionrl.errors import DataError

logger = logging.getLogger(__name__)



def check_caption(value: Any, where: str, example: str = "The series rises.", allow_none: bool = False) -> str:
    """A caption read from a user's file is text (with ``allow_none``, ``None`` reads as the empty caption);
    anything else is a ``DataError`` naming ``where`` (file, line and field), the value and the fix."""
    if value is None and allow_none:
        return ""
    if not isinstance(value, str):
        raise DataError(where, value, "is not text",
                        f'write the caption in quotes, e.g. "caption": "{example}" ("" for an empty caption)')
    return value


def check_id(value: Any, where: str, key: str = "id") -> str | int:
    """An id read from a user's file is a string or an integer (a list, an object or a boolean is refused)."""
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise DataError(where, value, "is not a string or an integer", f'write the {key} as text, e.g. "{key}": "item-1"')
    return value


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


def read_jsonl(path: str | Path, *, appended: bool = False, unique_key: str | None = None) -> Iterator[dict[str, Any]]:
    """Yield the JSON objects of ``path``, one per line, and refuse anything else with a named error.

    Strict by default, because a dropped line silently shrinks an evaluation or a training set: a missing
    file, a line that is not a JSON object, or bytes that are not UTF-8 raise :class:`DataError` naming the
    file, the line number and the fix. Blank lines are allowed. ``appended=True`` is for files this project
    appends to itself (``RecordWriter``): a missing file reads as empty, and a last line cut short by a
    killed writer (no final newline, does not parse) is skipped with one warning; a bad line anywhere
    else is still an error. ``unique_key`` (e.g. ``"id"``) makes a repeated value of that field an error
    naming both line numbers (which of the two would be judged?).
    """
    p = Path(path)
    if appended and not p.exists():
        return iter(())
    if not p.is_file():
        problem = "is a folder, not a file" if p.is_dir() else "does not exist"
        raise DataError("file", str(p), problem, "give the path of an existing JSONL file (one JSON object per line)")
    try:
        fh = p.open("rb")
    except OSError as exc:
        raise DataError("file", str(p), f"cannot be read ({exc.strerror or exc})", "check its permissions") from exc
    return _iter_jsonl(p, fh, appended, unique_key)


def _iter_jsonl(p: Path, fh: IO[bytes], appended: bool, unique_key: str | None) -> Iterator[dict[str, Any]]:
    seen: dict[str, int] = {}
    fix = "write one JSON object per line (or delete this line); if a killed run left it, rerun that run to complete the file"
    with fh:
        for n, raw in enumerate(fh, 1):
            torn = not raw.endswith(b"\n")  # only the last line can lack its newline
            if n == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a byte-order mark some editors write
                raw = raw[3:]
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                if appended and torn:
                    _warn_torn(p, n)
                    return
                raise DataError(f"{p}:line {n}", raw[max(0, exc.start - 20): exc.start + 20], f"is not UTF-8 text (byte {raw[exc.start]:#04x} at column {exc.start + 1})",
                                "save the file as UTF-8") from None
            text = text.strip()
            if not text:
                continue
            try:
                rec = json.loads(text)
            except json.JSONDecodeError as exc:
                if appended and torn:
                    _warn_torn(p, n)
                    return
                raise DataError(f"{p}:line {n}", _short(text), f"is not valid JSON ({exc.msg} at column {exc.colno})", fix) from None
            if not isinstance(rec, dict):
                raise DataError(f"{p}:line {n}", _short(text), f"is a JSON {type(rec).__name__}, not an object", fix)
            if unique_key is not None and unique_key in rec:
                value = str(check_id(rec[unique_key], f"{p}:line {n}.{unique_key}", unique_key))
                if value in seen:
                    raise DataError(f"{p}:line {n}.{unique_key}", value, f"repeats the {unique_key} of line {seen[value]}",
                                    f"give every item one line: remove or rename one of lines {seen[value]} and {n}")
                seen[value] = n
            yield rec


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _warn_torn(p: Path, n: int) -> None:
    """Report (once per read) the torn last line a killed writer left; the resumed run rewrites it."""
    logger.warning(f"note: {p}:line {n}: ignoring the unfinished last line a killed run left (it is redone on resume)")


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
        for rec in read_jsonl(self.path, appended=True):
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


def digest(obj: Any) -> str:
    """A SHA-256 of ``obj`` as sorted JSON (what is not JSON is written with ``str``): a fingerprint of settings
    and records that is the same in every process and every run."""
    import hashlib

    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def write_json(path: str | Path, obj: Any) -> None:
    """Write a JSON summary atomically (write to a temporary file, then rename)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps(_clean(obj), default=_default, indent=2, ensure_ascii=False) + "\n")
    tmp.replace(p)


# ---------------------------------------------------------------------- training logs
Source = str | Path | Iterable[Mapping[str, Any]]


def load_metrics(source: Source) -> list[dict[str, Any]]:
    """Training log entries (those with a ``reward`` or a ``loss``) in step order.

    ``source`` is a ``metrics.jsonl``, a ``trainer_state.json`` (or a run folder holding one), or the
    entries themselves. A step logged twice (a resumed run re-logs the steps after its checkpoint) keeps
    its last entry; the trainer's closing summary (``train_loss``, ``train_runtime``) is not a step.
    """
    by_step: dict[int, dict[str, Any]] = {}
    for i, rec in enumerate(metric_entries(source)):
        if "reward" in rec or "loss" in rec:
            by_step[int(rec.get("step", i))] = rec
    return [by_step[s] for s in sorted(by_step)]


def metric_entries(source: Source) -> list[dict[str, Any]]:
    if not isinstance(source, (str, Path)):
        return [dict(r) for r in source if isinstance(r, Mapping)]
    path = Path(source)
    if path.is_dir():
        path = path / "trainer_state.json"
    if not path.is_file():
        raise DataError("metrics", str(source), "file not found",
                        "give a metrics.jsonl, a trainer_state.json, or a run folder that has one")
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        rows = data.get("log_history", []) if isinstance(data, dict) else data
        return [dict(r) for r in rows if isinstance(r, Mapping)]
    return list(read_jsonl(path, appended=True))  # our own log: a killed run may leave a torn last line
