"""Shape claims of a caption (direction, extrema, stretches, volatility, magnitudes), read by rules and
checked by code against the series.

Why: a caption is mostly claims about shape ("slow increase, peak in the middle", "drops sharply at the
end"), and a checker that reads only numbers calls "355.10" or a copied sentence with one value in it an
improvement while it cannot read a single human caption. ``judges.claims.extract_rules`` adds the claims
found here to its value claims, so the span audit, the factuality term, the ``claims:rules`` verifier and
``judges.key_facts`` all see them.

Kinds (``Claim.kind``) and how each is checked. ``u`` is the series rescaled to [0, 1] by its range
``R = max - min`` (a chart with an automatic axis: what a reader of the chart sees); positions are
fractions ``p = i / (n - 1)`` of the window:

- **trend** (overall direction: rises, increases, upward trend / falls, declines / flat, stable, no clear
  trend): ``c = slope * (n - 1) / std`` is the least-squares change over the window in standard deviations
  and ``net`` the mean of the last tenth of the values minus that of the first tenth
  (``domains.describe.overall_direction``, the describer's own rule). "Up" holds when ``c >= 0.5`` and
  ``net > 0`` (the series ends above where it started), "down" mirrored. "No clear trend", "no overall
  direction", "roughly flat overall" (``pattern="net"``) hold when ``|c| <= 1.25`` (a trend line that
  explains at most ~13% of the variance) or when slope and endpoints disagree; so between 0.5 and 1.25 both
  "rises slightly" and "no clear trend" are accepted. Plain "flat", "stable", "steady", "constant"
  (``pattern="level"``) also need the values to stay within 10% of their level (``R <= 0.1 * mean|v|``: a
  series swinging from 5 to 150 is not stable whatever its slope) and no stretch moving half the range (a
  hump in co2 is within 2% of its level, and not flat). "Steadily", "throughout",
  "consistently" (``pattern="strict"``) add that the whole window is one monotone stretch: no move against
  the direction larger than 0.25 of the range (smoothed values).
- **hedge** ("rises or falls", "increases or decreases", "goes up and down overall", the instruction's own
  "whether it rises or falls"): always **red**: it asserts nothing checkable while looking like an answer.
- **extremum** (peak / highest / maximum / trough / lowest / minimum placed in a region): holds when the
  region holds the series' maximum (minimum) up to a 5% near-tie of the range. "Starts high", "ends low",
  "ends near its high" (``pattern="level"``): the region reaches the top (bottom) quarter of the range.
  Regions (``REGIONS``), as fractions of the window: *at the start* / *at first* / *initially* [0, 0.2];
  *early* / *near the start* [0, 1/3]; *first quarter* [0, 0.25]; *first half* / *before the middle* [0, 0.5];
  *a third of the way in* [0.2, 0.45]; *middle* / *midway* [0.25, 0.75]; *two thirds of the way in*
  [0.55, 0.8]; *second half* / *after the middle* [0.5, 1]; *last quarter* [0.75, 1]; *late* / *near the
  end* / *towards the end* [2/3, 1]; *at the end* / *by the end* / *finally* [0.8, 1]; "starts/ends at its
  peak": the first/last tenth; "ends near its high": the last value. An extremum with a value ("a peak of
  6.07") is also a value claim (``kind="stat"``, or ``"value"`` at a stated step) checked within
  ``tolerance`` standard deviations, like every number.
- **stretch**: (a) one direction in a region ("drops at the end", "increases in the first half", "flat in
  the middle", "levels off at the end"): some stretch inside the region (±1 step) moves that way by at least
  0.2 of the range (0.05 with "slowly", "gradually", "gently") with no counter-move over 0.25, and lasts at
  least a third of the region (one step when "sharply"; two thirds with "steadily"); a move to a placed
  extremum ("falls to a low late in the window") need only end in the region. A flat stretch spans at most
  0.3 of the range and at most three quarters of what a steady full-range trend moves over as many steps (at
  least 0.1), so three steps of a steady rise are not "flat". (b) a sequence ("rises then falls", "falls
  until the middle, then recovers", "U-shaped", "peaks early, then declines", "flat at first, then a sharp
  jump in the middle, then a gradual decline"): the window can be cut into consecutive stretches of those
  directions (each as in (a); a region pins its stretch to overlap it by half), covering the window but for
  at most 20% at either end, and what is left uncovered moves less than 0.3 of the range (a caption that
  places its first stretch may start there). (c) a local turning point ("a dip in the middle", "a spike near
  the end"): a point in the region stands out of the values within a quarter window on both sides by at
  least 0.15 of the range. (d) a move to a stated value ("rises to 28.55", "falls to 4.5 by the end"): the
  series reaches the value (within ``tolerance`` standard deviations) after having been on the other side of
  it, and when the caption stated a value just before ("starts at 7.2 and rises to 5.3", "rises to 28.55,
  falls to 29.21") the move goes the stated way from it.
- **volatility**: ``nu = mean|v[t+1] - v[t]| / max(mean|v|, R / 2)`` is the mean one-step change relative
  to the level (returns, as volatility is measured in finance; half the range stands in for the level of a
  series near zero) and ``curve = mean|second difference| / mean|step|`` says how jagged the steps are (a
  smooth curve: under 0.5, a sampled sine of period 12 is at 0.5, noise at ~1.7). "Volatile", "noisy",
  "erratic" hold when ``nu >= 0.06`` and ``curve > 0.5``; "smooth", "little noise", "small fluctuations"
  otherwise; 0.06 sits in the gap between the two classes of the labelled set
  (``tests/data/shape_captions.jsonl``), where every caption labelled volatile has ``curve >= 0.8``; the
  curvature keeps a smooth hump from 1 to 9.5 (large steps for its level) smooth. "Fluctuates",
  "oscillates", "cycles", "goes up and down" (``pattern="reversals"``) hold when the series reverses at least
  twice by a quarter of its range (three legs of a zigzag filter at 0.25).
- **magnitude**: "slightly", "a small increase" hold when the move is smaller than half the range or than
  2% of the level; "sharply", "steeply", "suddenly" (pace) when a move of at least half the range that way
  happens within 15% of the window (at least 3 steps), in the claim's region if it names one, and for an
  overall direction the direction holds too; "strongly", "a large jump", "substantially" (size, not pace)
  when a move that way spans at least half the range, and for an overall direction when ``|c| >= 2`` (the
  trend line explains at least a third of the variance); "doubles" (x1.8-2.25), "triples" (x2.7-3.3),
  "halves" (x0.4-0.6), "by 40 percent", "a 9 percent gain" and "by about a fifth" (±max(5, 25% of the
  figure) points) compare the last value with the first. A "slightly" inside a sequence with no place
  ("... before dipping slightly") is not checked: nothing says which stretch it measures.

Windows longer than 64 values are read as their 64-point chart (block means) for stretches, sequences,
dips and "steadily"/"flat" checks: the shape a person reads, at the cost of a 64-value window.

Colours: green = the series supports the claim, red = it contradicts it (a hedge is always red), gray =
nothing checkable (a series too short for the claim). Tolerances are constants of this module, not
settings: changing one changes what every reward and check means, so it is a code change with a measured
table (``bench/bench_shape_claims.py``).

Not read (they extract nothing, so they are neither paid nor penalised): rates of change ("accelerating",
"faster in the second half"), counts ("three waves"), comparisons ("growing peaks", "ends lower than it
starts"), stated ranges ("between 650 and 1170"); pace words ("gradual increase") qualify a direction but are
not magnitude claims. ``docs/claims.md`` lists the measured misses.

This module has no dependency on ``judges.claims``: extraction returns the keyword arguments of a
``Claim`` and checks read a claim's attributes, so ``judges.claims`` can import it without a circle.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise
from typing import Any, Protocol

import numpy as np

from captionrl.domains.describe import UP_C, direction_measures

SHAPE_KINDS = ("trend", "hedge", "extremum", "stretch", "volatility", "magnitude")

# ----------------------------------------------------------------------------------------- tolerances
# UP_C = 0.5 (domains.describe): c = slope * (n - 1) / std: "rises" from here, the describer's own rule
FLAT_C = 1.25         # "no clear trend" up to here
LEVEL_SPREAD = 0.10   # "flat"/"stable": range within 10% of the level...
LEVEL_MOVE = 0.5      # ...and no stretch moving half the range (a hump in a high-level series is not flat)
STRICT_BACK = 0.25    # "steadily"/"throughout": largest counter-move, share of the range
TIE = 0.05            # an extremum's near-tie, share of the range
LEVEL_Q = 0.25        # "starts high": top quarter of the range
MOVE = 0.20           # a stretch moves at least this share of the range...
MOVE_GENTLE = 0.05    # ...or this with "slowly", "gradually", "gently"
BACK = 0.25           # ...with no counter-move over this share
FLAT_SPAN = 0.30      # a flat stretch spans at most this share of the range, and at most half what a
FLAT_PACE = 0.75       #   steady full-range trend moves over as many steps (floor FLAT_MIN): a steady rise
FLAT_MIN = 0.10       #   has no "flat" three steps
LEVEL_NET = 0.30      # a "fluctuates at a lower level" stretch: net move at most this share
MARGIN = 0.20         # a sequence may leave this share of the window uncovered at either end
PROMINENCE = 0.15     # a dip / spike stands out by this share of the range
VOLATILE = 0.06       # nu = mean |step| / level: volatile at or above, smooth at or below...
CURVE = 0.5           # ...and mean |second difference| / mean |step| over this (below: a smooth curve)
CHART_POINTS = 64     # stretches, sequences and dips of a longer window are read on its 64-point chart
REVERSAL = 0.25       # zigzag threshold (share of the range) for "fluctuates"
SLIGHT = 0.5          # a slight move: under half the range...
SLIGHT_LEVEL = 0.02   # ...or under 2% of the level
SHARP = 0.5           # a sharp move: at least half the range...
SHARP_SPAN = 0.15     # ...within 15% of the window (at least 3 steps)
LARGE = 0.5           # "strongly", "a large jump": a move of at least half the range, at any pace...
LARGE_C = 2.0         # ...and for an overall direction a trend line explaining a third of the variance

REGIONS: dict[str, tuple[float, float]] = {
    "first point": (0.0, 0.0), "first tenth": (0.0, 0.1), "last tenth": (0.9, 1.0), "last point": (1.0, 1.0),
    "start": (0.0, 0.2), "early": (0.0, 1 / 3), "first quarter": (0.0, 0.25), "first third": (0.0, 1 / 3),
    "first half": (0.0, 0.5), "middle": (0.25, 0.75), "second half": (0.5, 1.0), "last third": (2 / 3, 1.0),
    "last quarter": (0.75, 1.0), "late": (2 / 3, 1.0), "end": (0.8, 1.0),
    "a third in": (0.2, 0.45), "two thirds in": (0.55, 0.8), "three quarters in": (0.65, 0.85),
}


class ClaimLike(Protocol):
    kind: str
    value: float | None
    direction: str | None
    stat: str | None
    region: str | None
    pattern: str | None
    degree: str | None
    ref: float | None


# ---------------------------------------------------------------------------------- series measures
@dataclass(frozen=True)
class SeriesShape:
    """What the checks read from one series, computed once (``measure`` caches it)."""

    v: np.ndarray      # values
    u: np.ndarray      # rescaled to [0, 1] by the range (all 0 for a constant series)
    s: np.ndarray      # u smoothed by a centred 3-point mean (n >= 8), for stretches
    rng: float         # max - min
    level: float       # mean |v|
    c: float           # least-squares change over the window, in standard deviations
    net: float         # last tenth minus first tenth (mean values)
    nu: float          # mean |step| / max(level, range / 2)
    curve: float       # mean |second difference| / mean |step| (small: a smooth curve)
    legs: int          # zigzag legs at REVERSAL of the range

    @property
    def n(self) -> int:
        return len(self.v)

    def span(self, region: str) -> tuple[int, int]:
        """Index interval [i0, i1] of a named region."""
        lo, hi = REGIONS[region]
        last = self.n - 1
        i0, i1 = int(np.ceil(lo * last - 1e-9)), int(np.floor(hi * last + 1e-9))
        return min(i0, i1), max(i0, i1)


def _zigzag_legs(u: np.ndarray, threshold: float) -> int:
    """Legs of a zigzag filter: moves of at least ``threshold`` between confirmed turning points."""
    legs, direction = 0, 0
    lo = hi = ext = float(u[0])
    for x in map(float, u[1:]):
        if direction == 0:
            lo, hi = min(lo, x), max(hi, x)
            if x - lo >= threshold:
                direction, ext, legs = 1, x, 1
            elif hi - x >= threshold:
                direction, ext, legs = -1, x, 1
        elif direction > 0:
            if x > ext:
                ext = x
            elif ext - x >= threshold:
                direction, ext, legs = -1, x, legs + 1
        elif x < ext:
            ext = x
        elif x - ext >= threshold:
            direction, ext, legs = 1, x, legs + 1
    return legs


@lru_cache(maxsize=128)
def _measure(raw: bytes) -> SeriesShape:
    v = np.frombuffer(raw, dtype=float)
    n = len(v)
    lo, hi = float(v.min()), float(v.max())
    rng = hi - lo
    u = (v - lo) / rng if rng > 0 else np.zeros(n)
    if n >= 8:
        padded = np.concatenate([u[:1], u, u[-1:]])
        s = (padded[:-2] + padded[1:-1] + padded[2:]) / 3
    else:
        s = u.copy()
    c, net = direction_measures(v)
    level = float(np.abs(v).mean())
    denom = max(level, rng / 2)
    steps = np.abs(np.diff(v))
    nu = float(steps.mean()) / denom if n >= 2 and denom > 0 else 0.0
    curve = float(np.abs(np.diff(v, 2)).mean() / steps.mean()) if n >= 3 and steps.mean() > 0 else 0.0
    return SeriesShape(v=v, u=u, s=s, rng=rng, level=level, c=c, net=net, nu=nu, curve=curve,
                       legs=_zigzag_legs(u, REVERSAL) if n >= 3 else 0)


def measure(series: Any) -> SeriesShape:
    """The shape measures of ``series`` (cached by value: the checks of one caption share them)."""
    v = np.ascontiguousarray(np.asarray(series, dtype=float))
    return _measure(v.tobytes())


def chart(sh: SeriesShape) -> SeriesShape:
    """The measures of the window as a chart shows it: block means down to ``CHART_POINTS`` values (the
    window itself when shorter), so that a stretch or sequence check on 512 values costs what it costs on 64
    and reads the shape a person reads, not every wiggle."""
    if sh.n <= CHART_POINTS:
        return sh
    edges = np.linspace(0, sh.n, CHART_POINTS + 1).round().astype(int)
    return measure(np.array([sh.v[a:b].mean() for a, b in pairwise(edges)]))


# ------------------------------------------------------------------------------------- vocabulary
_NUM = r"-?\d+(?:,\d{3})*(?:\.\d+)?"
_W = r"(?:[a-z]+\s+){0,2}?"  # up to two words in between
UP = (r"ris(?:e|es|ing|en)|rose|increas(?:e|es|ed|ing)|climb(?:s|ed|ing)?|grow(?:s|ing|th|n)?|grew|"
      r"go(?:es)?\s+up|went\s+up|going\s+up|upward(?:s)?|uptick|upswing|gain(?:s|ed|ing)?|"
      r"recover(?:s|ed|ing|y)?|rebound(?:s|ed|ing)?|pick(?:s|ed)?\s+up|jump(?:s|ed|ing)?|surg(?:e|es|ed|ing)|"
      r"soar(?:s|ed|ing)?|rall(?:y|ies|ied|ying)|advanc(?:e|es|ed|ing)|spik(?:es|ed|ing)|"
      r"(?:trends?|trending|heads?|heading|moves?|moving|edges?|edging|ticks?|ticking|steps?|stepping)\s+"
      r"(?:up|upwards?|higher)")
DOWN = (r"fall(?:s|ing|en)?|fell|declin(?:e|es|ed|ing)|decreas(?:e|es|ed|ing)|drop(?:s|ped|ping)?|"
        r"go(?:es)?\s+down|went\s+down|going\s+down|downward(?:s)?|downtick|downswing|slump(?:s|ed)?|"
        r"plung(?:e|es|ed|ing)|tumbl(?:e|es|ed|ing)|sink(?:s|ing)?|sank|shrink(?:s|ing)?|shrank|"
        r"slid(?:e|es|ing)?|crash(?:es|ed)?|collaps(?:e|es|ed)|dips|dipped|dipping|"
        r"(?:trends?|trending|heads?|heading|moves?|moving|edges?|edging|ticks?|ticking|steps?|stepping)\s+"
        r"(?:down|downwards?|lower)|easing|eases|eased|"
        r"(?:settl|eas)(?:e|es|ed|ing)\s+(?:back|down|lower|off)|falls?\s+back|fell\s+back")
FLAT = (r"flat(?:tens|tened|tening|ten)?|stable|stabili[sz](?:e|es|ed|ing)|unchanged|constant|"
        r"levels?\s+off|levelling\s+off|leveling\s+off|levelled\s+off|leveled\s+off|plateau(?:s|ed)?|"
        r"sideways|settl(?:e|es|ed|ing)|stays?\s+(?:low|high|level|put|the\s+same)|remains?\s+(?:low|high|level)|"
        r"holds?\s+steady|paus(?:e|es|ed|ing)|"
        r"(?<!lower )(?<!higher )(?<!a )(?<!the )(?<!same )(?<!stable )(?<!new )(?<!low )(?<!high )"
        r"level(?=\s+(?:at|in|for|during|until|early|initially|through)\b)")
_RX = {
    "hedge": re.compile(
        rf"\b(?:(?:{UP})\s+(?:or|and/or|nor)\s+(?:{DOWN})|(?:{DOWN})\s+(?:or|and/or|nor)\s+(?:{UP})|"
        rf"(?:goes|going|moves?|went)\s+up\s+(?:and|or)\s+down\s+overall|"
        rf"(?:rises|increases|climbs)\s+and\s+(?:falls|decreases|declines)\s+overall|"
        rf"whether\s+it\s+(?:{UP}|{DOWN})(?:\s+(?:or|and)\s+(?:{UP}|{DOWN}))?)(?:\s+overall)?\b", re.I),
    "notrend": re.compile(
        r"\b(?:no\s+(?:clear\s+|obvious\s+|real\s+|significant\s+|strong\s+|consistent\s+|discernible\s+|"
        r"particular\s+)?(?:overall\s+|net\s+|long-term\s+)?(?:trend|direction|change)|"
        r"without\s+(?:a\s+|any\s+)?(?:clear\s+|obvious\s+)?(?:trend|direction)|trendless|"
        r"little\s+(?:overall\s+|net\s+)?change|(?:around|about|near)\s+a\s+(?:stable|constant|steady|flat|fixed)\s+"
        r"(?:level|mean|value|average)|roughly\s+flat|(?:overall|on\s+the\s+whole)[^.;]{0,20}?\bflat|"
        r"flat\s+overall|stays?\s+(?:roughly\s+)?flat\s+overall)\b", re.I),
    "shape_updown": re.compile(r"\b(?:inverted[\s-]+[uv]|(?:single\s+)?hump(?:-shaped)?|bell[\s-]+shaped|"
                               r"arch(?:-shaped)?)\b", re.I),
    "shape_downup": re.compile(r"\b(?:[uv][\s-]?shaped?|bowl[\s-]+shaped|(?:a\s+)?[uv]\s+shape)\b", re.I),
    "vol_low_phrase": re.compile(r"\b(?:little|low|no|without|minimal)\s+(?:\w+\s+)?noise|noise-free|"
                                 r"(?:small|slight|minor|little|mild|tiny|few)\s+(?:fluctuations?|oscillations?|"
                                 r"wiggles?|variations?|noise)\b", re.I),
    "vol_rev_phrase": re.compile(r"\b(?:(?:goes|going|moves?|moving|jumps?|jumping|bounces?|bouncing)\s+)?"
                                 r"up\s+and\s+down\b|\bups\s+and\s+downs\b|\bback\s+and\s+forth\b", re.I),
    "ratio": re.compile(rf"\b(?:(?P<q>nearly|almost|more\s+than|over|roughly|about)\s+)?(?P<r>doubl(?:e|es|ed|ing)|"
                        rf"tripl(?:e|es|ed|ing)|halv(?:e|es|ed|ing))\b|\bby\s+(?:about\s+|around\s+|roughly\s+|"
                        rf"nearly\s+|almost\s+|some\s+)?(?P<pct>{_NUM})\s*(?:%|percent|per\s+cent)|"
                        rf"\b(?:an?|some)\s+(?:about\s+|around\s+|roughly\s+|nearly\s+|almost\s+)?(?P<pct2>{_NUM})\s*"
                        rf"(?:%|percent|per\s+cent)\s+(?:gain|rise|increase|growth|jump|climb|drop|fall|decline|decrease|loss)|"
                        rf"\bby\s+(?:about\s+|around\s+|roughly\s+|nearly\s+|almost\s+|some\s+)?(?:a|one)\s+"
                        rf"(?P<frac>half|third|quarter|fifth|tenth)\b|\bby\s+(?:about\s+)?half\b", re.I),
    "level_ext": re.compile(r"\b(?P<w>starts?|begins?|opens?|starting|beginning|ends?|finish(?:es)?|closes?|"
                            r"ending|finishing)\s+(?:(?:very|quite|relatively|fairly)\s+)?(?P<hl>high|low)\b", re.I),
    "edge_ext": re.compile(r"\b(?P<w>starts?|begins?|opens?|starting|beginning|ends?|finish(?:es)?|closes?|ending|"
                           r"finishing)\s+(?P<p>at|near|on|with|in)\s+(?:its|a|the)\s+(?:(?:new|overall|all-time|very)\s+)?"
                           r"(?P<x>peak|maximum|max|highest|high|top|lowest|low|minimum|min|trough|bottom)\b", re.I),
    "level_adj": re.compile(r"(?<!stays )(?<!remains )(?<!stay )(?<!remain )(?<!stayed )\b(?P<hl>high|low)\s+"
                            r"(?=(?:at|in|near|towards?|during)\s+the\b|at\s+first|early|late|initially)", re.I),
    "whole": re.compile(r"\bfrom\s+(?:the\s+)?(?:very\s+)?(?:start|beginning|first\s+value)\s+to\s+(?:the\s+)?"
                        r"(?:very\s+)?(?:finish|end|last\s+value)\b", re.I),
    "level_word": re.compile(r"\bat\s+(?:the\s+)?(?:bottom|top)\b|\bnear\s+(?:the\s+)?(?:bottom|top)\b", re.I),
    "local": re.compile(r"\b(?:an?|one|the)\s+(?:(?:brief|sharp|sudden|small|slight|big|large|deep|short|"
                        r"notable|noticeable|single|quick|temporary|isolated|pronounced|(?P<adj>early|late|initial|"
                        r"final))\s+)?"
                        r"(?P<x>dip|spike|bump|blip|hump)\b", re.I),
    "ext": re.compile(r"\b(?:(?:an?|the|its|one)\s+(?:(?P<adj>early|late|final|initial|first|last|tallest|"
                      r"highest|lowest|deepest|main|overall|global|single|new)\s+)?)?(?P<x>peak(?:s|ed|ing)?|"
                      r"highest|maximum|max|tops\s+out|high\s+point|tallest|trough(?:s|ed)?|lowest|minimum|min|"
                      r"bottom(?:s|ed)?|low\s+point|nadir)\b|\b(?:an?|its|the)\s+(?:(?P<adj2>early|late|final|"
                      r"initial)\s+)?(?:new\s+)?(?P<x2>high|low)\b(?!er|est|\s+(?:level|values?|stretch|point))", re.I),
    "dir": re.compile(rf"\b(?P<d>{UP}|{DOWN}|{FLAT})\b", re.I),
    "steady": re.compile(r"\b(?:steady|steadily|consistent(?:ly)?|continuous(?:ly)?|monoton(?:ic|ically|ous|ously)|"
                         r"throughout|all\s+the\s+way|constantly|every\s+step|without\s+interruption)\b", re.I),
    "gentle": re.compile(r"\b(?:slow(?:ly)?|gradual(?:ly)?|gentl[ey]|mild(?:ly)?)\b", re.I),
    "sharp": re.compile(r"\b(?:sharp(?:ly|er)?|steep(?:ly)?|sudden(?:ly)?|abrupt(?:ly)?|rapid(?:ly)?|quick(?:ly)?|"
                        r"fast|dramatic(?:ally)?|precipitous(?:ly)?)\b", re.I),
    "large": re.compile(r"\b(?:strong(?:ly)?|big|large|huge|massive|significant(?:ly)?|substantial(?:ly)?|marked(?:ly)?|"
                        r"considerabl[ey]|pronounced)\b", re.I),
    "slight": re.compile(r"\b(?:slight(?:ly)?|a\s+little|a\s+bit|marginal(?:ly)?|modest(?:ly)?|small|minor|tiny|"
                         r"somewhat|barely|a\s+touch|mildly)\b", re.I),
    "overall": re.compile(r"\b(?:overall|over\s+(?:the\s+)?(?:whole\s+|entire\s+)?(?:window|series|period|time)|"
                          r"in\s+general|on\s+the\s+whole|generally|trend|net|drift(?:s|ing)?)\b", re.I),
    "vol_high": re.compile(r"\b(?:volatil\w*|noisy|noise|erratic\w*|jagged|choppy|jumpy|irregular\w*|spiky|turbulent|"
                           r"unstable)\b", re.I),
    "vol_rev": re.compile(r"\b(?:fluctuat\w*|oscillat\w*|zig-?zag\w*|swings?|swinging|bounc(?:e|es|ing)|"
                          r"wav(?:es|y)|cycl(?:e|es|ical|ic)|seesaw\w*)\b", re.I),
    "vol_low": re.compile(r"\bsmooth(?:ly|ed)?\b", re.I),
    "region": re.compile(
        r"\b(?P<start>at\s+(?:the\s+)?(?:very\s+)?(?:start|beginning|outset)|at\s+first|initially|in\s+(?:the\s+)?first\s+few\s+\w+|"
        r"the\s+first\s+few\s+\w+|from\s+(?:the\s+)?(?:very\s+)?(?:start|beginning))\b|"
        r"\b(?P<early>early(?:\s+on|\s+in\s+(?:the\s+)?(?:window|series|period))?|in\s+(?:the\s+)?(?:first|early|initial)\s+"
        r"(?:part|stage|section|portion|phase|steps)|near\s+(?:the\s+)?(?:start|beginning)|towards?\s+(?:the\s+)?(?:start|beginning)|"
        r"in\s+(?:the\s+)?beginning|(?:at|in)\s+(?:the\s+)?(?:start|beginning)\s+of\s+(?:the\s+)?(?:window|series))\b|"
        r"\b(?P<fq>(?:in\s+(?:the\s+)?)?first\s+quarter)\b|\b(?P<ft>(?:in\s+(?:the\s+)?)?first\s+third)\b|"
        r"\b(?P<fh>(?:in\s+(?:the\s+)?|during\s+(?:the\s+)?|over\s+(?:the\s+)?)?first\s+half|(?:before|until|up\s+to|by)\s+(?:the\s+)?"
        r"(?:middle|midpoint|half-?way\s+point))\b|"
        r"\b(?P<sh>(?:in\s+(?:the\s+)?|during\s+(?:the\s+)?|over\s+(?:the\s+)?)?(?:second|latter|later)\s+half|(?:after|from)\s+"
        r"the\s+(?:middle|midpoint))\b|"
        r"\b(?P<lt>(?:in\s+(?:the\s+)?)?(?:last|final)\s+third)\b|\b(?P<lq>(?:in\s+(?:the\s+)?)?(?:last|final)\s+quarter)\b|"
        r"\b(?P<third>(?:about\s+|around\s+|roughly\s+)?(?:a|one)\s+third\s+of\s+(?:the\s+)?way(?:\s+(?:in|through|along))?)\b|"
        r"\b(?P<twothirds>(?:about\s+|around\s+|roughly\s+)?two[\s-]+thirds\s+of\s+(?:the\s+)?way(?:\s+(?:in|through|along))?)\b|"
        r"\b(?P<threeq>(?:about\s+|around\s+|roughly\s+)?three[\s-]+quarters\s+of\s+(?:the\s+)?way(?:\s+(?:in|through|along))?)\b|"
        r"\b(?P<middle>(?:in|around|near|through|towards?)\s+(?:the\s+)?(?:middle|center|centre)|midway|half-?way|"
        r"mid-?(?:window|series|way|point|period)|the\s+middle)\b|"
        r"\b(?P<end>at\s+(?:the\s+)?(?:very\s+)?(?:end|close)(?:\s+of\s+(?:the\s+)?(?:window|series|period))?|by\s+(?:the\s+)?end|"
        r"finally|in\s+(?:the\s+)?(?:last|final)\s+few\s+\w+|the\s+(?:last|final)\s+few\s+\w+)\b|"
        r"\b(?P<late>near\s+(?:the\s+)?end|towards?\s+(?:the\s+)?end|late(?:r)?(?:\s+on|\s+in\s+(?:the\s+)?(?:window|series|period))?|"
        r"in\s+(?:the\s+)?(?:last|final|late|later|closing)\s+(?:part|stage|section|portion|phase|steps)|"
        r"close\s+to\s+(?:the\s+)?end|(?:in|at)\s+(?:the\s+)?end\s+of\s+(?:the\s+)?(?:window|series|period)|end\s+of\s+(?:the\s+)?"
        r"(?:window|series|period))\b", re.I),
    "sep": re.compile(r"\bthen\b|\bfollowed\s+by\b|\bbefore\b(?!\s+the\s+(?:middle|end|start|beginning))|"
                      r"\bafter\s+which\b|\bafterwards?\b|,|:|\band\s+then\b", re.I),
    "with": re.compile(r"\b(?:with|showing|featuring|including)\b", re.I),
    "step": re.compile(r"\b(?:steps?|t\s*=|time(?:\s*step)?s?|index|indices|positions?|points?|x\s*=)\s*\d+", re.I),
    "target": re.compile(rf"\s*(?:(?:sharply|steeply|slightly|steadily|gradually|quickly|slowly|rapidly|suddenly|"
                         rf"back|further|again|all\s+the\s+way)\s+)?(?:from\s+(?:about\s+|around\s+)?(?P<f>{_NUM})\s+)?"
                         rf"to\s+(?:about\s+|around\s+|roughly\s+|approximately\s+|nearly\s+|almost\s+|just\s+)?"
                         rf"(?P<t>{_NUM})", re.I),
    "to_ext": re.compile(r"\s+(?:\w+ly\s+)?to\s+(?:a|an|its|the)\s+(?:\w+\s+)?(?:peak|trough|high|low|maximum|"
                         r"minimum|bottom|top|lowest|highest|max|min)\b", re.I),
    "ext_value": re.compile(rf"\s*(?:value\s+)?(?:of|at|is|was|=|near|around|about)\s+(?:about\s+|around\s+|"
                            rf"roughly\s+|approximately\s+)?(?P<x>{_NUM})", re.I),
    "chain_value": re.compile(rf"\b(?:starts?|begins?|opens?|starting|beginning|to|from)\s+(?:at\s+|with\s+|"
                              rf"around\s+|about\s+)?(?P<x>{_NUM})", re.I),
}
_REGION_GROUPS = {"start": "start", "early": "early", "fq": "first quarter", "ft": "first third",
                  "fh": "first half", "sh": "second half", "lt": "last third", "lq": "last quarter",
                  "middle": "middle", "end": "end", "late": "late", "third": "a third in",
                  "twothirds": "two thirds in", "threeq": "three quarters in"}
_ADJ_REGION = {"early": "early", "initial": "start", "late": "late", "final": "end"}
_SENTENCE = re.compile(r"(?:[^.;!?]|\.(?=\d))+[.;!?]*")


def _direction(word: str) -> str:
    w = word.lower()
    if re.fullmatch(UP, w, re.I):
        return "up"
    if re.fullmatch(DOWN, w, re.I):
        return "down"
    return "flat"


@dataclass
class _Event:
    kind: str          # dir | ext | local | sep | region | with | step | ...
    start: int
    end: int
    value: Any = None  # direction, stat, region name...
    region: str | None = None
    step: bool = False
    target: float | None = None
    source: float | None = None   # "from X to Y"
    ext_value: float | None = None
    gentle: bool = False
    sharp: bool = False
    large: bool = False
    slight: bool = False
    strict: bool = False
    overall: bool = False
    feature: bool = False  # introduced by "with ..." (a feature, not a step of a sequence)
    t0: int | None = None  # the step an explicit "at step N" gives it
    to_ext: bool = False   # "falls to a trough ...": a move to an extremum, not an overall direction
    seg: int = 0           # the segment (text between separators) it stands in
    ends_in: bool = False  # its region is where it ends ("falls to a low late in the window")


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def sentences(caption: str) -> list[tuple[int, int]]:
    """Character spans of the caption's sentences (a full stop inside a number does not end one)."""
    return [(m.start(), m.end()) for m in _SENTENCE.finditer(caption) if m.group(0).strip()]


def extract_shape(caption: str, index_base: int = 0) -> list[dict[str, Any]]:
    """Shape claims of ``caption`` as ``Claim`` keyword arguments (``judges.claims.extract_rules`` builds
    them), sentence by sentence, in caption order."""
    out: list[dict[str, Any]] = []
    for a, b in sentences(caption):
        out.extend(_sentence_claims(caption, a, b, index_base))
    return out


def _taken(spans: list[tuple[int, int]], s: int, e: int) -> bool:
    return any(s < y and x < e for x, y in spans)


def _sentence_claims(caption: str, a: int, b: int, base: int) -> list[dict[str, Any]]:
    text = caption[a:b]
    claims: list[dict[str, Any]] = []
    used: list[tuple[int, int]] = []

    def claim(kind: str, s: int, e: int, **kw: Any) -> None:
        claims.append({"text": caption[a + s:a + e], "start": a + s, "end": a + e, "kind": kind, **kw})

    def take(rx: str) -> list[re.Match[str]]:
        got = []
        for m in _RX[rx].finditer(text):
            if m.end() > m.start() and not _taken(used, m.start(), m.end()):
                got.append(m)
                used.append(m.span())
        return got

    for m in take("hedge"):
        claim("hedge", m.start(), m.end(), pattern="hedge")
    notrend = take("notrend")
    if notrend:
        m = notrend[0]
        claim("trend", m.start(), m.end(), direction="flat", pattern="net")
    shapes = [(m, ["up", "down"]) for m in take("shape_updown")] + [(m, ["down", "up"]) for m in take("shape_downup")]
    for m in take("vol_low_phrase"):
        claim("volatility", m.start(), m.end(), pattern="low")
    rev_events = [_Event("rev", m.start(), m.end()) for m in take("vol_rev_phrase")]
    for m in take("ratio"):
        claim("magnitude", m.start(), m.end(), degree=_ratio_degree(m))
    events: list[_Event] = []
    for m in take("level_ext"):
        w = m.group("w").lower()
        region = "start" if w[0] in "sbo" else "end"
        stat = "max" if m.group("hl").lower() == "high" else "min"
        events.append(_Event("ext", m.start(), m.end(), value=stat, region=region))
        events[-1].strict = True  # marks the "level" reading (top / bottom quarter)
    for m in take("edge_ext"):
        x = m.group("x").lower()
        stat = "max" if x in ("peak", "maximum", "max", "highest", "high", "top") else "min"
        near = m.group("p").lower() == "near"  # "ends near its high": the last value is in the top quarter
        first = m.group("w").lower()[0] in "sbo"
        region = ("first point" if first else "last point") if near else ("first tenth" if first else "last tenth")
        events.append(_Event("ext", m.start(), m.end(), value=stat, region=region))
        events[-1].strict = near
        _ext_value(events[-1], text, used)
    for m in take("level_adj"):
        events.append(_Event("ext", m.start(), m.end(), value="max" if m.group("hl").lower() == "high" else "min"))
        events[-1].strict = True
    take("level_word")  # "flat at the bottom": a level, not the minimum
    events.extend(_Event("steady", m.start(), m.end()) for m in take("whole"))  # "from start to finish"
    for m in take("local"):
        x = m.group("x").lower()
        events.append(_Event("local", m.start(), m.end(), value="min" if x == "dip" else "max",
                             region=_ADJ_REGION.get((m.group("adj") or "").lower())))
        events[-1].to_ext = bool(_RX["to_ext"].match(text, m.end()))
        if x == "hump":
            events[-1].kind = "hump"
    for m in take("ext"):
        x = (m.group("x") or m.group("x2") or "").lower()
        stat = "max" if re.match(r"peak|highest|max|top|high|tallest", x) else "min"
        adj = (m.group("adj") or m.group("adj2") or "").lower()
        ev = _Event("ext", m.start(), m.end(), value=stat, region=_ADJ_REGION.get(adj))
        _ext_value(ev, text, used)
        events.append(ev)
    for m in take("dir"):
        ev = _Event("dir", m.start(), m.end(), value=_direction(m.group("d")))
        ev.to_ext = bool(_RX["to_ext"].match(text, m.end()))
        tm = _RX["target"].match(text, m.end())
        if tm and ev.value != "flat":
            ev.target = _num(tm.group("t"))
            ev.source = _num(tm.group("f")) if tm.group("f") else None
            ev.end = tm.end()
            used.append((m.end(), tm.end()))
            adverb = text[m.end():tm.start("t")]
            ev.sharp = bool(_RX["sharp"].search(adverb))
            ev.large = bool(_RX["large"].search(adverb))
            ev.slight = bool(_RX["slight"].search(adverb))
            ev.gentle = bool(_RX["gentle"].search(adverb))
        events.append(ev)
    for kind in ("steady", "gentle", "sharp", "large", "slight", "overall", "sep", "with", "step"):
        for m in _RX[kind].finditer(text):
            if kind in ("sep", "step") or not _taken(used, m.start(), m.end()):
                events.append(_Event(kind, m.start(), m.end()))
                if kind == "step":
                    events[-1].t0 = int(re.findall(r"\d+", m.group(0))[-1]) - base
    for m in _RX["region"].finditer(text):
        if _taken(used, m.start(), m.end()):
            continue
        name = next(_REGION_GROUPS[g] for g, val in m.groupdict().items() if val)
        events.append(_Event("region", m.start(), m.end(), value=name))
    vol = [(m, "high") for m in take("vol_high")] + [(m, "low") for m in take("vol_low")]
    for m, level in vol:
        claim("volatility", m.start(), m.end(), pattern=level)
    for m in take("vol_rev"):
        rev_events.append(_Event("rev", m.start(), m.end()))
    for ev in rev_events:
        claim("volatility", ev.start, ev.end, pattern="reversals")
    events.extend(_Event("revseg", ev.start, ev.end) for ev in rev_events)
    events.sort(key=lambda e: (e.start, -e.end))
    events = [e for k, e in enumerate(events) if not (  # "the minimum falls in the second half": not a move
        e.kind == "dir" and k and events[k - 1].kind == "ext" and not text[events[k - 1].end:e.start].strip())]
    _attach(events)
    claims.extend(_build(events, shapes, text, caption, a))
    claims.sort(key=lambda c: c["start"])
    return claims


def _ext_value(ev: _Event, text: str, used: list[tuple[int, int]]) -> None:
    """The value an extremum states right after it ("a peak of 6.07", "its maximum of 5 at step 0")."""
    vm = _RX["ext_value"].match(text, ev.end)
    if vm:
        ev.ext_value = _num(vm.group("x"))
        used.append((vm.start("x"), vm.end("x")))
        ev.end = vm.end()


def _ratio_degree(m: re.Match[str]) -> str:
    if m.group("pct") or m.group("pct2"):
        return f"pct:{_num(m.group('pct') or m.group('pct2'))}"
    if m.group("frac"):
        return f"pct:{ {'half': 50, 'third': 33.3, 'quarter': 25, 'fifth': 20, 'tenth': 10}[m.group('frac').lower()]}"
    r = (m.group("r") or "halve").lower()
    q = (m.group("q") or "").lower().replace(" ", "")
    base = "x2" if r.startswith("doubl") else "x3" if r.startswith("tripl") else "x0.5"
    return base + ("<" if q in ("nearly", "almost") else ">" if q in ("morethan", "over") else "")


_CARRIERS = ("dir", "ext", "local", "hump", "revseg")


def _attach(events: list[_Event]) -> None:
    """Give each region, step, modifier and "with" to the event it qualifies (same segment: no separator
    between them), the nearest preceding carrier first, else the next one."""
    segment, seg = [], 0
    for ev in events:
        if ev.kind == "sep":
            seg += 1
        segment.append(seg)
        ev.seg = seg
    carriers = [i for i, ev in enumerate(events) if ev.kind in _CARRIERS]

    def owner(i: int, kinds: tuple[str, ...] = _CARRIERS, free: str | None = None) -> int | None:
        before = [j for j in carriers if j < i and segment[j] == segment[i] and events[j].kind in kinds
                  and (free is None or getattr(events[j], free) in (None, False))]
        after = [j for j in carriers if j > i and segment[j] == segment[i] and events[j].kind in kinds
                 and (free is None or getattr(events[j], free) in (None, False))]
        if before:
            return before[-1]
        return after[0] if after else None

    for i, ev in enumerate(events):
        if ev.kind == "region":
            j = owner(i, free="region")
            if j is None and i + 1 < len(events) and all(e.kind in ("sep", "region") for e in events[:i]):
                nxt = [k for k in carriers if k > i]  # "At first, it falls": a region opening the sentence
                j = nxt[0] if nxt and events[nxt[0]].region is None else None
            if j is None and not any(segment[k] == segment[i] for k in carriers):
                prev = [k for k in carriers if k < i and events[k].region is None and events[k].kind == "ext"]
                j = prev[-1] if prev else None  # "the maximum is 190, reached near the end"
            if j is not None:
                events[j].region = ev.value
        elif ev.kind == "step":
            j = owner(i, ("dir", "ext", "local"))
            if j is not None:
                events[j].step, events[j].t0 = True, ev.t0
            for k in carriers:  # a direction next to an explicit step is a position claim's (judges.claims)
                if segment[k] == segment[i] and events[k].kind == "dir":
                    events[k].step = True
        elif ev.kind in ("steady", "gentle", "sharp", "large", "slight", "overall"):
            j = owner(i, ("dir",))
            if j is not None and abs(events[j].start - ev.start) <= 40:
                setattr(events[j], {"steady": "strict"}.get(ev.kind, ev.kind), True)
            elif ev.kind == "steady" and j is None:
                ev.kind, ev.value = "dir", "flat"  # "remains steady", "smooth and steady": flat
        elif ev.kind == "with":
            nxt = [k for k in carriers if k > i and segment[k] == segment[i]]
            if nxt:
                events[nxt[0]].feature = True
    for i in carriers:  # "soars early to its maximum": the move and the extremum it reaches share a place
        ev = events[i]
        if not ev.to_ext:
            continue
        nxt = [k for k in carriers if k > i and events[k].kind == "ext" and segment[k] == segment[i]]
        if nxt and ev.region and not events[nxt[0]].region:
            events[nxt[0]].region = ev.region
        elif nxt and events[nxt[0]].region and not ev.region and ev.kind == "dir":
            ev.region, ev.to_ext, ev.ends_in = events[nxt[0]].region, False, True


def _build(events: list[_Event], shapes: list[tuple[re.Match[str], list[str]]], text: str, caption: str,
           a: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def claim(kind: str, s: int, e: int, **kw: Any) -> None:
        out.append({"text": caption[a + s:a + e], "start": a + s, "end": a + e, "kind": kind, **kw})

    dirs = [e for e in events if e.kind == "dir" and not e.step]
    # extremum claims (and the value an extremum states)
    for ev in events:
        if ev.kind == "ext" and ev.ext_value is not None:
            if ev.step:
                claim("value", ev.start, ev.end, stat=ev.value, value=ev.ext_value, t0=ev.t0)
            else:
                claim("stat", ev.start, ev.end, stat=ev.value, value=ev.ext_value)
        if ev.kind == "ext" and ev.region and not ev.step:
            claim("extremum", ev.start, ev.end, stat=ev.value, region=ev.region,
                  pattern="level" if ev.strict else None)
        if ev.kind == "local" and ev.region and not ev.step:
            claim("stretch", ev.start, ev.end, stat=ev.value, region=ev.region, pattern="local")
    # moves to a stated value
    previous = None
    for ev in events:
        if ev.kind == "dir" and ev.target is not None and not ev.step:
            head = text[:ev.start]
            if ev.source is not None:
                ref, how = ev.source, "move-from"
            else:
                prior = list(_RX["chain_value"].finditer(head))
                ref = previous if previous is not None else (_num(prior[-1].group("x")) if prior else None)
                how = "move"
            claim("stretch", ev.start, ev.end, direction=ev.value, value=ev.target, ref=ref, region=ev.region,
                  pattern=how)
            previous = ev.target
    # overall direction vs stretches vs sequences
    overall = [e for e in dirs if e.overall and e.region is None]
    features = [e for e in dirs if e.feature and e not in overall]
    seq_events = [e for e in events if e.kind in ("dir", "revseg", "hump", "local", "ext")
                  and (not e.step or e.kind == "dir") and e not in overall and not e.feature]
    segs: list[tuple[_Event, str]] = []
    for ev in seq_events:
        if ev.kind == "dir":
            segs.append((ev, ev.value))
        elif ev.kind == "revseg" and segs:
            segs.append((ev, "level"))
        elif ev.kind == "hump" and dirs:
            segs.extend([(ev, "up"), (ev, "down")])
        elif ev.kind == "local" and dirs:
            segs.extend([(ev, "down"), (ev, "up")] if ev.value == "min" else [(ev, "up"), (ev, "down")])
        elif (ev.kind == "ext" and not ev.strict and ev.region
              and any(e.kind == "dir" and e.start > ev.start for e in seq_events)
              and not any(e.kind == "dir" and e.seg == ev.seg for e in seq_events)):
            # "peaks early, then declines", "bottoms out early, peaks late, then eases off": an extremum
            # standing alone between separators, before a stated move, ends a stretch up to it (down to it)
            segs.append((ev, "up" if ev.value == "max" else "down"))
    merged: list[tuple[_Event, str]] = []
    for ev, d in segs:  # consecutive stretches the same way are one ("increases ..., highest near the end")
        if not (merged and merged[-1][1] == d):
            merged.append((ev, d))
    single: list[_Event] = []
    if len(merged) >= 2 and any(ev.kind == "dir" for ev, _ in segs):
        parts = []
        for ev, d in merged:
            tag = d + (f"@{ev.region}" if ev.region and ev.kind in ("dir", "revseg", "ext") else "")
            tag += "^" if ev.region and (ev.kind == "ext" or (ev.kind == "dir" and ev.ends_in)) else ""
            tag += "!" if ev.kind == "dir" and ev.sharp else "~" if ev.kind == "dir" and (ev.gentle or ev.slight) else ""
            parts.append(tag)
        s0, e0 = merged[0][0].start, max(ev.end for ev, _ in merged)
        claim("stretch", s0, e0, pattern="seq:" + ">".join(parts))
    elif shapes and not [e for e in dirs if not e.feature]:
        for m, pattern in shapes:
            claim("stretch", m.start(), m.end(), pattern="seq:" + ">".join(pattern))
    else:
        single = [ev for ev, d in segs if ev.kind == "dir" and ev.target is None and not ev.step]
    for ev in single + features:
        if ev.target is not None or ev.to_ext:
            continue
        if ev.region:
            claim("stretch", ev.start, ev.end, direction=ev.value, region=ev.region,
                  pattern="to" if ev.ends_in else "strict" if ev.strict else "gentle" if (ev.gentle or ev.slight)
                  else "sharp" if ev.sharp else None)
        elif ev.kind == "dir" and not ev.feature:
            overall.append(ev)  # ("with sharp jumps": a feature without a place asserts no direction)
    for ev in overall:
        pattern = ("strict" if ev.strict else None) if ev.value != "flat" else (
            "net" if ev.overall else "level")
        claim("trend", ev.start, ev.end, direction=ev.value, pattern=pattern)
    # magnitudes said of a direction
    for ev in dirs:
        if ev.value == "flat" or not (ev.sharp or ev.slight or ev.large):
            continue
        in_seq = any(ev is s for s, _ in segs) and ev not in single and ev not in overall
        if ev.slight and in_seq and not ev.region:
            continue  # "before dipping slightly" inside a sequence: nothing to measure it against
        claim("magnitude", ev.start, ev.end, direction=ev.value, region=None if ev.target is not None else ev.region,
              degree="sharp" if ev.sharp else "large" if ev.large else "slight",
              pattern="overall" if ev in overall else None)
    return out


# ------------------------------------------------------------------------------------------- checks
def check_shape(claim: ClaimLike, series: Any, tolerance: float = 0.35) -> tuple[str, str]:
    """(colour, reason) of one shape claim against ``series``."""
    sh = measure(series)
    if sh.n < 3:
        return "gray", "series too short for a shape claim"
    kind = claim.kind
    if kind == "hedge":
        return "red", "a hedge: both directions named, nothing asserted"
    fn = {"trend": _check_trend, "extremum": _check_extremum, "stretch": _check_stretch,
          "volatility": _check_volatility, "magnitude": _check_magnitude}.get(kind)
    if fn is None:
        return "gray", "no checkable claim"
    ok, reason = fn(claim, sh, tolerance)
    if ok is None:
        return "gray", reason
    return ("green" if ok else "red"), reason


def _check_trend(claim: ClaimLike, sh: SeriesShape, _tol: float) -> tuple[bool | None, str]:
    d, c, net = claim.direction, sh.c, sh.net
    if sh.rng == 0:
        return d == "flat", "the series is constant"
    disagree = (c > 0) != (net > 0) or net == 0
    why = (f"trend c={c:+.2f} std, last tenth {'above' if net > 0 else 'below' if net < 0 else 'level with'} "
           f"the first (up: c >= {UP_C} and ends above; no clear trend: |c| <= {FLAT_C} or the two disagree)")
    if d == "up":
        ok = c >= UP_C and net > 0
    elif d == "down":
        ok = c <= -UP_C and net < 0
    elif d == "flat":
        ok = abs(c) <= FLAT_C or disagree
        if claim.pattern in ("level", "strict") and ok:
            spread = sh.rng / sh.level if sh.level > 0 else float("inf")
            moves = [x for x in ("up", "down") if _any_stretch(chart(sh), x, LEVEL_MOVE)]
            ok = spread <= LEVEL_SPREAD and not moves
            return ok, (f"{why}; range {spread:.1%} of the level (flat: <= {LEVEL_SPREAD:.0%})"
                        + (f"; a stretch {moves[0]} by {LEVEL_MOVE:.0%} of the range" if moves else ""))
    else:
        return None, "no direction"
    if ok and claim.pattern == "strict" and d in ("up", "down"):
        ok = _feasible(chart(sh), d, 0, chart(sh).n - 1, back=STRICT_BACK)
        why += "; one monotone stretch" if ok else f"; a counter-move over {STRICT_BACK:.0%} of the range"
    return ok, why


def _any_stretch(sh: SeriesShape, d: str, move: float) -> bool:
    """Whether some stretch of the (smoothed) series moves ``d`` by ``move`` of the range."""
    return any(_feasible(sh, d, i, j, move=move) for i in range(sh.n) for j in range(i + 1, sh.n))


def _check_extremum(claim: ClaimLike, sh: SeriesShape, _tol: float) -> tuple[bool | None, str]:
    if claim.region not in REGIONS:
        return None, "no region"
    i0, i1 = sh.span(claim.region)
    seg = sh.u[i0:i1 + 1]
    if claim.pattern == "level":
        ok = bool(seg.max() >= 1 - LEVEL_Q) if claim.stat == "max" else bool(seg.min() <= LEVEL_Q)
        return ok, f"{claim.region} reaches {'top' if claim.stat == 'max' else 'bottom'} quarter: {ok}"
    at = int(sh.u.argmax() if claim.stat == "max" else sh.u.argmin())
    ok = bool(seg.max() >= 1 - TIE) if claim.stat == "max" else bool(seg.min() <= TIE)
    return ok, f"{claim.stat} at step {at} (p={at / (sh.n - 1):.2f}); {claim.region} is steps {i0}-{i1}"


def _tables(sh: SeriesShape) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """[i, j] tables over the smoothed values: max, min, largest fall (drawdown) and largest rise within
    s[i..j] (O(n^2) once per series, so a sequence check is O(stretches * n^2) lookups)."""
    return _tables_of(sh.s.tobytes())


@lru_cache(maxsize=64)
def _tables_of(raw: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    s = np.frombuffer(raw, dtype=float)
    n = len(s)
    hi, lo, fall, rise = (np.full((n, n), np.nan) for _ in range(4))
    for i in range(n):
        tail = s[i:]
        hi[i, i:] = np.maximum.accumulate(tail)
        lo[i, i:] = np.minimum.accumulate(tail)
        fall[i, i:] = np.maximum.accumulate(hi[i, i:] - tail)
        rise[i, i:] = np.maximum.accumulate(tail - lo[i, i:])
    return hi, lo, fall, rise


def _feasible(sh: SeriesShape, d: str, i: int, j: int, *, back: float = BACK, move: float = MOVE) -> bool:
    """Whether the values over [i, j] form one stretch of direction ``d`` (smoothed values for a move, the
    values themselves for a flat stretch, whose spread smoothing would hide)."""
    if j <= i:
        return False
    _, _, fall, rise = _tables(sh)
    s = sh.s
    if d == "up":
        return s[j] - s[i] >= move and fall[i, j] <= back
    if d == "down":
        return s[i] - s[j] >= move and rise[i, j] <= back
    if d == "flat":
        seg = sh.u[i:j + 1]
        span = min(FLAT_SPAN, max(FLAT_MIN, FLAT_PACE * (j - i) / (sh.n - 1)))
        return j - i >= 2 and float(seg.max() - seg.min()) <= span
    if d == "level":
        return abs(s[j] - s[i]) <= LEVEL_NET and j - i >= 2
    return False


def _overlaps(i: int, j: int, r0: int, r1: int) -> bool:
    inter = min(j, r1) - max(i, r0)
    return inter >= 0.5 * max(1, min(j - i, r1 - r0))


def _check_stretch(claim: ClaimLike, sh: SeriesShape, tol: float) -> tuple[bool | None, str]:
    pattern = claim.pattern or ""
    if pattern not in ("move", "move-from"):  # a move to a stated value reads the values themselves
        sh = chart(sh)
    if pattern.startswith("seq:"):
        return _check_sequence(pattern[4:].split(">"), sh)
    if pattern == "local":
        return _check_local(claim, sh)
    if pattern in ("move", "move-from"):
        return _check_move(claim, sh, tol)
    if claim.region not in REGIONS or claim.direction is None:
        return None, "no region or direction"
    r0, r1 = sh.span(claim.region)
    lo, hi = max(0, r0 - 1), min(sh.n - 1, r1 + 1)
    length = r1 - r0
    d = claim.direction
    move = MOVE_GENTLE if pattern == "gentle" else MOVE
    need = 1 if pattern == "sharp" else max(1, int(np.ceil(length / 3)))
    if d == "flat":
        need = max(2, int(np.ceil(length / 3)))
    if pattern == "strict":
        need = max(need, int(np.ceil(2 * length / 3)))
    if pattern == "to":  # a move that reaches the region: it ends there, it may start anywhere before
        for j in range(lo, hi + 1):
            for i in range(j):
                if _feasible(sh, d, i, j, move=move):
                    return True, f"{d} from step {i} to {j}, ending within the {claim.region} (steps {r0}-{r1})"
        return False, f"no {d} stretch ending within the {claim.region} (steps {r0}-{r1})"
    for i in range(lo, hi + 1):
        for j in range(i + need, hi + 1):
            if _feasible(sh, d, i, j, move=move):
                return True, f"{d} from step {i} to {j} within the {claim.region} (steps {r0}-{r1})"
    return False, f"no {d} stretch of >= {need} steps within the {claim.region} (steps {r0}-{r1})"


def _check_sequence(parts: list[str], sh: SeriesShape) -> tuple[bool | None, str]:
    n = sh.n
    segs = []
    for p in parts:
        gentle, sharp, ends_in = "~" in p, "!" in p, "^" in p
        p = p.rstrip("~!^")
        d, _, region = p.partition("@")
        segs.append((d, sh.span(region) if region in REGIONS else None, gentle or sharp, ends_in))
    if len(segs) > max(2, n // 2):
        return None, "more stretches than the series can hold"
    margin = int(np.floor(MARGIN * (n - 1)))
    # a first stretch the caption places ("flat in the second half, before a late recovery") may start anywhere
    # up to its region's end (it must still overlap the region by half); otherwise within the margin
    start_bound = max(margin, segs[0][1][1] - 1 if segs[0][1] and not segs[0][3] else 0)
    end_bound = min(n - 1 - margin, segs[-1][1][1] if segs[-1][1] else n - 1)
    hi, lo, _, _ = _tables(sh)
    reach = np.zeros(n, dtype=bool)
    for i in range(start_bound + 1):  # an uncovered head may not hold a move the caption left out...
        reach[i] = (segs[0][1] is not None and not segs[0][3]) or hi[0, i] - lo[0, i] <= FLAT_SPAN  # ...unless it placed the first
    for d, region, relaxed, ends_in in segs:
        nxt = np.zeros(n, dtype=bool)
        for i in np.flatnonzero(reach):
            for j in range(i + 1, n):
                if nxt[j]:
                    continue
                if region is not None and ends_in and not region[0] - 1 <= j <= region[1] + 1:
                    continue
                if region is not None and not ends_in and not _overlaps(i, j, *region):
                    continue
                if _feasible(sh, d, i, j, move=MOVE_GENTLE if relaxed else MOVE):
                    nxt[j] = True
        reach = nxt
        if not reach.any():
            return False, f"no cut of the window into {' > '.join(parts)}"
    ok = any(reach[j] and (segs[-1][1] is not None or hi[j, n - 1] - lo[j, n - 1] <= FLAT_SPAN)
             for j in range(end_bound, n))
    return ok, ("the window is cut into " if ok else "no cut of the window into ") + " > ".join(parts)


def _check_local(claim: ClaimLike, sh: SeriesShape) -> tuple[bool | None, str]:
    if claim.region not in REGIONS:
        return None, "no region"
    r0, r1 = sh.span(claim.region)
    w = max(2, round(0.25 * (sh.n - 1)))
    u = sh.u
    best = 0.0
    for i in range(max(1, r0 - 1), min(sh.n - 2, r1 + 1) + 1):
        left, right = u[max(0, i - w):i], u[i + 1:i + 1 + w]
        if claim.stat == "min":
            prom = min(left.max(), right.max()) - u[i]
        else:
            prom = u[i] - max(left.min(), right.min())
        best = max(best, float(prom))
    what = "dip" if claim.stat == "min" else "spike"
    return best >= PROMINENCE, f"largest {what} in the {claim.region}: {best:.2f} of the range (needs {PROMINENCE})"


def _check_move(claim: ClaimLike, sh: SeriesShape, tol: float) -> tuple[bool | None, str]:
    v, x, d = sh.v, claim.value, claim.direction
    if x is None or d not in ("up", "down"):
        return None, "no target"
    t = tol * (float(v.std()) or 1.0)
    if claim.ref is not None and claim.pattern == "move" and ((d == "up" and x <= claim.ref) or
                                                               (d == "down" and x >= claim.ref)):
        return False, f"'{'rises' if d == 'up' else 'falls'} to {x:g}' after {claim.ref:g} goes the other way"
    r0, r1 = sh.span(claim.region) if claim.region in REGIONS else (1, sh.n - 1)
    for i in range(max(1, r0 - 1), min(sh.n - 1, r1 + 1) + 1):
        if abs(v[i] - x) > t:
            continue
        before = v[:i]
        came = before.min() <= x - t if d == "up" else before.max() >= x + t
        if claim.pattern == "move-from" and claim.ref is not None:
            came = came and bool(np.any(np.abs(before - claim.ref) <= t))
        if came:
            return True, f"reaches {v[i]:.4g} at step {i} ({'from below' if d == 'up' else 'from above'}) ± {t:.3g}"
    return False, f"never {'rises' if d == 'up' else 'falls'} to {x:g} ± {t:.3g}"


def _check_volatility(claim: ClaimLike, sh: SeriesShape, _tol: float) -> tuple[bool | None, str]:
    if claim.pattern == "reversals":
        return sh.legs >= 3, f"{sh.legs} zigzag legs at {REVERSAL:.0%} of the range (fluctuates: >= 3)"
    if claim.pattern in ("high", "low"):
        volatile = sh.nu >= VOLATILE and sh.curve > CURVE
        ok = volatile if claim.pattern == "high" else not volatile
        return ok, (f"mean step {sh.nu:.3f} of the level, curvature {sh.curve:.2f} (volatile: >= {VOLATILE} "
                    f"and > {CURVE})")
    return None, "unknown volatility claim"


def _sharp_move(sh: SeriesShape, d: str, region: str | None) -> tuple[bool, str]:
    n, u = sh.n, sh.u
    k = max(3, int(np.floor(SHARP_SPAN * (n - 1))))
    r0, r1 = sh.span(region) if region in REGIONS else (0, n - 1)
    best = 0.0
    for j in range(max(1, r0 - 1), min(n - 1, r1 + 1) + 1):
        window = u[max(0, j - k):j]
        move = (u[j] - window.min()) if d == "up" else (window.max() - u[j])
        best = max(best, float(move))
    return best >= SHARP, f"largest {d} move within {k} steps: {best:.2f} of the range (sharp >= {SHARP})"


def _check_magnitude(claim: ClaimLike, sh: SeriesShape, _tol: float) -> tuple[bool | None, str]:
    degree, d, v = claim.degree or "", claim.direction, sh.v
    if degree.startswith(("x", "pct:")):
        if v[0] <= 0 or v[-1] <= 0:
            return None, "a ratio of non-positive values"
        r = float(v[-1] / v[0])
        if degree.startswith("pct:"):
            pct = float(degree[4:])
            got = (r - 1) * 100
            ok = abs(abs(got) - pct) <= max(5.0, 0.25 * pct)
            return ok, f"last/first = {r:.3f} ({got:+.1f}%); stated {pct:g}%"
        target = float(degree[1:].rstrip("<>"))
        bounds = {2.0: (1.8, 2.25), 3.0: (2.7, 3.3), 0.5: (0.4, 0.6)}[target]
        if degree.endswith("<"):
            bounds = (bounds[0] - 0.1 * target, target * 1.02) if target > 1 else (target * 0.98, bounds[1] + 0.1 * target)
        elif degree.endswith(">"):
            bounds = (target, float("inf")) if target > 1 else (0.0, target)
        ok = bounds[0] <= r <= bounds[1]
        return ok, f"last/first = {r:.3f} (x{target:g}: {bounds[0]:.2f}-{bounds[1]:.2f})"
    if d not in ("up", "down"):
        return None, "no direction"
    if degree == "sharp":
        ok, why = _sharp_move(sh, d, claim.region)
        if ok and claim.pattern == "overall":
            ok = sh.c >= UP_C if d == "up" else sh.c <= -UP_C
            why += f"; trend c={sh.c:.2f}"
        return ok, why
    if degree == "large":
        if claim.pattern == "overall":
            ok = sh.c >= LARGE_C if d == "up" else sh.c <= -LARGE_C
            return ok, f"trend c={sh.c:.2f} std (a strong trend: |c| >= {LARGE_C})"
        r0, r1 = sh.span(claim.region) if claim.region in REGIONS else (0, sh.n - 1)
        seg = sh.u[r0:r1 + 1]
        run = seg - np.minimum.accumulate(seg) if d == "up" else np.maximum.accumulate(seg) - seg
        best = float(run.max())
        return best >= LARGE, f"largest {d} move: {best:.2f} of the range (large >= {LARGE})"
    if degree == "slight":
        if claim.region in REGIONS:
            r0, r1 = sh.span(claim.region)
            seg = v[r0:r1 + 1]
            change = float(seg[-1] - seg[0])
            extent = float(seg.max() - seg.min())
        else:
            if not (sh.c >= UP_C if d == "up" else sh.c <= -UP_C):
                return False, f"trend c={sh.c:.2f}: not {d}"
            change = sh.c * float(v.std())
            extent = abs(change)
        if (change > 0) != (d == "up") and abs(change) > 0:
            return False, f"the change is {change:+.4g}: not {d}"
        small = extent <= SLIGHT * sh.rng or extent <= SLIGHT_LEVEL * sh.level
        return small, f"change {abs(change):.4g} vs range {sh.rng:.4g} and level {sh.level:.4g}"
    return None, "unknown magnitude"
