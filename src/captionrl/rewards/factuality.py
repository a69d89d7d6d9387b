"""The factuality reward term: the span audit's code checks, turned into a penalty on contradicted claims.

A caption's claims (a value at a step or over an interval, a statistic, a trend, a length) are extracted by
rules (``judges.claims.extract_rules``, the default) or by an LLM (``extract_llm``, when a capable model is
served: a ``backend``), and each is checked by code against the series within
``tolerance`` standard deviations. The term is ``weight * red_share - bonus * green_share``: the share of
claims the series contradicts, less (optionally) the share it supports. The bonus is there because a penalty
alone teaches a small policy little in a few steps: most of its samples state wrong values, and a sample that
gets one right stands out only by what it avoided; the bonus pays the right value itself. It pays only
code-checked agreement with the series, so no probe (a number dump, generic praise, another item's caption)
collects it. An LLM extraction that fails falls back to the rules for that caption (counted in
``llm_fallbacks``), so the term is always defined and never silently 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from captionrl.judges.claims import Factuality, extract_llm, factuality

EXTRACTORS = ("rules", "llm")


@dataclass
class FactualityTerm:
    """``weight * red_share - bonus * green_share`` per caption, extracting claims by rules, or by an LLM on
    ``backend`` when one is given. Built from the validated settings by ``ShapingConfig.factuality_term``
    (their one declaration), so it holds no defaults or checks of its own."""

    weight: float
    bonus: float
    tolerance: float
    backend: Any = None
    index_base: int = 0
    llm_fallbacks: int = 0

    @property
    def extractor(self) -> str:
        return "rules" if self.backend is None else "llm"

    @property
    def enabled(self) -> bool:
        return self.weight > 0 or self.bonus > 0

    def findings(self, captions: Sequence[str], series: Sequence[Any]) -> list[Factuality]:
        """Colour counts of every caption's claims against its series."""
        claims: list[Any] = [None] * len(captions)
        if self.extractor == "llm":
            got = extract_llm(self.backend, list(captions), index_base=self.index_base)
            claims = [c for c, _ in got]
            self.llm_fallbacks += sum(c is None for c in claims)
        return [factuality(cap, s, claims=cl, tolerance=self.tolerance, index_base=self.index_base)
                for cap, s, cl in zip(captions, series, claims, strict=True)]

    def penalty(self, finding: Factuality) -> float:
        """What the term takes from the reward (negative when supported claims outweigh contradicted ones)."""
        return self.weight * finding.red_share - self.bonus * finding.green_share
