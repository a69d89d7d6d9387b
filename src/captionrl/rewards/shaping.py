"""Reward shaping around any judge's score: ``base - length - transcription - factuality``.

``rewards.reward.Reward`` applies it to its judge's scores; every face (TRL, the service, the engine
adapters) reads the shaped result. It is part of the one reward, not extra TRL reward functions: TRL sums
several reward functions with ``nansum`` and treats a row as unscored only when *all* of them return ``None``, so a separate penalty function would turn
a verifier failure into a penalty-only score (a silent 0 the policy learns from). The wrapper subtracts its
penalties only from scored captions and leaves a failed base judgment ``None``.

Terms, each carried in the shaped judgment's ``extra`` (``terms``) and logged by the faces (``shaping/*``
metrics of the TRL face, ``extra_logs`` of the engines):

- length: ``length_penalty`` per 100 characters above ``max_caption_chars``, and ``unfinished_penalty``
  when the caption does not end a sentence (cut by the token budget);
- transcription (``judges.transcription``): copied series values beyond an allowance counted in values,
  and any run of consecutive values; applies where the rows carry a ``series`` column;
- factuality (``rewards.factuality``): ``weight * share of contradicted claims - bonus * share of supported
  claims``; series rows only;
- description (``coverage_bonus``, ``wrong_fact_penalty``, ``degenerate_penalty``; ``judges.key_facts``):
  + the distinct key facts the caption gets right (direction, start, end, extrema with positions, ...), up
  to ``coverage_target``, less the ones the series contradicts (a hedge is one), and a penalty for a
  degenerate caption (a bare number, a few words, the instruction echoed); series rows only. It pays
  describing: the factuality bonus pays a share, which one copied value fills;
- the base of a false claim (``false_claim_base``): a caption that states a key fact its series contradicts
  keeps its base score (``full``), at most chance's (``chance``: ``lam / k``, what a lineup pays a caption that
  tells its candidates nothing apart) or none of it (``none``). A named value copied from the series tells the
  true window from lineup candidates that share its start, end and trend whether or not it is the extreme the
  caption calls it, so under ``full`` the lineup pays a false claim about as much as a true one; series rows
  only;
- numbers-masked pass (``masked_weight > 0``): the base reward also scores the caption with its numbers
  masked, and the base becomes ``(1 - w) * base + w * masked``: a caption that is identifiable only through
  copied numbers loses that part. A failed masked judgment leaves the caption unscored (``None``).

"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from captionrl.config import help_field
from captionrl.errors import ConfigError
from captionrl.judges.key_facts import KeyFacts, key_facts, with_labelled_direction
from captionrl.judges.transcription import Transcription, TranscriptionConfig, parse_shown, transcription
from captionrl.rewards.factuality import EXTRACTORS, FactualityTerm

DIRECTION_RULES = ("claims", "label")
"""``direction_rule``'s values: the claim checker's tolerance, or the window's one label."""
FALSE_CLAIM_BASES = ("full", "chance", "none")
"""``false_claim_base``'s values: the base a caption with a contradicted key fact keeps."""

MASK_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
MASK = "#"


def mask_numbers(caption: str) -> str:
    """The caption with every number replaced by ``#`` (what the numbers-masked pass scores)."""
    return MASK_RE.sub(MASK, caption)


def count_numbers(caption: str) -> int:
    """How many numbers a caption states (what the number budget counts)."""
    return len(MASK_RE.findall(caption))


def ends_with_stop(caption: str) -> bool:
    """Whether the caption ends a sentence (a clipped caption usually does not)."""
    return caption.rstrip().endswith((".", "!", "?"))


@dataclass
class ShapingConfig:
    """The reward-shaping settings: their one declaration (help, defaults, validation).

    Every YAML spells them ``reward.<key>`` (``rewards.spec.RewardSpec`` extends this class); errors name
    the key as the config holding it spells it (``FIELD_PREFIX``). The guard's defaults are its counting rule's (``TranscriptionConfig``), so a
    section that says nothing keeps the transcription guard on and every other term off."""

    FIELD_PREFIX: ClassVar[str] = "reward"

    max_caption_chars: int | None = help_field(None, "captions longer than this are penalised (null = no length shaping)")
    length_penalty: float = help_field(0.0, "penalty per 100 characters above max_caption_chars")
    max_copied_values: int = help_field(TranscriptionConfig.max_copied_values, "series values a caption may copy for free, counted in values (start, end, max, min are key values), never a fraction of the series")
    transcription_penalty: float = help_field(TranscriptionConfig.value_penalty, "penalty per copied value beyond max_copied_values (values matched at the caption's rounding; 0 = guard off: copying the numbers wins a likelihood verifier without describing anything)")
    transcription_run: int = help_field(TranscriptionConfig.min_run, "a run of this many consecutive series values, in order, is transcription and is always penalised")
    run_penalty: float = help_field(TranscriptionConfig.run_penalty, "penalty for a caption with such a run (0 = off)")
    factuality_penalty: float = help_field(0.0, "weight of the share of claims the series contradicts (span-audit code checks within factuality_tolerance sigma; 0 = off)")
    factuality_bonus: float = help_field(0.0, "weight of the share of claims the series supports, added to the reward (code-checked values and trends only: a probe cannot collect it; 0 = off)")
    factuality_tolerance: float = help_field(0.35, "claims within this many standard deviations of the series are supported (0.35: the span audit's)")
    claims_extractor: str = help_field("rules", "claim extraction of the factuality term: rules, or llm (needs claims_backend: a capable served model)")
    claims_backend: str | None = help_field(None, "backend spec of the LLM claim extractor, e.g. openai:http://127.0.0.1:8000/v1#MODEL")
    masked_weight: float = help_field(0.0, "numbers-masked pass: base = (1-w)*score + w*score(caption with numbers masked); 0 = off")
    unfinished_penalty: float = help_field(0.0, "penalty for a caption that does not end a sentence (cut by the token budget or trailing off)")
    max_numbers: int | None = help_field(None, "number budget: numbers a caption may state for free, matched to the series or not (null = no budget)")
    number_penalty: float = help_field(0.0, "penalty per number beyond max_numbers (prices invented value lists, which the transcription guard cannot see)")
    coverage_bonus: float = help_field(0.0, "description coverage: + coverage_bonus * min(correct key facts, coverage_target) / coverage_target, the distinct facts the caption gets right, checked by code (judges.key_facts: direction, start, end, max and min with their positions, a shape, volatility, a magnitude; each counted once however often restated): pays describing, where factuality_bonus pays a share that one copied value fills; 0 = off")
    coverage_target: int = help_field(4, "correct key facts that earn the whole coverage_bonus")
    direction_weight: float = help_field(1.0, "a right overall direction counts as this many key facts in the coverage (a wrong one, or a hedge, costs one wrong fact): the fact a reader needs first and the one a small captioner gets wrong most; weighted up, saying a direction pays in expectation even while right only a third of the time, and choosing it right pays most")
    direction_rule: str = help_field("claims", "what makes a stated overall direction right for the description term: claims (the claim checker's tolerance, as every check reads it) or label (only the window's one direction, domains.describe.overall_direction: the checker tolerates 'flat' of a gently rising window, so a constant 'flat' was paid above its share and RL learned it; under label each constant word is paid exactly its share)")
    wrong_fact_penalty: float = help_field(0.0, "penalty per distinct key fact the series contradicts, a hedge such as 'rises or falls' included (judges.key_facts); 0 = off")
    degenerate_penalty: float = help_field(0.0, "penalty for a degenerate caption (no words: a bare number or a list of numbers; under 5 words; the instruction echoed), which earns no coverage either; 0 = off")
    no_fact_penalty: float = help_field(0.0, "penalty for a caption that states no key fact at all, right or wrong (words about nothing a reader of the series needs): without it a policy priced for wrong facts learns that saying nothing checkable is safest; 0 = off")
    false_claim_base: str = help_field("full", "the judge's score (the base: identification under LineupRL) that a caption stating a key fact its series contradicts keeps (judges.key_facts, by direction_rule): full; chance, at most lam / k (what a lineup pays a caption that tells nothing apart); or none. A value copied from the series tells the true window from candidates that share its start, end and trend whether or not it is the extreme the caption calls it, so under full the lineup pays a false claim about as much as a true one; series rows only")

    WEIGHTS: ClassVar[tuple[str, ...]] = ("length_penalty", "transcription_penalty", "run_penalty", "factuality_penalty",
                                          "factuality_bonus", "unfinished_penalty", "number_penalty", "coverage_bonus",
                                          "wrong_fact_penalty", "degenerate_penalty", "no_fact_penalty")
    """The terms' weights: each must be >= 0 (0 switches its term off)."""

    def __post_init__(self) -> None:
        self.validate_shaping()

    def validate_shaping(self) -> None:
        """Reject inconsistent shaping settings, naming the key as the holding config spells it.

        A separate method so that a config extending this class and another validated one
        (``rewards.spec.RewardSpec``) can run both checks from its own ``__post_init__``."""
        f = self.FIELD_PREFIX
        negative = {f"{f}.{w}": getattr(self, w) for w in self.WEIGHTS if getattr(self, w) < 0}
        if negative:
            raise ConfigError(", ".join(negative), tuple(negative.values()) if len(negative) > 1 else next(iter(negative.values())),
                              "penalties (and factuality_bonus) must be >= 0", "set 0 to switch the term off")
        if self.max_copied_values < 0:
            raise ConfigError(f"{f}.max_copied_values", self.max_copied_values, "must be >= 0", "set e.g. 4 (start, end, max, min)")
        if self.transcription_run < 2:
            raise ConfigError(f"{f}.transcription_run", self.transcription_run, "a run needs at least 2 values", "set e.g. 3")
        if self.max_numbers is not None and self.max_numbers < 0:
            raise ConfigError(f"{f}.max_numbers", self.max_numbers, "must be >= 0", "set null for no number budget")
        if self.max_caption_chars is not None and self.max_caption_chars < 1:
            raise ConfigError(f"{f}.max_caption_chars", self.max_caption_chars, "must be >= 1", "set null for no length shaping")
        if self.direction_weight < 0:
            raise ConfigError(f"{f}.direction_weight", self.direction_weight, "must be >= 0", "set 1 (one fact) or e.g. 2")
        if self.direction_rule not in DIRECTION_RULES:
            raise ConfigError(f"{f}.direction_rule", self.direction_rule, "unknown rule", f"use one of {', '.join(DIRECTION_RULES)}")
        if self.coverage_target < 1:
            raise ConfigError(f"{f}.coverage_target", self.coverage_target, "must be >= 1", "set e.g. 4")
        if self.factuality_tolerance <= 0:
            raise ConfigError(f"{f}.factuality_tolerance", self.factuality_tolerance, "must be > 0", "use 0.35 (the span audit's)")
        if self.false_claim_base not in FALSE_CLAIM_BASES:
            raise ConfigError(f"{f}.false_claim_base", self.false_claim_base, "unknown value",
                              f"use one of {', '.join(FALSE_CLAIM_BASES)}")
        if self.claims_extractor not in EXTRACTORS:
            raise ConfigError(f"{f}.claims_extractor", self.claims_extractor, "unknown extractor", f"use one of {', '.join(EXTRACTORS)}")
        if self.claims_extractor == "llm" and not self.claims_backend:
            raise ConfigError(f"{f}.claims_backend", None, "the llm claim extractor needs a served model",
                              f"set {f}.claims_backend: openai:URL#MODEL, or {f}.claims_extractor: rules")
        if not 0 <= self.masked_weight <= 1:
            raise ConfigError(f"{f}.masked_weight", self.masked_weight, "must be in [0, 1]", "set 0 (off) or e.g. 0.5")

    def describes(self) -> bool:
        """Whether a description term is on (coverage, wrong facts, degenerate captions)."""
        return (self.coverage_bonus > 0 or self.wrong_fact_penalty > 0 or self.degenerate_penalty > 0
                or self.no_fact_penalty > 0)

    def counting(self) -> TranscriptionConfig:
        """The guard's counting rule (what the evaluation's transcription column counts)."""
        return TranscriptionConfig(max_copied_values=self.max_copied_values, min_run=self.transcription_run)

    def guard(self) -> TranscriptionConfig | None:
        """The transcription guard with its penalties, or None when both are 0 (still measured and logged)."""
        if self.transcription_penalty <= 0 and self.run_penalty <= 0:
            return None
        return TranscriptionConfig(max_copied_values=self.max_copied_values, min_run=self.transcription_run,
                                   value_penalty=self.transcription_penalty, run_penalty=self.run_penalty)

    def factuality_term(self) -> FactualityTerm:
        """The factuality term; its LLM extractor's backend is built only when the term is on."""
        enabled = self.factuality_penalty > 0 or self.factuality_bonus > 0
        backend = None
        if self.claims_extractor == "llm" and enabled:
            from captionrl.backends import make_backend, parse_backend_spec

            backend = make_backend(parse_backend_spec(str(self.claims_backend)))
        return FactualityTerm(weight=self.factuality_penalty, bonus=self.factuality_bonus,
                              tolerance=self.factuality_tolerance, backend=backend)

    OFF: ClassVar[dict[str, float]] = {"transcription_penalty": 0.0, "run_penalty": 0.0}
    """The settings that switch off the terms that are on by default (the transcription guard)."""

    @classmethod
    def off(cls) -> ShapingConfig:
        """Every term off, the guard included: a judge's score as it is (rubric, CIDEr-D and the image judges)."""
        return cls(**cls.OFF)


@dataclass(frozen=True)
class Shaped:
    """One caption's shaped reward and its parts (``reward`` is None when the base judgment failed)."""

    reward: float | None
    base: float | None       # the judge's score of the caption as written
    masked: float | None     # the judge's score of the caption with its numbers masked (masked pass only)
    length_penalty: float
    transcription: Transcription | None
    transcription_penalty: float
    red_share: float | None
    green_share: float | None
    factuality_penalty: float
    facts: KeyFacts | None = None   # what the caption describes (series rows)
    description_term: float = 0.0   # coverage bonus less the wrong-fact and degenerate penalties
    base_withheld: bool = False     # false_claim_base: the base was capped or withheld (a contradicted key fact)


def _score(x: Any) -> float | None:
    if x is None:
        return None
    x = float(x)
    return None if math.isnan(x) else x


class Shaper:
    """The shaping terms of one ``ShapingConfig``, built once (the guard, the factuality term and its LLM
    extractor): ``shape`` turns base scores into shaped rewards; ``None`` stays ``None``."""

    def __init__(self, cfg: ShapingConfig | None = None, instruction: str | None = None) -> None:
        self.cfg = cfg or ShapingConfig()
        self.guard = self.cfg.guard()
        self.factuality = self.cfg.factuality_term()
        self.instruction = instruction
        self.chance = self.chance_base(self.cfg)

    @staticmethod
    def chance_base(cfg: ShapingConfig) -> float | None:
        """``lam / k``: the identification base of a caption that tells the K candidates nothing apart; needed
        by ``false_claim_base: chance``, which only an identification reward (its ``lam`` and ``k``) has."""
        lam, k = getattr(cfg, "lam", None), getattr(cfg, "k", None)
        if lam is not None and k:
            return float(lam) / int(k)
        if cfg.false_claim_base == "chance":
            raise ConfigError(f"{cfg.FIELD_PREFIX}.false_claim_base", "chance",
                              "needs the identification reward's lam and k (chance is lam / k)",
                              "use false_claim_base: none, or full, with another judge family")
        return None

    def false_claim_cap(self, base: float) -> float:
        """The base a caption with a contradicted key fact keeps under ``false_claim_base`` chance or none."""
        return 0.0 if self.cfg.false_claim_base == "none" else min(base, self.chance)

    def needs_series(self) -> bool:
        """Whether a term reads the ``series`` column (the guard, the factuality and description terms)."""
        return self.guard is not None or self.factuality.enabled or self.cfg.describes()

    def description(self, facts: KeyFacts) -> float:
        """The description term of one caption: what its correct key facts earn, less its wrong ones; a
        degenerate caption (no words, under 5 words, the instruction echoed) earns no coverage and pays, and
        one that states no key fact at all pays ``no_fact_penalty``."""
        c = self.cfg
        if facts.degenerate is not None:
            return -c.degenerate_penalty - c.wrong_fact_penalty * facts.wrong_facts
        if facts.correct_facts == 0 and facts.wrong_facts == 0:
            return -c.no_fact_penalty
        right = facts.correct_facts + (c.direction_weight - 1.0) * ("direction" in facts.facts)
        covered = c.coverage_bonus * min(right, c.coverage_target) / c.coverage_target
        return covered - c.wrong_fact_penalty * facts.wrong_facts

    def length_penalty(self, caption: str) -> float:
        """Form: characters above the limit, the unfinished-sentence penalty, and the number budget.

        The budget counts every number, matched to the series or not: the transcription guard only sees
        copied values, and a list of invented values near the series' scale makes no checkable claim, so
        neither it nor the factuality term can price it, while a likelihood verifier pays for it."""
        c = self.cfg
        form = 0.0 if ends_with_stop(caption) else c.unfinished_penalty
        if c.max_numbers is not None and c.number_penalty > 0:
            form += c.number_penalty * max(0, count_numbers(caption) - c.max_numbers)
        if c.max_caption_chars is None or len(caption) <= c.max_caption_chars:
            return form
        return form + c.length_penalty * (len(caption) - c.max_caption_chars) / 100.0

    def shape(self, captions: Sequence[str], base_scores: Sequence[Any], series: Sequence[Any] | None = None,
              series_text: Sequence[str | None] | None = None, masked_scores: Sequence[Any] | None = None) -> list[Shaped]:
        """The shaped reward of each caption from its base score (and masked score) and its series."""
        c = self.cfg
        n = len(captions)
        has_series = series is not None and any(s is not None and len(s) for s in series)
        facts = self.factuality.findings(captions, series) if has_series and self.factuality.enabled else [None] * n
        out = []
        for i, cap in enumerate(captions):
            raw = base = _score(base_scores[i])
            masked = _score(masked_scores[i]) if masked_scores is not None else None
            if base is not None and masked_scores is not None:
                base = None if masked is None else (1 - c.masked_weight) * base + c.masked_weight * masked
            lp = self.length_penalty(cap)
            tr = None
            if has_series:
                shown = parse_shown(series_text[i]) if series_text and series_text[i] else None
                tr = transcription(cap, series[i], self.guard or c.counting(), shown=shown)  # type: ignore[index]
            tp = tr.penalty if (tr is not None and self.guard is not None) else 0.0
            f = facts[i]
            fp = self.factuality.penalty(f) if f is not None else 0.0
            kf = key_facts(cap, series[i], instruction=self.instruction, tolerance=c.factuality_tolerance) \
                if has_series and series[i] is not None and len(series[i]) else None  # type: ignore[index]
            if kf is not None and c.direction_rule == "label":
                kf = with_labelled_direction(kf, series[i])  # type: ignore[index]
            dt = self.description(kf) if kf is not None and c.describes() else 0.0
            withheld = bool(c.false_claim_base != "full" and base is not None and kf is not None and kf.wrong_facts > 0)
            kept = self.false_claim_cap(base) if withheld else base  # withheld: base is a number
            reward = None if kept is None else kept - lp - tp - fp + dt
            out.append(Shaped(reward, raw, masked, lp, tr, tp, f.red_share if f else None,
                              f.green_share if f else None, fp, kf, dt, withheld))
        return out


def terms(caption: str, s: Shaped) -> dict[str, float]:
    """One caption's shaping terms as the finite numbers a judgment's ``extra`` carries (and engines log):
    the form of the caption always, the transcription and factuality terms where the row had a series."""
    out = {"caption_chars": float(len(caption)), "ends_with_stop": float(ends_with_stop(caption)),
           "numbers": float(count_numbers(caption)), "length_penalty": s.length_penalty}
    if s.base is not None:
        out["base"] = s.base
    if s.masked is not None:
        out["masked"] = s.masked
    t = s.transcription
    if t is not None:
        out.update({"transcription_penalty": s.transcription_penalty, "transcription_share": t.share,
                    "copied_values": float(t.copied), "longest_run": float(t.longest_run), "has_run": float(t.has_run)})
    if s.red_share is not None:
        out.update({"red_share": s.red_share, "green_share": s.green_share or 0.0,
                    "factuality_penalty": s.factuality_penalty})
    k = s.facts
    if k is not None:
        out.update({"key_facts": float(k.correct_facts), "wrong_facts": float(k.wrong_facts),
                    "direction_stated": float(k.direction_stated), "direction_right": float(bool(k.direction_correct)),
                    "degenerate": float(k.degenerate is not None), "description_term": s.description_term,
                    "base_withheld": float(s.base_withheld)})
    return out


SERIES_TERMS = ("transcription_penalty", "transcription_share", "copied_values", "longest_run", "has_run")
FACTUALITY_TERMS = ("red_share", "green_share", "factuality_penalty")
FORM_TERMS = ("caption_chars", "ends_with_stop", "numbers", "length_penalty")
DESCRIPTION_TERMS = ("key_facts", "wrong_facts", "direction_stated", "direction_right", "degenerate", "description_term",
                     "base_withheld")


def metrics(extras: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Batch means of every shaping term over the captions' judgment ``extra`` (what the TRL face logs
    under ``shaping/*``): each term over the captions that carry it."""
    out: dict[str, float] = {}
    for key in (*FORM_TERMS, *SERIES_TERMS, *FACTUALITY_TERMS, *DESCRIPTION_TERMS, "masked"):
        vals = [float(e[key]) for e in extras if isinstance(e.get(key), (int, float))]
        if vals:
            name = {"has_run": "run_frac", "transcription_share": "transcription_frac", "masked": "masked_base"}.get(key, key)
            out[f"shaping/{name}"] = float(sum(vals) / len(vals))
    return out
