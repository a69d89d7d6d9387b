"""A code-checked identification verifier: the candidate whose values best satisfy the caption's claims.

Why: a likelihood verifier that produces a LineupRL reward cannot also grade the captions it shaped (a
caption that copies numbers wins it). This verifier takes no part in training and needs no model (it runs offline, in milliseconds): the caption's claims are extracted
by rules (``judges.claims.extract_rules``) and checked by code against each candidate series within
``tolerance`` standard deviations; a candidate's score is ``green - red`` (claims that candidate supports
minus claims it contradicts), and the verifier names the best candidate.

- ``c2s``: score the caption against each of the K candidate series (index 0 the truth);
- ``s2c``: score each of the K captions (index 0 the item's) against the one series.

A tie gets the credit ``argmax_credit`` gives the likelihood verifier (1/t when the truth ties with t-1
others): a caption with no checkable claim (a number dump, generic text, the empty caption) ties every
candidate and scores exactly chance, 1/K, deterministically. Unscored (``None``) is kept for failures, as
everywhere; a code check does not fail. There are no probabilities, so ``soft`` equals ``hard``; the
question's ``mode`` (letter, likelihood) does not change a code check, so every mode gets the same answer.

Spec: ``claims:rules`` (optionally ``claims:rules,tolerance=0.5``), accepted wherever an identification
verifier is named (``captionrl eval identify --verifier``, ``eval.verifiers`` of ``train lineup``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from captionrl.domains.lineup_data import validate_candidate_set, validate_values
from captionrl.errors import ConfigError, DataError
from captionrl.judges.base import Columns, require_columns
from captionrl.judges.claims import factuality
from captionrl.judges.identification import IdentifyConfig, argmax_credit
from captionrl.types import Judgment

PREFIX = "claims:"
EXTRACTORS = ("rules",)


def is_claims_spec(spec: object) -> bool:
    """Whether a verifier spec names the claims verifier (``claims:...``)."""
    return isinstance(spec, str) and spec.strip().startswith(PREFIX)


@dataclass(frozen=True)
class ClaimsVerifier:
    """The claims verifier's settings; stands where a verifier backend stands (``identification_judge``)."""

    extractor: str = "rules"
    tolerance: float = 0.35
    index_base: int = 0

    def __post_init__(self) -> None:
        if self.extractor not in EXTRACTORS:
            raise ConfigError("verifier", f"claims:{self.extractor}", "unknown claim extractor for the claims verifier",
                              "use claims:rules (deterministic, offline)")
        if self.tolerance <= 0:
            raise ConfigError("verifier", f"claims:rules,tolerance={self.tolerance}", "tolerance must be > 0",
                              "use claims:rules (0.35 sigma, the span audit's)")

    @property
    def spec(self) -> str:
        return f"claims:{self.extractor}" + (f",tolerance={self.tolerance:g}" if self.tolerance != 0.35 else "")

    def identification_judge(self, cfg: IdentifyConfig) -> ClaimsIdentificationJudge:
        return ClaimsIdentificationJudge(self, cfg)


def parse_claims_spec(spec: str, field: str = "verifier") -> ClaimsVerifier:
    """``claims:rules[,tolerance=X][,index_base=N]`` -> ``ClaimsVerifier``; errors name ``field``."""
    body = spec.strip()[len(PREFIX):]
    extractor, *options = [p.strip() for p in body.split(",")]
    kwargs: dict[str, float | int] = {}
    for opt in options:
        key, sep, value = opt.partition("=")
        try:
            if not sep or key not in ("tolerance", "index_base"):
                raise ValueError(opt)
            kwargs[key] = float(value) if key == "tolerance" else int(value)
        except ValueError as exc:
            raise ConfigError(field, spec, f"option {opt!r} is not understood",
                              "write claims:rules, claims:rules,tolerance=0.35 or claims:rules,index_base=1") from exc
    try:
        return ClaimsVerifier(extractor=extractor or "rules", **kwargs)  # type: ignore[arg-type]
    except ConfigError as exc:
        raise ConfigError(field, spec, exc.problem, exc.fix) from exc


class ClaimsIdentificationJudge:
    """Identification by code-checked claims; the ``Judge`` protocol, same columns as ``IdentificationJudge``."""

    def __init__(self, verifier: ClaimsVerifier, cfg: IdentifyConfig | None = None) -> None:
        self.verifier = verifier
        self.cfg = cfg or IdentifyConfig()
        self.name = f"identify-{self.cfg.direction}-claims"

    def _score(self, caption: str, values: Sequence[float]) -> int:
        f = factuality(caption, values, tolerance=self.verifier.tolerance, index_base=self.verifier.index_base)
        return f.green - f.red

    def judge(self, captions: Sequence[str], columns: Columns) -> list[Judgment]:
        n, k = len(captions), self.cfg.k
        if self.cfg.direction == "c2s":
            require_columns(columns, ["candidates"], n, self.name)
            out = []
            for i, cap in enumerate(captions):
                cands = validate_candidate_set(columns["candidates"][i], k, f"candidates[{i}]", "identify.k")
                out.append(self._judgment([self._score(cap, c) for c in cands]))
            return out
        require_columns(columns, ["series", "distractor_captions"], n, self.name)
        out = []
        for i, cap in enumerate(captions):
            values = validate_values(columns["series"][i], f"series[{i}]")
            others = list(columns["distractor_captions"][i])
            if len(others) < k - 1:
                raise DataError(f"distractor_captions[{i}]", len(others), f"needs K-1={k - 1} captions",
                                "give each item the captions of its distractors, or lower identify.k")
            out.append(self._judgment([self._score(c, values) for c in [cap, *others[: k - 1]]]))
        return out

    def _judgment(self, scores: list[int]) -> Judgment:
        hard = argmax_credit(scores)
        best = max(scores)
        return Judgment(score=self.cfg.lam * hard, decision=[i for i, s in enumerate(scores) if s == best],
                        method="claims",
                        extra={"hard": hard, "soft": hard, "mode": self.cfg.mode, "direction": self.cfg.direction,
                               "k": self.cfg.k, "scores": scores})
