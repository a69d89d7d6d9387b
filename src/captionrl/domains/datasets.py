"""Corpus -> time-ordered split windows: the one recipe training, captioning and evaluation share.

Each source series is split in time (train/val/test by fraction, or ETT's 12/4/4 months) and windowed
inside each split, so no window or forecasting target crosses a boundary. ``sample`` takes a seeded
subset so CPU runs stay small and reruns see the same items.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from captionrl.errors import ConfigError, DataError
from captionrl.types import Series

SPLITS = ("train", "val", "test")


def split_windows(
    corpus: str | Sequence[Series],
    length: int,
    *,
    stride: int | None = None,
    next_length: int = 0,
    fractions: Sequence[float] = (0.7, 0.1, 0.2),
) -> dict[str, list[Series]]:
    """``{"train": [...], "val": [...], "test": [...]}`` windows of ``length`` values from a corpus."""
    from captionrl.domains.corpora import load_corpus
    from captionrl.domains.timeseries import split_by_fraction, window_splits

    series = load_corpus(corpus) if isinstance(corpus, str) else list(corpus)
    segments = [split_by_fraction(s, fractions) for s in series]
    out = window_splits(segments, length, stride, next_length=next_length)
    result = {name: out.get(name, []) for name in SPLITS}
    if not result["train"] or not result["test"]:
        raise DataError("length", length, f"gives {len(result['train'])} train and {len(result['test'])} test windows",
                        "use a shorter window length (or a stride smaller than the length)")
    return result


def sample(items: Sequence[Series], n: int | None, seed: int) -> list[Series]:
    """A seeded subset of ``n`` items in their original order (all items when ``n`` is None or larger)."""
    if n is None or n >= len(items):
        return list(items)
    if n < 1:
        raise ConfigError("limit", n, "must be >= 1", "use a positive number of items")
    idx = np.sort(np.random.default_rng(seed).choice(len(items), size=n, replace=False))
    return [items[i] for i in idx]


def eval_windows(corpus: str, length: int, split: str = "test", limit: int | None = 32, seed: int = 0,
                 next_length: int = 0) -> list[Series]:
    """A seeded sample of one split's windows (the items an evaluation captions and judges)."""
    if split not in SPLITS:
        raise ConfigError("split", split, "unknown split", "use train, val or test")
    return sample(split_windows(corpus, length, next_length=next_length)[split], limit, seed)
