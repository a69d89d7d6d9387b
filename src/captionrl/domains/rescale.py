"""Windows shown at another level and spread, and mirrored upside down for half of them.

The embedded corpus's levels say which series a window comes from (co2 near 316, ...) and so its likely
direction. A captioner taught on windows as they are can say the direction from the level; shown rescaled,
only the values' order says it. One affine map per window, drawn from (seed, window id) alone, so the warm
start (``warm_start.rescale_share``) and RL's lineups (``data.rl_rescale_share``) show a window the same way
whatever the order of the rows: standardised by the true window's mean and spread, mirrored about its
midrange for half of the windows (their direction then the opposite), then spread by 0.05-20 around a level
within three spreads of 0, plus 1-1000 for half of them. A lineup gets its true window's map on every
candidate, so every candidate keeps its place relative to the others: the answer, the pinned endpoints and
what tells the true window apart stay, only the numbers change.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def draw_key(item_id: str, seed: int, purpose: str) -> int:
    """A 32-bit key from (seed, id, purpose) alone: a resumed or repeated run draws the same whatever the
    order of its rows."""
    return zlib.crc32(f"{seed}:{item_id}:{purpose}".encode())


def draw(item_id: str, seed: int, purpose: str) -> float:
    """A number in [0, 1) from (seed, id, purpose) alone (``draw_key``)."""
    return draw_key(item_id, seed, purpose) / 2**32


def rescaled(item_id: str, seed: int, share: float) -> bool:
    """Whether window ``item_id`` is shown rescaled at ``share``: the same windows for the warm start and RL
    at equal shares, and every window shown rescaled at a lower share also is at a higher one."""
    return draw(item_id, seed, "rescale") < share


def rescale_candidates(candidates: Sequence[Sequence[float]], item_id: str, seed: int,
                       precision: int, purpose: str = "rescale") -> tuple[list[list[float]], list[str]]:
    """Every candidate under the first one's map (module doc): (the values as printed at ``precision``, the
    printed texts), one per candidate. ``purpose`` keys the map's draw: ``rescale`` is the map RL's lineups
    show; a warm start that draws a map per pass uses ``rescale:<pass>``, none of which is RL's."""
    from captionrl.domains.timeseries import render_numbers

    rng = np.random.default_rng(draw_key(item_id, seed, purpose))
    rows = [np.asarray(c, dtype=float) for c in candidates]
    v = rows[0]
    if rng.random() < 0.5:
        top, bottom = v.max(), v.min()
        rows = [top + bottom - c for c in rows]
        v = rows[0]
    mean, sd = v.mean(), float(v.std())
    spread = 10 ** rng.uniform(-1.3, 1.3)
    level = spread * rng.uniform(-3.0, 3.0) + (10 ** rng.uniform(0.0, 3.0) if rng.random() < 0.5 else 0.0)
    values, texts = [], []
    for c in rows:
        z = (c - mean) / sd if sd > 0 else np.zeros_like(c)
        text, _ = render_numbers(level + spread * z, precision=precision)
        values.append([float(x) for x in text.split(", ")])
        texts.append(text)
    return values, texts


def rescaled_values(values: Sequence[float], item_id: str, seed: int, precision: int,
                    purpose: str = "rescale") -> tuple[list[float], str]:
    """``values`` under their own map (module doc; ``purpose`` as in ``rescale_candidates``): (the values as
    printed at ``precision``, the printed text the prompt shows). The direction rule reads the trend in
    standard deviations and the sign of end minus start, so it is unchanged by the rescaling and reversed by
    the mirror."""
    out, texts = rescale_candidates([values], item_id, seed, precision, purpose)
    return out[0], texts[0]


def printed_values(row: Mapping[str, Any]) -> list[float]:
    """The values the captioner reads for a row (its printed series: rounded, normalised as printed)."""
    return [float(x) for x in str(row["series_text"]).split(",")]


def prompt_with_series(row: Mapping[str, Any], new_text: str) -> list[dict[str, Any]]:
    """The row's prompt with its printed series replaced by ``new_text`` (every other word the same)."""
    text = str(row["series_text"])
    messages = [dict(m) for m in row["prompt"]]
    hits = [m for m in messages if isinstance(m.get("content"), str) and text in m["content"]]
    if len(hits) != 1:
        raise ValueError(f"row {row.get('item_id')}: the printed series is in {len(hits)} prompt messages, not 1")
    hits[0]["content"] = hits[0]["content"].replace(text, new_text)
    return messages


def rescaled_lineup_rows(rows: Sequence[Mapping[str, Any]], share: float, seed: int,
                         precision: int) -> list[dict[str, Any]]:
    """LineupRL rows with a share ``share`` of them (``rescaled``) shown under their true window's map: the
    prompt's series, ``series``, ``series_text`` and every candidate; ids and every other column as they were.
    The true window's printed values are the ones the warm start shows for it at the same seed."""
    out = []
    for r in rows:
        if not rescaled(str(r["item_id"]), seed, share):
            out.append(dict(r))
            continue
        shown = [printed_values(r), *list(r["candidates"])[1:]]
        values, texts = rescale_candidates(shown, str(r["item_id"]), seed, precision)
        out.append({**r, "prompt": prompt_with_series(r, texts[0]), "series": values[0], "series_text": texts[0],
                    "candidates": values})
    return out
