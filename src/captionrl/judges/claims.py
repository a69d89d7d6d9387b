"""Claims of a caption about a series, extracted by rules (or an LLM) and checked by code.

This is the judgment core of the span audit (LineupRL Figure 4), of the factuality reward term, of the
``claims:rules`` verifier and of ``judges.key_facts``. A caption is split into clauses, each clause gives at
most one number claim (a value at a step, a value over an interval, a statistic, a position, a length), and
each sentence gives its shape claims (``judges.shape_claims``: overall direction, hedges, extrema with their
position, stretches and turning points, volatility, magnitudes); ``check`` colours each against the series:

- **green**: the series supports the claim (a magnitude within ``tolerance`` standard deviations there; a
  position or shape within the tolerances of ``judges.shape_claims``);
- **blue**: a position or reference with nothing checkable asserted ("at step 5", "has 16 points": every
  window of a run has the same length, so a right length is no evidence about this series);
- **red**: a claim the series contradicts, and a hedge ("rises or falls"), which asserts nothing while
  looking like an answer;
- **gray**: no checkable claim.

It lives in ``judges/`` (below ``rewards`` and ``eval``) so that training rewards and evaluation tables
use one code path. Steps are 0-based unless ``index_base=1``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np

from captionrl.judges.shape_claims import SHAPE_KINDS, check_shape, extract_shape

COLOURS = ("green", "blue", "red", "gray")
KINDS = ("value", "position", "trend", "stat", "length", "none")
"""Kinds an LLM extractor may return (``validate_claims``); the rules also return ``SHAPE_KINDS``."""
ALL_KINDS = (*KINDS, *(k for k in SHAPE_KINDS if k not in KINDS))
STATS = ("max", "min", "mean", "std", "start", "end")


@dataclass(frozen=True)
class Claim:
    """One checkable statement: where it is in the caption and what it asserts."""

    text: str
    start: int
    end: int
    kind: str = "none"          # value | position | stat | length | none, or a shape kind (SHAPE_KINDS)
    value: float | None = None  # the stated magnitude (a move's target for a stretch "rises to X")
    t0: int | None = None       # the step (or interval start) it points at
    t1: int | None = None       # interval end (inclusive); None for a single step
    stat: str | None = None     # max | min | mean | std | start | end
    direction: str | None = None  # up | down | flat
    colour: str = "gray"
    reason: str = ""
    region: str | None = None   # shape claims: a named region of the window (shape_claims.REGIONS)
    pattern: str | None = None  # shape claims: the reading (net, level, strict, seq:up>down, local, move...)
    degree: str | None = None   # magnitude claims: slight | sharp | x2 | x0.5 | pct:40 ...
    ref: float | None = None    # move claims: the value the move starts from (stated before it)


# ------------------------------------------------------------------------------------- rule extractor
_NUM = r"-?\d+(?:,\d{3})*(?:\.\d+)?"
_STEP = r"(?:steps?|t\s*=|time(?:\s*step)?s?|index|indices|positions?|points?|x\s*=)"
_RANGE = re.compile(rf"(?:from|between|over)\s+{_STEP}\s*(\d+)\s*(?:to|and|until|through|-|–)\s*(?:{_STEP}\s*)?(\d+)",
                    re.I)
_RANGE2 = re.compile(rf"{_STEP}\s*(\d+)\s*(?:-|–|to)\s*(\d+)", re.I)
_POINT = re.compile(rf"(?:at|around|near|by|on|in)?\s*{_STEP}\s*(\d+)", re.I)
_STARTS = re.compile(rf"\b(?:starts?|started|begins?|began|opens?|opened|starting|beginning)\b[^.;]*?\b(?:at|from|with|of|around)\s+({_NUM})"
                     rf"|\b(?:first|initial|opening|starting)\s+(?:value|point|reading)\s+(?:is|was|of|at|:|=)\s*({_NUM})", re.I)
_ENDS = re.compile(rf"\b(?:ends?|ended|finish(?:es|ed)?|closes?|closed|ending|finishing)\b[^.;]*?\b(?:at|with|on|of|around)\s+({_NUM})"
                   rf"|\b(?:last|final|closing|ending)\s+(?:value|point|reading)\s+(?:is|was|of|at|:|=)\s*({_NUM})", re.I)
_LENGTH = re.compile(r"\b(\d+)\s+(?:points|values|steps|observations|time steps)\b", re.I)
_STAT_WORDS = {
    "max": r"\b(?:max(?:imum)?|peak(?:s|ed|ing)?|highest|high point|top)\b",
    "min": r"\b(?:min(?:imum)?|trough|lowest|low point|bottom(?:s)?)\b",
    "mean": r"\b(?:mean|average)\b",
    "std": r"\b(?:standard deviation|std|variability of)\b",
}
_TREND = {
    "up": r"\b(?:ris(?:e|es|ing)|rose|increas(?:e|es|ing|ed)|climb(?:s|ing|ed)?|grow(?:s|ing)?|upward|goes up)\b",
    "down": r"\b(?:fall(?:s|ing)?|fell|declin(?:e|es|ing|ed)|decreas(?:e|es|ing|ed)|drop(?:s|ping|ped)?|downward|goes down)\b",
    "flat": r"\b(?:flat|stable|steady|unchanged|constant)\b",
}
_SPLIT = re.compile(r"(?<=[.;!?])\s+|,\s+(?:and|but|while|whereas|then|before|after)\s+"
                    r"|\s+(?:and then|while|before|after)\s+|,?\s+and\s+(?=(?:the|it|its|ends?|ended|finish(?:es|ed)?|closes?|closed|then)\b)"
                    r"|,\s+(?=(?:ends?|ended|ending|finish(?:es|ed)?|closes?|closed)\s+(?:at|with|on|around)\b)", re.I)
# (the last: "starts at 25.92, ends at 28.11, and ...", the main job's answer, holds two values)


def clauses(caption: str) -> list[tuple[int, int]]:
    """Character spans of the caption's clauses (sentences, split further at ', and' / ', while'...)."""
    spans, pos = [], 0
    for m in _SPLIT.finditer(caption):
        if m.start() > pos:
            spans.append((pos, m.start()))
        pos = m.end()
    if pos < len(caption):
        spans.append((pos, len(caption)))
    return [(a, b) for a, b in spans if caption[a:b].strip()]


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def extract_rules(caption: str, index_base: int = 0) -> list[Claim]:
    """Deterministic claims: one number claim per clause (a clause with no checkable content is a gray
    claim) and the shape claims of each sentence (``judges.shape_claims``), in caption order. Cached by
    caption: the claims verifier checks one caption against K candidates, a group repeats captions."""
    return list(_extract_rules(caption, index_base))


@lru_cache(maxsize=8192)
def _extract_rules(caption: str, index_base: int) -> tuple[Claim, ...]:
    base = []
    for a, b in clauses(caption):
        c = _clause_claim(caption[a:b], a, b, index_base)
        if c.kind == "trend":  # direction words are read, in context, by the shape rules
            c = replace(c, kind="none", direction=None)
        base.append(c)
    shape = [Claim(**kw) for kw in extract_shape(caption, index_base)]
    stated = {(c.value, c.t0) for c in base if c.value is not None}
    shape = [c for c in shape if c.kind not in ("value", "stat") or (c.value, c.t0) not in stated]
    base = [c for c in base if c.kind != "none" or not any(c.start < s.end and s.start < c.end for s in shape)]
    return tuple(sorted(base + shape, key=lambda c: (c.start, c.end)))


def _clause_claim(text: str, a: int, b: int, base: int) -> Claim:
    claim = Claim(text=text, start=a, end=b)
    used: list[tuple[int, int]] = []
    t0 = t1 = None
    m = _RANGE.search(text) or _RANGE2.search(text)
    if m:
        t0, t1 = int(m.group(1)) - base, int(m.group(2)) - base
        used.append(m.span())
    else:
        m = _POINT.search(text)
        if m:
            t0 = int(m.group(1)) - base
            used.append(m.span())
    stat = next((s for s, pat in _STAT_WORDS.items() if re.search(pat, text, re.I)), None)
    direction = next((d for d, pat in _TREND.items() if re.search(pat, text, re.I)), None)
    starts, ends, length = _STARTS.search(text), _ENDS.search(text), _LENGTH.search(text)
    if t0 is not None and (starts or ends) and used[0][0] > max(m.end() for m in (starts, ends) if m):
        # "starts at 20.85, climbs to a maximum of 25.55 around step 8": the step belongs to a later number
        # (the shape rules read "a maximum of 25.55 around step 8"); the clause's claim is the start
        t0 = t1 = None
    if starts and t0 is None and not ends:
        return replace(claim, kind="value", value=_num(starts.group(1) or starts.group(2)), stat="start")
    if ends and t0 is None and not starts:
        return replace(claim, kind="value", value=_num(ends.group(1) or ends.group(2)), stat="end")
    if starts and ends and t0 is None:  # "starts at 3 and ends at 7" in one clause: keep the start
        return replace(claim, kind="value", value=_num(starts.group(1) or starts.group(2)), stat="start",
                       reason="two values in one clause; the first is checked")
    values = [mm for mm in re.finditer(_NUM, text) if not any(u0 <= mm.start() < u1 for u0, u1 in used)]
    if length and t0 is None and not stat:
        return replace(claim, kind="length", value=float(length.group(1)))
    if values and (t0 is not None or stat in ("max", "min", "mean", "std")):
        return replace(claim, kind="value" if t0 is not None else "stat", value=_num(values[0].group(0)),
                       t0=t0, t1=t1, stat=stat, direction=direction)
    if t0 is not None:
        return replace(claim, kind="position", t0=t0, t1=t1, stat=stat, direction=direction)
    if direction:
        return replace(claim, kind="trend", direction=direction)
    return claim


# ---------------------------------------------------------------------------------------------- check
def _slope_direction(v: np.ndarray) -> str:
    if len(v) < 2:
        return "flat"
    slope = float(np.polyfit(np.arange(len(v), dtype=float), v, 1)[0])
    change = slope * (len(v) - 1) / (float(v.std()) or 1.0)
    return "up" if change > 0.5 else "down" if change < -0.5 else "flat"


def check(claim: Claim, series: np.ndarray, tolerance: float = 0.35) -> Claim:
    """Colour one claim by comparing it with the series (see module doc for the rules)."""
    v = np.asarray(series, dtype=float)
    n, sigma = len(v), float(v.std()) or 1.0
    tol = tolerance * sigma

    def out(colour: str, reason: str) -> Claim:
        return replace(claim, colour=colour, reason=reason)

    if claim.kind == "none":
        return out("gray", "no checkable claim")
    if claim.kind in SHAPE_KINDS:
        return out(*check_shape(claim, v, tolerance))
    for t in (claim.t0, claim.t1):
        if t is not None and not 0 <= t < n:
            return out("red", f"step {t} is outside the series (0..{n - 1})")
    if claim.kind == "length":
        ok = int(claim.value or -1) == n
        return out("blue" if ok else "red", f"series has {n} points")
    if claim.t0 is not None:
        lo, hi = sorted((claim.t0, claim.t1 if claim.t1 is not None else claim.t0))
        seg = v[lo : hi + 1]
        where = f"step {lo}" if lo == hi else f"steps {lo}-{hi}"
        if claim.value is not None:
            ok = seg.min() - tol <= claim.value <= seg.max() + tol
            return out("green" if ok else "red",
                       f"{claim.value:g} vs {where} range [{seg.min():.4g}, {seg.max():.4g}] ± {tol:.3g}")
        if claim.stat in ("max", "min"):
            k = max(1, n // 10)
            near = v[max(0, lo - k) : hi + k + 1]
            ok = seg.max() >= near.max() - tol if claim.stat == "max" else seg.min() <= near.min() + tol
            return out("green" if ok else "red", f"{claim.stat} at {where}: local {claim.stat} check")
        if claim.direction and hi > lo:
            got = _slope_direction(seg)
            return out("green" if got == claim.direction else "red", f"direction over {where} is {got}")
        return out("blue", f"position {where} without magnitude")
    if claim.kind in ("value", "stat") and claim.value is not None:
        ref = {"start": v[0], "end": v[-1], "max": v.max(), "min": v.min(), "mean": v.mean(),
               "std": v.std()}.get(claim.stat or "")
        if ref is None:
            return out("gray", "a number not tied to a position or statistic")
        ok = abs(claim.value - float(ref)) <= tol
        return out("green" if ok else "red", f"{claim.stat} is {float(ref):.4g}; stated {claim.value:g} ± {tol:.3g}")
    return out("gray", "no checkable claim")


# ------------------------------------------------------------------------------------- LLM extractor
LLM_PROMPT = (
    "Split the caption of a time series into its claims. Return only a JSON list; one object per claim:\n"
    '{{"text": exact words copied from the caption, "kind": one of "value", "position", "trend", "stat", '
    '"length", "none", "value": number or null, "t0": step or null, "t1": last step of a range or null, '
    '"stat": one of "max", "min", "mean", "std", "start", "end" or null, "direction": "up", "down", "flat" '
    "or null}}\nSteps count from {base}.\n\nCaption:\n{caption}"
)


def validate_claims(caption: str, data: Any) -> list[Claim]:
    """Schema check of an LLM's claims; raises ``ValueError`` naming the first problem."""
    if not isinstance(data, list):
        raise ValueError("top level is not a list")
    if caption.strip() and not data:
        raise ValueError("no claims for a non-empty caption (irrelevant text is a claim of kind 'none')")
    out = []
    for k, obj in enumerate(data):
        if not isinstance(obj, dict):
            raise ValueError(f"claim {k} is not an object")
        text = obj.get("text")
        if not isinstance(text, str) or not text.strip() or text not in caption:
            raise ValueError(f"claim {k}: 'text' is not an exact substring of the caption")
        kind = obj.get("kind", "none")
        if kind not in KINDS:
            raise ValueError(f"claim {k}: kind {kind!r} not in {KINDS}")
        vals: dict[str, Any] = {}
        for key, typ in (("value", (int, float)), ("t0", (int,)), ("t1", (int,))):
            x = obj.get(key)
            if x is not None and (isinstance(x, bool) or not isinstance(x, typ)):
                raise ValueError(f"claim {k}: {key}={x!r} is not a number")
            vals[key] = x
        stat, direction = obj.get("stat"), obj.get("direction")
        if stat is not None and stat not in STATS:
            raise ValueError(f"claim {k}: stat {stat!r} not in {STATS}")
        if direction is not None and direction not in ("up", "down", "flat"):
            raise ValueError(f"claim {k}: direction {direction!r} invalid")
        start = caption.find(text)
        out.append(Claim(text=text, start=start, end=start + len(text), kind=kind,
                         value=None if vals["value"] is None else float(vals["value"]), t0=vals["t0"],
                         t1=vals["t1"], stat=stat, direction=direction))
    return out


def parse_json_list(text: str | None) -> Any:
    if not text:
        raise ValueError("empty reply")
    a, b = text.find("["), text.rfind("]")
    if a < 0 or b <= a:
        raise ValueError("no JSON list in the reply")
    return json.loads(text[a : b + 1])


def extract_llm(backend: Any, captions: Sequence[str], index_base: int = 0, retries: int = 2,
                max_new_tokens: int = 512) -> list[tuple[list[Claim] | None, dict[str, Any]]]:
    """LLM claims per caption, validated; each failure is retried with sampling (seeded), then unscored."""
    from captionrl.backends.base import ChatRequest

    results: list[tuple[list[Claim] | None, dict[str, Any]]] = [(None, {"attempts": 0, "errors": []})] * len(captions)
    pending = list(range(len(captions)))
    for attempt in range(retries + 1):
        if not pending:
            break
        reqs = [ChatRequest(messages=[{"role": "user", "content": LLM_PROMPT.format(base=index_base, caption=captions[i])}],
                            max_new_tokens=max_new_tokens, temperature=0.0 if attempt == 0 else 0.7,
                            seed=attempt) for i in pending]
        gens = backend.generate(reqs)
        still = []
        for i, g in zip(pending, gens, strict=True):
            info = {"attempts": attempt + 1, "errors": [*results[i][1]["errors"]], "raw": g.text}
            try:
                if g.text is None:
                    raise ValueError(g.error or "generation failed")
                claims = validate_claims(captions[i], parse_json_list(g.text))
                results[i] = (claims, info)
            except (ValueError, json.JSONDecodeError) as exc:
                info["errors"].append(str(exc))
                results[i] = (None, info)
                still.append(i)
        pending = still
    return results


# ------------------------------------------------------------------------------------------- the run
def audit(caption: str, series: np.ndarray, claims: Sequence[Claim], tolerance: float = 0.35) -> dict[str, Any]:
    """Colour the claims; shares by claim count and by characters (text in no claim counts as gray)."""
    checked = [check(c, series, tolerance) for c in claims]
    chars = dict.fromkeys(COLOURS, 0)
    covered = np.zeros(len(caption), dtype=bool)
    for c in checked:
        seg = ~covered[c.start : c.end]
        chars[c.colour] += int(seg.sum())
        covered[c.start : c.end] = True
    chars["gray"] += sum(1 for i, ch in enumerate(caption) if not covered[i] and not ch.isspace())
    total = max(1, sum(chars.values()))
    n = max(1, len(checked))
    return {"claims": [asdict(c) for c in checked],
            "share": {k: sum(c.colour == k for c in checked) / n for k in COLOURS},
            "char_share": {k: chars[k] / total for k in COLOURS}}


# ------------------------------------------------------------------------------------- factuality
@dataclass(frozen=True)
class Factuality:
    """Colour counts of one caption's claims: the factuality reward term and the final checks read it."""

    claims: int      # every clause with content (gray ones included)
    green: int
    blue: int
    red: int
    gray: int

    @property
    def checkable(self) -> int:
        """Claims the series can confirm or contradict (not gray)."""
        return self.green + self.blue + self.red

    @property
    def red_share(self) -> float:
        """Contradicted claims over checkable ones: padding with uncheckable text cannot dilute it."""
        return self.red / self.checkable if self.checkable else 0.0

    @property
    def green_share(self) -> float:
        return self.green / self.checkable if self.checkable else 0.0


def factuality(caption: str, series: Any, claims: Sequence[Claim] | None = None, tolerance: float = 0.35,
               index_base: int = 0) -> Factuality:
    """Check ``caption``'s claims (rule-extracted unless ``claims`` are given) against ``series``."""
    v = np.asarray(series, dtype=float)
    found = list(claims) if claims is not None else extract_rules(caption, index_base)
    colours = [check(c, v, tolerance).colour for c in found] if len(v) else ["gray"] * len(found)
    return Factuality(claims=len(found), **{k: colours.count(k) for k in COLOURS})
