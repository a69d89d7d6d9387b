"""Transcription guard: how many of a caption's numbers are copied from the series it describes.

A caption that lists the series' numbers wins a likelihood verifier without describing anything
(``captionrl eval hacking`` measures it), so every reward and evaluation table counts copied values the same way, here:

- every number of the caption (negatives, decimals, thousands separators ``1,234.5``) is matched **by
  value** against the series at the rounding the caption uses: ``354.3`` (one decimal) matches 354.2987,
  ``354.30`` matches it too, ``354`` matches it at zero decimals. Numbers with fewer than
  ``min_significant`` significant digits (``2``, ``-1``, ``0.5``) carry too little to count, and numbers
  that name a position or a count ("step 5", "24 points") are not values;
- a **run** is a stretch of consecutive caption numbers that are consecutive series values in order
  (``v[i], v[i+1], v[i+2]``): that is transcription, never description, so any run of ``min_run`` or more
  values is always penalised;
- the **allowance is a number of values** (``max_copied_values``: the start, end, maximum and minimum of an
  honest caption are copied values too), not a fraction of the series: at a 48-token budget a fraction of
  a 24-value series can never be reached, so such a guard never fires.

``transcription(caption, values)`` returns a ``Transcription`` with the counts and the penalty; it works at
any completion budget because nothing depends on the caption's or the series' length.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from captionrl.errors import ConfigError

# A number: sign, digits with optional thousands groups, optional decimals. Not part of a word/identifier.
_NUMBER = re.compile(r"(?<![\w.])(-|−)?(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?(?![\w])")
_BEFORE_POSITION = re.compile(r"(?:\b(?:steps?|index|indices|positions?|points?|t|x|time\s*steps?|at\s+step|"
                              r"lags?|windows?|periods?|days?|weeks?|months?|years?|hours?)\s*=?\s*)$", re.I)
_AFTER_COUNT = re.compile(r"^\s*(?:%|percent|points|values|steps|observations|time\s*steps|numbers|samples|"
                          r"readings|entries|periods|days|weeks|months|years|hours)\b", re.I)


@dataclass(frozen=True)
class TranscriptionConfig:
    """How copying is counted and priced. The allowance is a count of values, never a fraction."""

    max_copied_values: int = 4      # free: start, end, max and min of an honest caption are copied values
    min_run: int = 3                # runs of >= this many consecutive series values are always penalised
    value_penalty: float = 0.1      # per copied value beyond the allowance
    run_penalty: float = 1.0        # once, when the caption contains a run of >= min_run values
    min_significant: int = 2        # "2", "-1", "0.5" are too short to be a copy of anything

    def __post_init__(self) -> None:
        if self.max_copied_values < 0:
            raise ConfigError("max_copied_values", self.max_copied_values, "must be >= 0", "set e.g. 4")
        if self.min_run < 2:
            raise ConfigError("min_run", self.min_run, "a run needs at least 2 values", "set e.g. 3")
        if self.value_penalty < 0 or self.run_penalty < 0:
            raise ConfigError("value_penalty/run_penalty", (self.value_penalty, self.run_penalty),
                              "penalties must be >= 0", "set them to 0 to switch the guard off")
        if self.min_significant < 1:
            raise ConfigError("min_significant", self.min_significant, "must be >= 1", "set e.g. 2")


@dataclass(frozen=True)
class Transcription:
    """The guard's finding for one caption."""

    numbers: int          # value-like numbers in the caption (positions and counts excluded)
    copied: int           # of them, how many equal a series value at the caption's rounding
    distinct: int         # distinct series positions those copies cover
    n_values: int         # length of the series
    longest_run: int      # longest stretch of consecutive series values, in order
    run_values: int       # copied numbers that belong to a run of >= min_run
    excess: int           # copied values beyond the allowance
    penalty: float        # value_penalty * excess + run_penalty * (a run was found)

    @property
    def share(self) -> float:
        """Fraction of the series' values the caption transcribed (distinct positions / length)."""
        return self.distinct / self.n_values if self.n_values else 0.0

    @property
    def has_run(self) -> bool:
        return self.run_values > 0


@dataclass(frozen=True)
class _Number:
    value: float
    decimals: int
    start: int
    end: int


def caption_numbers(caption: str, min_significant: int = 1) -> list[_Number]:
    """Value-like numbers of ``caption`` in order (positions like "step 5" and counts like "24 points" left out).

    A comma group that is not a plausible thousands separator list (``1,234,5`` or ``12,130``-style dumps)
    is parsed both ways by ``transcription``: see ``_alternatives``.
    """
    out = []
    for m in _NUMBER.finditer(caption):
        if _BEFORE_POSITION.search(caption[max(0, m.start() - 14): m.start()]) or _AFTER_COUNT.match(caption[m.end():]):
            continue
        digits = (m.group(2) + (m.group(3) or "")).replace(",", "").lstrip("0")
        if len(digits) < min_significant:
            continue
        text = m.group(2).replace(",", "") + ("." + m.group(3) if m.group(3) else "")
        value = float(text) * (-1 if m.group(1) else 1)
        out.append(_Number(value, len(m.group(3) or ""), m.start(), m.end()))
    return out


def _alternatives(caption: str, num: _Number, min_significant: int) -> list[_Number]:
    """A number written with commas may be a list without spaces ("120,130,140"): its parts."""
    raw = caption[num.start: num.end]
    if "," not in raw:
        return []
    parts, pos = [], num.start
    for piece in raw.split(","):
        sub = caption_numbers(piece, min_significant)
        parts.extend(_Number(n.value, n.decimals, pos + n.start, pos + n.end) for n in sub)
        pos += len(piece) + 1
    return parts


def _positions(num: _Number, values: Sequence[float]) -> list[int]:
    """Series positions whose value, rounded to the number's decimals, is the number."""
    half = 0.5 * 10 ** (-num.decimals) * (1 + 1e-9) + 1e-12
    return [i for i, v in enumerate(values) if math.isfinite(v) and abs(v - num.value) <= half]


def transcription(caption: str, values: Sequence[float], cfg: TranscriptionConfig | None = None,
                  shown: Sequence[float] | None = None) -> Transcription:
    """Count the values ``caption`` copies from ``values`` (and from ``shown``, the numbers as the prompt
    printed them, e.g. normalised) and price the copying. See the module doc for the rules."""
    cfg = cfg or TranscriptionConfig()
    vals = [float(v) for v in values]
    alt = [float(v) for v in shown] if shown is not None and len(shown) == len(vals) else None
    matched: list[list[int]] = []   # per copied caption number, its possible series positions
    gaps: list[bool] = []           # whether an uncopied number sat between this copy and the previous one
    between = False
    numbers = caption_numbers(caption, cfg.min_significant)
    for num in numbers:
        candidates = [num]
        pos = _match(num, vals, alt)
        if not pos:
            candidates = _alternatives(caption, num, cfg.min_significant)
            if not candidates:
                between = True
                continue
        for c in candidates:
            p = pos if c is num else _match(c, vals, alt)
            if p:
                matched.append(p)
                gaps.append(between)
                between = False
            else:
                between = True
    copied = len(matched)
    # a number that equals several series values covers one of them: bound the union by the copies
    distinct = min(len(set().union(*map(set, matched))), copied) if matched else 0
    longest, run_values = _runs(matched, gaps, cfg.min_run)
    excess = max(0, copied - cfg.max_copied_values)
    penalty = cfg.value_penalty * excess + (cfg.run_penalty if run_values else 0.0)
    return Transcription(numbers=len(numbers), copied=copied,
                         distinct=distinct, n_values=len(vals), longest_run=longest, run_values=run_values,
                         excess=excess, penalty=penalty)


def _match(num: _Number, vals: list[float], alt: list[float] | None) -> list[int]:
    pos = _positions(num, vals)
    if alt is not None:
        pos = sorted(set(pos) | set(_positions(num, alt)))
    return pos


def _runs(matched: list[list[int]], gaps: list[bool], min_run: int) -> tuple[int, int]:
    """(longest run, copied numbers inside runs >= min_run): consecutive copies at consecutive positions."""
    longest = in_runs = current = 0
    ends: dict[int, int] = {}   # series position -> length of the run ending there at the previous copy
    for pos, gap in zip(matched, gaps, strict=True):
        new = {p: (1 if gap else ends.get(p - 1, 0) + 1) for p in pos}
        length = max(new.values())
        if length != current + 1:   # the previous run ended
            in_runs += current if current >= min_run else 0
        current = length
        longest = max(longest, length)
        ends = new
    in_runs += current if current >= min_run else 0
    return longest, in_runs


def parse_shown(series_text: str) -> list[float]:
    """The numbers of a rendered series (``"1.50, 2.25, ..."``), in order; unparsable pieces are NaN."""
    out = []
    for piece in series_text.split(","):
        try:
            out.append(float(piece.strip()))
        except ValueError:
            out.append(math.nan)
    return out
