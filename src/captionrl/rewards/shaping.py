"""Reward shaping around any judge reward: ``base - length - transcription - factuality``.

It is a *wrapper*, not extra TRL reward functions: TRL sums several reward functions with ``nansum`` and
treats a row as unscored only when *all* of them return ``None``, so a separate penalty function would turn
a verifier failure into a penalty-only score (a silent 0 the policy learns from). The wrapper subtracts its
penalties only from scored captions and leaves a failed base judgment ``None``.

Terms, each logged as its own metric through TRL's ``log_metric`` (``shaping/*``) and, per caption, through
``log_extra`` (the completions table):

- length: ``length_penalty`` per 100 characters above ``max_caption_chars``, and ``unfinished_penalty``
  when the caption does not end a sentence (cut by the token budget);
- transcription (``judges.transcription``): copied series values beyond an allowance counted in values,
  and any run of consecutive values; applies where the rows carry a ``series`` column;
- factuality (``rewards.factuality``): ``weight * share of contradicted claims - bonus * share of supported
  claims``; series rows only;
- numbers-masked pass (``masked_weight > 0``): the base reward also scores the caption with its numbers
  masked, and the base becomes ``(1 - w) * base + w * masked``: a caption that is identifiable only through
  copied numbers loses that part. A failed masked judgment leaves the caption unscored (``None``).

The same object is the training reward, the preflight's reward and the checkpoint-selection reward.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from captionrl.config import help_field
from captionrl.errors import ConfigError, DataError
from captionrl.judges.transcription import Transcription, TranscriptionConfig, parse_shown, transcription
from captionrl.rewards import TRL_SPECIAL_KWARGS, completion_text
from captionrl.rewards.factuality import EXTRACTORS, FactualityTerm

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

    ``train lineup`` reads them as ``reward.<key>`` (``LineupRewardConfig`` extends this class), the verl /
    OpenRLHF adapters and ``serve reward`` as ``shaping.<key>``; errors name the key as the config holding it
    spells it (``FIELD_PREFIX``). The guard's defaults are its counting rule's (``TranscriptionConfig``), so a
    section that says nothing keeps the transcription guard on and every other term off."""

    FIELD_PREFIX: ClassVar[str] = "shaping"

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

    WEIGHTS: ClassVar[tuple[str, ...]] = ("length_penalty", "transcription_penalty", "run_penalty", "factuality_penalty",
                                          "factuality_bonus", "unfinished_penalty", "number_penalty")
    """The terms' weights: each must be >= 0 (0 switches its term off)."""

    def __post_init__(self) -> None:
        self.validate_shaping()

    def validate_shaping(self) -> None:
        """Reject inconsistent shaping settings, naming the key as the holding config spells it.

        A separate method so that a config extending this class and another validated one
        (``LineupRewardConfig``) can run both checks from its own ``__post_init__``."""
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
        if self.factuality_tolerance <= 0:
            raise ConfigError(f"{f}.factuality_tolerance", self.factuality_tolerance, "must be > 0", "use 0.35 (the span audit's)")
        if self.claims_extractor not in EXTRACTORS:
            raise ConfigError(f"{f}.claims_extractor", self.claims_extractor, "unknown extractor", f"use one of {', '.join(EXTRACTORS)}")
        if self.claims_extractor == "llm" and not self.claims_backend:
            raise ConfigError(f"{f}.claims_backend", None, "the llm claim extractor needs a served model",
                              f"set {f}.claims_backend: openai:URL#MODEL, or {f}.claims_extractor: rules")
        if not 0 <= self.masked_weight <= 1:
            raise ConfigError(f"{f}.masked_weight", self.masked_weight, "must be in [0, 1]", "set 0 (off) or e.g. 0.5")

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

    def single_pass(self) -> ShapingConfig:
        """These settings for a caller that judges each caption once (the engine adapters, ``serve reward``):
        the numbers-masked pass needs a second verifier call per caption, so it is refused there."""
        if self.masked_weight > 0:
            raise ConfigError(f"{self.FIELD_PREFIX}.masked_weight", self.masked_weight,
                              "the numbers-masked pass needs a second verifier call per caption, which the engine "
                              "adapters and serve reward do not make", "set masked_weight: 0 here (train lineup offers it)")
        return self


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


def _score(x: Any) -> float | None:
    if x is None:
        return None
    x = float(x)
    return None if math.isnan(x) else x


class ShapedReward:
    """A TRL reward callable: ``base(captions) - penalties``; ``None`` stays ``None`` (the judge applies lambda).

    Args:
        base: a TRL reward callable (e.g. ``JudgeReward``); if it has ``on_judgments`` the judgments are
            kept for the sample records (hard/soft/error).
        cfg: the shaping settings (a ``ShapingConfig`` or a config that extends it, e.g. ``reward`` of
            ``train lineup``); the guard and the factuality term (and its LLM extractor) are built once here.
        samples: optional ``SampleLog``-like object with ``write(step, rows)``.
        name: the reward's name in TRL's logs.
        family: which judge gives the base score (identification, answerability, judge), written in every
            sample record; only the identification family's base is also written as ``identification``.
    """

    def __init__(self, base: Callable[..., Sequence[float | None]], cfg: ShapingConfig | None = None,
                 samples: Any = None, name: str = "shaped", family: str = "identification") -> None:
        self.base = base
        self.family = family
        self.cfg = cfg or ShapingConfig()
        self.guard = self.cfg.guard()
        self.factuality = self.cfg.factuality_term()
        self.samples = samples
        self.__name__ = name
        self._last_judgments: list[Any] = []
        previous = getattr(base, "on_judgments", None)

        def keep(captions: Any, columns: Any, judgments: list[Any]) -> None:
            self._last_judgments = judgments
            if previous is not None:
                previous(captions, columns, judgments)

        if hasattr(base, "on_judgments"):
            base.on_judgments = keep

    @property
    def health(self) -> Any:
        """The base reward's ``RewardHealth`` (what the reward bound reads): a shaped reward loses what its judge loses."""
        return getattr(self.base, "health", None)

    # ------------------------------------------------------------------ per-caption terms
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
              series_text: Sequence[str] | None = None, masked_scores: Sequence[Any] | None = None) -> list[Shaped]:
        """The shaped reward of each caption from its base score (and masked score) and its series."""
        c = self.cfg
        n = len(captions)
        has_series = series is not None and any(len(s or []) for s in series)
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
            reward = None if base is None else base - lp - tp - fp
            out.append(Shaped(reward, raw, masked, lp, tr, tp, f.red_share if f else None,
                              f.green_share if f else None, fp))
        return out

    # ------------------------------------------------------------------ TRL entry point
    def needed_columns(self) -> list[str]:
        """Columns the configured terms read: ``series`` for the transcription guard and the factuality term."""
        return ["series"] if (self.guard is not None or self.factuality.enabled) else []

    def check_columns(self, kwargs: dict[str, Any]) -> None:
        """Raise at the first call when a term's column is missing: without it the guard and the factuality
        term would switch off silently and the bare verifier would decide the reward."""
        for name in self.needed_columns():
            value = kwargs.get(name)
            if value is None or not any(len(v or []) for v in value):
                given = sorted(k for k in kwargs if k not in TRL_SPECIAL_KWARGS)
                raise DataError(f"columns.{name}", given,
                                f"reward {self.__name__!r} needs the {name!r} column (transcription guard / factuality "
                                "term) and did not get it",
                                f"keep a {name!r} column in the training rows (train.remove_unused_columns stays off), "
                                "or switch the terms off (reward.transcription_penalty: 0, reward.run_penalty: 0, "
                                "reward.factuality_penalty: 0, reward.factuality_bonus: 0)")

    def __call__(self, prompts: Any = None, completions: Sequence[Any] = (), completion_ids: Any = None,
                 **kwargs: Any) -> list[float | None]:
        self.check_columns(kwargs)
        self._last_judgments = []
        base_scores = list(self.base(prompts, completions, completion_ids, **kwargs))
        judgments = self._last_judgments
        captions = [completion_text(c) for c in completions]
        masked_scores = None
        if self.cfg.masked_weight > 0:
            quiet = {k: v for k, v in kwargs.items() if k not in TRL_SPECIAL_KWARGS}
            masked_scores = list(self.base(prompts, [mask_numbers(c) for c in captions], None, **quiet))
            self._last_judgments = judgments
        shaped = self.shape(captions, base_scores, kwargs.get("series"), kwargs.get("series_text"), masked_scores)
        self._log(captions, shaped, kwargs)
        if self.samples is not None:
            self._write_samples(captions, shaped, judgments, kwargs)
        return [s.reward for s in shaped]

    def _log(self, captions: Sequence[str], shaped: Sequence[Shaped], kwargs: dict[str, Any]) -> None:
        log_metric = kwargs.get("log_metric")
        if callable(log_metric):
            for name, value in metrics(captions, shaped).items():
                log_metric(name, value)
        log_extra = kwargs.get("log_extra")
        if callable(log_extra):
            log_extra("copied_values", [s.transcription.copied if s.transcription else 0 for s in shaped])
            log_extra("red_share", [s.red_share if s.red_share is not None else float("nan") for s in shaped])
            log_extra("shaped_reward", [s.reward if s.reward is not None else float("nan") for s in shaped])

    def _write_samples(self, captions: Sequence[str], shaped: Sequence[Shaped], judgments: Sequence[Any],
                       kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("item_id") or [None] * len(captions)
        rows = []
        for i, (cap, s) in enumerate(zip(captions, shaped, strict=True)):
            j = judgments[i] if i < len(judgments) else None
            t = s.transcription
            extras = {k: v for k, v in (j.extra.items() if j is not None else ())
                      if k not in ("hard", "soft") and isinstance(v, (int, float)) and not isinstance(v, bool)}
            base = {"identification": s.base} if self.family == "identification" else {}
            rows.append({
                **extras, "item_id": ids[i], "caption": cap, "family": self.family, "base": s.base, **base,
                "masked": s.masked, "length_penalty": s.length_penalty,
                "transcription_penalty": s.transcription_penalty,
                "transcription_frac": t.share if t else 0.0, "copied_values": t.copied if t else 0,
                "longest_run": t.longest_run if t else 0, "red_share": s.red_share,
                "factuality_penalty": s.factuality_penalty, "reward": s.reward,
                "hard": j.extra.get("hard") if j is not None else None,
                "soft": j.extra.get("soft") if j is not None else None,
                "error": j.error if j is not None else None,
            })
        state = kwargs.get("trainer_state")
        self.samples.write(int(getattr(state, "global_step", -1)) if state is not None else -1, rows)


def metrics(captions: Sequence[str], shaped: Sequence[Shaped]) -> dict[str, float]:
    """Batch means of every shaping term (what ``ShapedReward`` logs under ``shaping/*``)."""

    def mean(xs: Sequence[float]) -> float:
        return float(sum(xs) / len(xs)) if xs else 0.0

    out = {
        "shaping/length_penalty": mean([s.length_penalty for s in shaped]),
        "shaping/caption_chars": mean([float(len(c)) for c in captions]),
        "shaping/ends_with_stop": mean([float(ends_with_stop(c)) for c in captions]),
        "shaping/numbers": mean([float(count_numbers(c)) for c in captions]),
        "verifier_failures": float(sum(s.reward is None for s in shaped)),
    }
    trs = [s.transcription for s in shaped if s.transcription is not None]
    if trs:
        out.update({
            "shaping/transcription_penalty": mean([s.transcription_penalty for s in shaped]),
            "shaping/transcription_frac": mean([t.share for t in trs]),
            "shaping/copied_values": mean([float(t.copied) for t in trs]),
            "shaping/run_frac": mean([float(t.has_run) for t in trs]),
        })
    reds = [s.red_share for s in shaped if s.red_share is not None]
    if reds:
        out["shaping/red_share"] = mean(reds)
        out["shaping/green_share"] = mean([s.green_share or 0.0 for s in shaped if s.green_share is not None])
        out["shaping/factuality_penalty"] = mean([s.factuality_penalty for s in shaped])
    masked = [s.masked for s in shaped if s.masked is not None]
    if masked:
        out["shaping/masked_base"] = mean(masked)
    return out
