"""Blind ranking judge (MoCo Rubric §A.1.5): several unnamed captions of one image scored together.

The judge sees the captions as "Caption 1..n" (the caller shuffles them, seeded, so no system owns a
position) and scores each on accuracy, completeness, clarity (0-10, higher is better) and a
hallucination penalty (0-10, higher is worse); total = (accuracy + completeness + clarity) / 3
- 1.5 · hallucination_penalty, and the captions are ranked by total.

Two read-outs, recorded in every result:
- ``generate`` (the paper's): one JSON reply for all captions, validated (every caption exactly once,
  every field a number in range); a reply that fails validation leaves the whole item unscored.
- ``choose``: one letter-scoring question per (caption, criterion) over the digits "0".."9"; each score
  is the expected digit (0-9 scale). Always valid, and usable with small judges that cannot write JSON.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from captionrl.backends.base import Backend, ChatRequest, Message
from captionrl.config import help_field
from captionrl.errors import ConfigError, DataError

CRITERIA = ("accuracy", "completeness", "clarity", "hallucination_penalty")
DIGITS = tuple(str(i) for i in range(10))
SCALE = 10.0

INSTRUCTIONS = (
    "You are shown {n} captions of the same image, numbered 1 to {n}, and {evidence}. Score every caption on:\n"
    "- accuracy (0-10): are its statements correct?\n"
    "- completeness (0-10): does it cover the important content?\n"
    "- clarity (0-10): is it clear and well organised?\n"
    "- hallucination_penalty (0-10): how much does it describe things that are not in the image? (0 = none)\n"
)
JSON_ASK = (
    "Reply with JSON only, in this form:\n"
    '{{"captions": [{{"id": 1, "accuracy": 7, "completeness": 6, "clarity": 8, "hallucination_penalty": 1}}, ...]}}\n'
    "with one entry for each of the {n} captions."
)
CHOOSE_ASK = "Give caption {j}'s {criterion} score from 0 to 9. Answer with one digit only."


def total_score(s: dict[str, float]) -> float:
    """The paper's total: (accuracy + completeness + clarity) / 3 - 1.5 · hallucination_penalty."""
    return (s["accuracy"] + s["completeness"] + s["clarity"]) / 3.0 - 1.5 * s["hallucination_penalty"]


@dataclass
class RankConfig:
    """How the ranking judge is asked and read."""

    mode: str = help_field("generate", "generate (the paper's validated JSON reply) or choose (expected digit per caption and criterion)")
    evidence: str = help_field("reference", "reference (text-only judge reads the reference caption) or image (VLM judge)")
    max_new_tokens: int = help_field(400, "generate: tokens for the JSON reply")

    def __post_init__(self) -> None:
        if self.mode not in ("generate", "choose"):
            raise ConfigError("rank.mode", self.mode, "unknown mode", "use generate or choose")
        if self.evidence not in ("reference", "image"):
            raise ConfigError("rank.evidence", self.evidence, "unknown evidence", "use reference or image")


@dataclass
class RankResult:
    """Scores of one item's captions (in the order shown), or ``scores=None`` with ``error`` when invalid."""

    scores: list[dict[str, float]] | None
    method: str
    raw: Any = None
    error: str | None = None
    totals: list[float] = field(default_factory=list)


def validate_reply(text: str | None, n: int, scale: float = SCALE) -> tuple[list[dict[str, float]] | None, str | None]:
    """Parse and validate a JSON ranking reply: (scores in caption order, None) or (None, why invalid)."""
    if not text:
        return None, "empty reply"
    data = _first_json(text)
    if data is None:
        return None, "no JSON in the reply"
    entries = data.get("captions", data.get("scores")) if isinstance(data, dict) else data
    if not isinstance(entries, list):
        return None, "JSON has no 'captions' list"
    if len(entries) != n:
        return None, f"{len(entries)} entries for {n} captions"
    out: list[dict[str, float] | None] = [None] * n
    for pos, e in enumerate(entries):
        if not isinstance(e, dict):
            return None, f"entry {pos} is not an object"
        cid = e.get("id", pos + 1)
        if isinstance(cid, str) and cid.strip().isdigit():
            cid = int(cid.strip())
        if not isinstance(cid, int) or not 1 <= cid <= n or out[cid - 1] is not None:
            return None, f"entry {pos} has a missing, out-of-range or repeated id {cid!r}"
        scores = {}
        for c in CRITERIA:
            v = e.get(c)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= scale:
                return None, f"caption {cid}: {c}={v!r} is not a number in [0, {scale:g}]"
            scores[c] = float(v)
        out[cid - 1] = scores
    return out, None  # type: ignore[return-value]


def _first_json(text: str) -> Any:
    dec = json.JSONDecoder()
    for i, ch in enumerate(text):
        if ch in "{[":
            try:
                obj, _end = dec.raw_decode(text[i:])
                return obj
            except json.JSONDecodeError:
                continue
    return None


class RankJudge:
    """Scores n shown captions per item; the caller owns shuffling and the mapping back to systems."""

    name = "rank"

    def __init__(self, backend: Backend, cfg: RankConfig | None = None) -> None:
        self.backend = backend
        self.cfg = cfg or RankConfig()

    def _preamble(self, captions: Sequence[str], evidence: Any) -> tuple[str, Any]:
        n = len(captions)
        ev_text = "a reference description of the image" if self.cfg.evidence == "reference" else "the image"
        listing = "\n\n".join(f"Caption {j + 1}:\n{c.strip() or '(empty)'}" for j, c in enumerate(captions))
        head = INSTRUCTIONS.format(n=n, evidence=ev_text)
        if self.cfg.evidence == "reference":
            return f"{head}\nReference description:\n{evidence}\n\n{listing}\n\n", None
        return f"{head}\n{listing}\n\n", evidence

    def _message(self, text: str, image: Any) -> list[Message]:
        if image is None:
            return [{"role": "user", "content": text}]
        return [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": text}]}]

    def score(self, items: Sequence[Sequence[str]], evidence: Sequence[Any]) -> list[RankResult]:
        """Score each item's captions (as shown); one result per item."""
        for i, ev in enumerate(evidence):
            if ev is None or (isinstance(ev, str) and not ev.strip()):
                raise DataError(f"{self.cfg.evidence}[{i}]", ev, "is missing",
                                f"give every item a '{self.cfg.evidence}' (or change the evidence setting)")
        if self.cfg.mode == "generate":
            return self._generate(items, evidence)
        return self._choose(items, evidence)

    def _generate(self, items: Sequence[Sequence[str]], evidence: Sequence[Any]) -> list[RankResult]:
        reqs = []
        for caps, ev in zip(items, evidence, strict=True):
            text, image = self._preamble(caps, ev)
            reqs.append(ChatRequest(self._message(text + JSON_ASK.format(n=len(caps)), image),
                                    max_new_tokens=self.cfg.max_new_tokens))
        out = []
        for caps, g in zip(items, self.backend.generate(reqs), strict=True):
            if g.text is None:
                out.append(RankResult(None, "generate", error=f"backend: {g.error}"))
                continue
            scores, why = validate_reply(g.text, len(caps))
            out.append(RankResult(scores, "generate", raw=g.text, error=why,
                                  totals=[total_score(s) for s in scores] if scores else []))
        return out

    def _choose(self, items: Sequence[Sequence[str]], evidence: Sequence[Any]) -> list[RankResult]:
        prompts, index = [], []
        for i, (caps, ev) in enumerate(zip(items, evidence, strict=True)):
            text, image = self._preamble(caps, ev)
            for j in range(len(caps)):
                for c in CRITERIA:
                    ask = CHOOSE_ASK.format(j=j + 1, criterion=c.replace("_", " "))
                    prompts.append(self._message(text + ask, image))
                    index.append((i, j, c))
        results = self.backend.choose(prompts, DIGITS)
        table: list[list[dict[str, float]]] = [[{} for _ in caps] for caps in items]
        errors: dict[int, str] = {}
        for (i, j, c), r in zip(index, results, strict=True):
            if r.probs is None:
                errors.setdefault(i, f"backend: {r.error}")
                continue
            table[i][j][c] = sum(int(d) * p for d, p in r.probs.items())
        method = results[0].method if results else "logits"
        out = []
        for i in range(len(items)):
            if i in errors:
                out.append(RankResult(None, method, error=errors[i]))
            else:
                out.append(RankResult(table[i], method, totals=[total_score(s) for s in table[i]]))
        return out
