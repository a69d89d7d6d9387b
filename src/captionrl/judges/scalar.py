"""Scalar LLM-as-judge: a grade of the caption, normalised to [0, 1] (the LLM-as-judge baseline).

LineupRL Table 4's "RL, LLM-as-judge" baseline rewards a 1-10 grade; RubiCap reports that such scalar
rewards are hacked by self-praise. Two read-outs, the method recorded in every judgment:
- ``choose``: the grade's probabilities over the single-token digits "1".."9" from one forward pass;
  the score is the expected grade, (E[g] - 1) / 8. ("10" shares its first token with "1", so the
  choose path grades 1-9.)
- ``generate``: the reply is parsed for an integer grade 1-10; score = (g - 1) / 9. No grade -> unscored.

With a reference (``reference`` column) the judge compares against it; otherwise it grades the caption
alone, which is exactly the judge a policy can flatter.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from captionrl.backends.base import Backend, ChatRequest, Message
from captionrl.config import help_field
from captionrl.errors import BackendError, ConfigError, DataError
from captionrl.judges.base import Columns, unscored
from captionrl.types import Judgment

DIGITS = tuple(str(i) for i in range(1, 10))

PROMPT = (
    "Grade the quality of a caption of {subject}: how accurately and completely it describes it.\n"
    "{context}{reference}Caption to grade:\n\"{caption}\"\n\n"
    "Give a grade from {lo} (useless or wrong) to {hi} (accurate and complete). {answer}"
)


@dataclass
class ScalarConfig:
    """How the scalar judge is asked and read."""

    mode: str = help_field("choose", "choose (expected grade over the digits 1..9 from the logits) or generate (parse an integer 1..10)")
    use_reference: bool = help_field(True, "show the item's reference caption (column 'reference') when present")
    max_new_tokens: int = help_field(8, "generate: tokens for the grade")
    subject: str = help_field("an image", "what the captions describe, as the prompt names it (an image, a time series)")
    context_column: str | None = help_field(None, "a column shown to the judge before the caption as what was described (LineupRL's judge baseline: series_text, the values); null = none")

    def __post_init__(self) -> None:
        if self.mode not in ("choose", "generate"):
            raise ConfigError("scalar.mode", self.mode, "unknown mode", "use choose or generate")


def parse_grade(text: str | None, lo: int = 1, hi: int = 10) -> int | None:
    """First integer in ``text`` within [lo, hi] ("8", "Grade: 8/10", "I'd give it 7.")."""
    if not text:
        return None
    for m in re.finditer(r"\d+", text):
        g = int(m.group())
        if lo <= g <= hi:
            return g
    return None


class ScalarJudge:
    """Implements the ``Judge`` protocol; optional column ``reference``."""

    name = "scalar"

    def __init__(self, backend: Backend, cfg: ScalarConfig | None = None) -> None:
        self.backend = backend
        self.cfg = cfg or ScalarConfig()
        self.fallbacks = 0

    def messages(self, caption: str, reference: str | None, mode: str, context: str | None = None) -> list[Message]:
        ctx = f"What the caption describes:\n{context.strip()}\n\n" if context else ""
        ref = f"Reference for {self.cfg.subject}:\n\"{reference.strip()}\"\n\n" if reference else ""
        hi = 9 if mode == "choose" else 10
        answer = "Answer with the digit only." if mode == "choose" else "Reply with the number only."
        body = PROMPT.format(subject=self.cfg.subject, context=ctx, reference=ref, caption=caption.strip() or "(empty)", lo=1, hi=hi, answer=answer)
        return [{"role": "user", "content": body}]

    def judge(self, captions: Sequence[str], columns: Columns) -> list[Judgment]:
        refs: list[str | None] = [None] * len(captions)
        if self.cfg.use_reference and "reference" in columns:
            refs = [str(r) if r else None for r in columns["reference"]]
        ctxs: list[str | None] = [None] * len(captions)
        if self.cfg.context_column:
            if self.cfg.context_column not in columns:
                raise DataError(f"columns.{self.cfg.context_column}", sorted(columns), "the judge's context column is missing",
                                f"give every row a {self.cfg.context_column!r} column, or set scalar.context_column: null")
            ctxs = [str(x) if x else None for x in columns[self.cfg.context_column]]
        if self.cfg.mode == "choose":
            prompts = [self.messages(c, r, "choose", x) for c, r, x in zip(captions, refs, ctxs, strict=True)]
            try:
                results = self.backend.choose(prompts, DIGITS)
            except BackendError as exc:
                # A tokenizer whose digits cannot be read as single first tokens: generate instead, and say so.
                self.fallbacks += 1
                return self._generate(captions, refs, ctxs, note=f"choose unavailable ({exc}); generated")
            out = []
            for r in results:
                if r.probs is None:
                    out.append(unscored(f"judge failed: {r.error}", method=r.method))
                    continue
                expected = sum(int(d) * p for d, p in r.probs.items())
                out.append(Judgment(score=(expected - 1) / 8, decision=r.choice, method=r.method,
                                    extra={"expected_grade": expected, "mass": r.mass}))
            return out
        return self._generate(captions, refs, ctxs)

    def _generate(self, captions: Sequence[str], refs: Sequence[str | None], ctxs: Sequence[str | None],
                  note: str = "") -> list[Judgment]:
        reqs = [ChatRequest(self.messages(c, r, "generate", x), max_new_tokens=self.cfg.max_new_tokens)
                for c, r, x in zip(captions, refs, ctxs, strict=True)]
        out = []
        for g in self.backend.generate(reqs):
            if g.text is None:
                out.append(unscored(f"judge failed: {g.error}", method="generate"))
                continue
            grade = parse_grade(g.text)
            if grade is None:
                out.append(Judgment(score=None, raw=g.text, method="generate", error="no grade 1-10 in the reply",
                                    reason=note))
                continue
            out.append(Judgment(score=(grade - 1) / 9, decision=grade, raw=g.text, method="generate", reason=note,
                                extra={"grade": grade}))
        return out
