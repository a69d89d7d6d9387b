"""Pinned lineups: distractors that share the true window's start, end and overall trend.

Nearest-neighbour distractors (``domains.candidates``) differ from the true window in their first and last
values, so a caption that names only where a series starts and ends already picks it out. A pinned
distractor keeps its own shape between those points but is laid on the true window's endpoint line:

    d' = line(x_0 -> x_n) + s * (d - line(d_0 -> d_n)),    s = std of x's residual / std of d's residual

so it starts and ends at the true window's printed values, rises or falls as much, and wiggles as much. What
tells the true window apart is what lies between: where the peaks and troughs fall and how high they reach,
the path from start to end. The lineup pays for describing that, which is what a captioner that names the
endpoints has left to learn. Values are rounded to the printed precision, so the verifier sees the same start
and end digits in every candidate.
"""

from __future__ import annotations

import numpy as np

from captionrl.types import Series


def endpoint_line(values: np.ndarray) -> np.ndarray:
    """The straight line from the first value to the last, one point per step."""
    return np.linspace(values[0], values[-1], len(values))


def pin_endpoints(item: Series, distractor: Series, precision: int) -> Series:
    """``distractor``'s shape on ``item``'s endpoint line, its wiggle scaled to ``item``'s (see module doc);
    id ``<distractor>~<item>``, in the distractor's split and domain."""
    x = np.asarray(item.values, dtype=float)
    d = np.asarray(distractor.values, dtype=float)
    rx, rd = x - endpoint_line(x), d - endpoint_line(d)
    scale = float(rx.std() / rd.std()) if rd.std() > 0 else 0.0
    values = np.round(endpoint_line(np.round(x, precision)) + scale * rd, precision)
    return Series(id=f"{distractor.id}~{item.id}", values=values, source=distractor.source, start=distractor.start,
                  domain=distractor.domain, split=distractor.split,
                  meta={"pinned_to": item.id, "shape_of": distractor.id})
