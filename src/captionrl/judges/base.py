"""The judge protocol: one code path for training rewards and evaluation metrics.

A judge scores captions given the dataset columns of their items, in exactly the shape TRL hands to a
reward function (every column a list aligned with the captions). ``captionrl.rewards`` turns any judge
into a TRL reward callable; evaluation protocols call the same judge on stored captions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from captionrl.errors import DataError
from captionrl.types import Judgment

Columns = Mapping[str, Sequence[Any]]


@runtime_checkable
class Judge(Protocol):
    """Scores captions; ``None`` scores mean unscored (the sample is skipped, never counted as 0)."""

    name: str

    def judge(self, captions: Sequence[str], columns: Columns) -> list[Judgment]: ...


def require_columns(columns: Columns, names: Sequence[str], n: int, judge: str) -> None:
    """Fail clearly when a judge's dataset columns are missing or misaligned with the captions."""
    for name in names:
        if name not in columns:
            raise DataError(
                f"columns.{name}", sorted(columns), f"judge {judge!r} needs column {name!r}",
                f"add a {name!r} column to the dataset (or the captions file)",
            )
        if len(columns[name]) != n:
            raise DataError(
                f"columns.{name}", len(columns[name]), f"has {len(columns[name])} rows for {n} captions",
                "pass one row per caption",
            )


def unscored(error: str, **extra: Any) -> Judgment:
    """A judgment that could not be made (backend failure, unparseable reply)."""
    return Judgment(score=None, error=error, extra=extra)


def backend_error(backend: Any, default: str) -> str:
    """The cause of the backend's last failed ``loglikelihood`` call (``last_errors`` of the openai and vllm
    backends, ``last_error`` of hf), so an unscored judgment says "connection error ..." rather than only
    that it failed: the engines' failure policy (``serve.failure``) retries an outage, not a bad reply."""
    errors = [e for e in (getattr(backend, "last_errors", None) or []) if e]
    return getattr(backend, "last_error", None) or (errors[0] if errors else default)

