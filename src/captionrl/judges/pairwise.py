"""Pairwise caption judge: which of two captions describes the image better (A, B or Tie).

MoCo Rubric §A.1.4 compares two captions with the image and asks for A, B or Tie, preferring precise,
salient content over style or length. LLM judges favour one position, so every pair is judged in both
orders (``compare_both_orders``): a judge that always answers "A" then gives each caption one win and
one loss, which cancels its bias instead of crowning whichever system was listed first.

Evidence is the image (a VLM judge) or a reference description (a text-only judge such as the embedded
model). Scoring reads the letters' probabilities through ``backend.choose`` (C stands for Tie) or
generates and parses a reply. A failed call, an unparseable reply, or (with ``min_mass``) a reply that
puts almost no probability on A/B/C is *invalid*: excluded from win rates and counted, as the paper
counts the 67 of 31,920 comparisons its evaluator's content filter refused.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from captionrl.backends.base import Backend, ChatRequest, Message, parse_choice
from captionrl.errors import ConfigError, DataError
from captionrl.judges.base import Columns, require_columns
from captionrl.types import Judgment

OPTIONS = ("A", "B", "C")
"""Letters read by ``choose``: A = first caption better, B = second, C = tie."""

Winner = Literal["A", "B", "tie"]

INSTRUCTIONS = (
    "Compare two captions of the same image. Prefer the caption whose content is correct and that "
    "covers the salient details of the image; penalise anything that is not in the image. Judge "
    "precision and information, not style, fluency or length."
)


@dataclass(frozen=True)
class PairwiseConfig:
    """How the pairwise judge sees the evidence and reads its answer."""

    mode: Literal["choose", "generate"] = "choose"
    """``choose``: letter probabilities from one forward pass; ``generate``: reply parsed for A/B/Tie."""
    evidence: Literal["reference", "image"] = "reference"
    """``reference``: a text description stands in for the image (text-only judges); ``image``: VLM."""
    min_mass: float = 0.0
    """With ``choose``: replies whose probability mass on A/B/C is below this are invalid (refusals)."""
    max_new_tokens: int = 16

    def __post_init__(self) -> None:
        if self.mode not in ("choose", "generate"):
            raise ConfigError("pairwise.mode", self.mode, "unknown mode", "use 'choose' or 'generate'")
        if self.evidence not in ("reference", "image"):
            raise ConfigError("pairwise.evidence", self.evidence, "unknown evidence", "use 'reference' or 'image'")
        if not 0.0 <= self.min_mass < 1.0:
            raise ConfigError("pairwise.min_mass", self.min_mass, "must be in [0, 1)", "set e.g. 0.05, or 0 to keep all")


@dataclass(frozen=True)
class Verdict:
    """One ordered comparison: ``winner`` is "A", "B", "tie", or ``None`` when invalid."""

    winner: Winner | None
    method: str
    probs: dict[str, float] | None = None
    mass: float | None = None
    raw: str | None = None
    invalid: str | None = None
    """Why the verdict is invalid: "error", "unparseable" or "low_mass" (``None`` when valid)."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return self.winner is not None


def outcome_for_first(order1: Verdict, order2: Verdict) -> list[float]:
    """Scores of caption x from the two orders (x shown as A, then as B): 1 win, 0.5 tie, 0 loss."""
    out = []
    for v, x_letter in ((order1, "A"), (order2, "B")):
        if v.winner is None:
            continue
        out.append(0.5 if v.winner == "tie" else float(v.winner == x_letter))
    return out


def parse_pairwise(text: str | None) -> Winner | None:
    """Parse "A", "B", "Tie" (or "C") from a reply; ``None`` when it names none or both."""
    if not text:
        return None
    if re.match(r"^\W*(tie|draw|equal|both)\b", text.strip(), re.IGNORECASE):
        return "tie"
    letter = parse_choice(text, OPTIONS)
    if letter is None:
        return "tie" if re.search(r"\b(tie|equally good)\b", text, re.IGNORECASE) else None
    return "tie" if letter == "C" else letter  # type: ignore[return-value]


class PairwiseJudge:
    """A/B/Tie judge over caption pairs; also a Judge (reward) against a ``baseline`` column."""

    name = "pairwise"

    def __init__(self, backend: Backend, config: PairwiseConfig | None = None) -> None:
        self.backend = backend
        self.config = config or PairwiseConfig()

    # ------------------------------------------------------------------ prompts
    def messages(self, a: str, b: str, evidence: Any) -> list[Message]:
        """The comparison prompt; captions come after the evidence so one item's prompts share a prefix."""
        ask = (
            "Which caption is better? Answer with one letter: A if caption A is better, B if caption B "
            "is better, C if they are equally good (a tie)."
            if self.config.mode == "choose"
            else "Which caption is better? Reply with exactly one word: A, B or Tie."
        )
        body = f"Caption A:\n{a.strip() or '(empty)'}\n\nCaption B:\n{b.strip() or '(empty)'}\n\n{ask}"
        if self.config.evidence == "image":
            content: Any = [
                {"type": "image", "image": evidence},
                {"type": "text", "text": f"{INSTRUCTIONS}\n\n{body}"},
            ]
        else:
            content = f"{INSTRUCTIONS}\n\nReference description of the image:\n{evidence}\n\n{body}"
        return [{"role": "user", "content": content}]

    def _check_evidence(self, evidence: Sequence[Any]) -> None:
        for i, ev in enumerate(evidence):
            if ev is None or (isinstance(ev, str) and not ev.strip()):
                fix = (
                    "give every item a 'reference' caption, or use evidence='image' with a VLM judge"
                    if self.config.evidence == "reference"
                    else "give every item an 'image' (path), or use evidence='reference'"
                )
                raise DataError(f"{self.config.evidence}[{i}]", ev, "is missing", fix)

    # ------------------------------------------------------------------ judging
    def decide(self, a: Sequence[str], b: Sequence[str], evidence: Sequence[Any]) -> list[Verdict]:
        """Judge each (A, B) pair in the given order."""
        if not len(a) == len(b) == len(evidence):
            raise DataError("pairs", (len(a), len(b), len(evidence)), "lists differ in length", "pass aligned lists")
        self._check_evidence(evidence)
        prompts = [self.messages(x, y, ev) for x, y, ev in zip(a, b, evidence, strict=True)]
        if self.config.mode == "choose":
            return [self._from_choice(r) for r in self.backend.choose(prompts, OPTIONS)]
        reqs = [ChatRequest(messages=p, max_new_tokens=self.config.max_new_tokens) for p in prompts]
        out = []
        for g in self.backend.generate(reqs):
            if g.text is None:
                out.append(Verdict(None, "generate", raw=None, invalid="error", extra={"error": g.error}))
                continue
            w = parse_pairwise(g.text)
            out.append(Verdict(w, "generate", raw=g.text, invalid=None if w else "unparseable"))
        return out

    def _from_choice(self, r: Any) -> Verdict:
        if r.probs is None:
            return Verdict(None, r.method, raw=r.raw, invalid="error", extra={"error": r.error})
        if r.mass is not None and r.mass < self.config.min_mass:
            return Verdict(None, r.method, probs=r.probs, mass=r.mass, raw=r.raw, invalid="low_mass")
        letter = r.choice
        winner: Winner = "tie" if letter == "C" else letter
        return Verdict(winner, r.method, probs=r.probs, mass=r.mass, raw=r.raw)

    def compare_both_orders(
        self, x: Sequence[str], y: Sequence[str], evidence: Sequence[Any]
    ) -> list[tuple[Verdict, Verdict]]:
        """For each pair: (verdict with x as A, verdict with y as A). One backend call for both orders."""
        n = len(x)
        verdicts = self.decide(list(x) + list(y), list(y) + list(x), list(evidence) * 2)
        return [(verdicts[i], verdicts[n + i]) for i in range(n)]

    def judge(self, captions: Sequence[str], columns: Columns) -> list[Judgment]:
        """Reward: win share of each caption against the ``baseline`` column, both orders averaged."""
        ev_col = self.config.evidence
        require_columns(columns, ["baseline", ev_col], len(captions), self.name)
        pairs = self.compare_both_orders(captions, columns["baseline"], columns[ev_col])
        out = []
        for o1, o2 in pairs:
            scores = outcome_for_first(o1, o2)
            extra = {
                "order1": o1.winner, "order2": o2.winner, "valid_orders": len(scores),
                "p_order1": o1.probs, "p_order2": o2.probs,
            }
            if not scores:
                out.append(Judgment(score=None, method=o1.method, error=f"invalid: {o1.invalid}/{o2.invalid}",
                                    raw=[o1.raw, o2.raw], extra=extra))
                continue
            out.append(Judgment(score=sum(scores) / len(scores), decision=[o1.winner, o2.winner],
                                raw=[o1.raw, o2.raw], method=o1.method, extra=extra))
        return out
