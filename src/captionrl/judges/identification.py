"""Identification: can a frozen verifier tell which series a caption describes (LineupRL's reward)?

Two directions:
- ``c2s`` (caption -> series, the training reward): the verifier reads K candidate series and the caption
  and names the described series.
- ``s2c`` (series -> caption, an evaluation): the verifier reads one series and K captions (the item's and
  those of its K-1 distractors) and names the caption.

Two modes behind one interface, reported in every judgment:
- ``letter`` (the paper's): the candidates are labelled A..K and the true one visits every position
  (K rotations); hard accuracy = fraction of rotations answered right, soft = mean probability on the
  correct letter. Rotations cancel position bias: a verifier that always answers "A" scores exactly 1/K.
- ``likelihood`` (ours, for small verifiers): score log p(caption | series_i) for each candidate and take
  the argmax; soft = softmax probability of the true series. No letters, so no position bias. For
  ``s2c`` the captions differ, so each is scored by pointwise mutual information,
  log p(caption | series) - log p(caption | no series), which removes the preference for short captions.

Prompt layout puts the candidates before the caption, and prompts are issued grouped by candidate set and
rotation, so the G captions of one group share a prefix that the backend computes once.
Score = lambda * (hard or soft accuracy, ``signal``); a verifier failure leaves the caption unscored.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from captionrl.backends.base import Backend, Message, option_letters
from captionrl.config import help_field
from captionrl.domains.lineup_data import validate_candidate_set, validate_values
from captionrl.errors import ConfigError, DataError
from captionrl.judges.base import Columns, backend_error, require_columns, unscored
from captionrl.types import Judgment

LETTER_C2S = (
    "Below are {k} time series, labelled {labels}.\n\n{blocks}\n\n"
    "Here is a description of one of them:\n\"{caption}\"\n\n"
    "Which time series does the description describe? Answer with the letter only."
)
LETTER_S2C = (
    "Here is a time series:\n{series}\n\nBelow are {k} descriptions, labelled {labels}.\n\n{blocks}\n\n"
    "Which description describes this time series? Answer with the letter only."
)
LIKELIHOOD_CONTEXT = "Time series: {series}\nDescription of this time series:"
NULL_CONTEXT = "Description of a time series:"


@dataclass
class IdentifyScoring:
    """What an identification question asks and how it is scored: the settings a training reward shares
    with every identification judge (``rewards.spec.RewardSpec`` extends it, so they are declared once)."""

    FIELD_PREFIX: ClassVar[str] = "identify"  # error messages name fields as the config that holds them does

    mode: str = help_field("likelihood", "letter (the paper's K-rotation multiple choice; needs a capable verifier) or likelihood (argmax of log p(caption | series); works with small verifiers)")
    k: int = help_field(4, "K: candidates per question (the true series and K-1 distractors)")
    signal: str = help_field("hard", "score = lambda * hard accuracy (the paper) or soft accuracy (probability on the truth; a denser signal from weak verifiers)")
    lam: float = help_field(1.0, "lambda: score = lambda * accuracy")

    def __post_init__(self) -> None:
        f = self.FIELD_PREFIX
        if self.mode not in ("letter", "likelihood"):
            raise ConfigError(f"{f}.mode", self.mode, "unknown verifier mode", "use letter or likelihood")
        if not isinstance(self.k, int) or self.k < 2:
            raise ConfigError(f"{f}.k", self.k, "K must be at least 2 (the true series and a distractor)", f"set {f}.k: 4")
        if self.k > 26:
            raise ConfigError(f"{f}.k", self.k, "K above 26 has no letters", f"set {f}.k <= 26")
        if self.signal not in ("hard", "soft"):
            raise ConfigError(f"{f}.signal", self.signal, "unknown signal", "use hard or soft")


@dataclass
class IdentifyConfig(IdentifyScoring):
    """How identification is asked and scored: the scoring, the direction and how series are printed."""

    direction: str = help_field("c2s", "c2s: caption -> series (training reward); s2c: series -> caption")
    precision: int = help_field(2, "decimals when printing series values")
    normalise: str | None = help_field(None, "print values as they are (null), or zscore / minmax normalised")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.direction not in ("c2s", "s2c"):
            raise ConfigError("identify.direction", self.direction, "unknown direction", "use c2s or s2c")
        if self.precision < 0:
            raise ConfigError("identify.precision", self.precision, "must be >= 0", "set precision: 2")


def render_values(values: Sequence[float], cfg: IdentifyConfig) -> str:
    from captionrl.domains.timeseries import render_numbers

    text, _info = render_numbers(values, precision=cfg.precision, normalise=cfg.normalise)
    return text


def rotation(n_candidates: int, r: int) -> list[int]:
    """Candidate order for rotation ``r``: the true candidate (index 0) sits at position ``r``.

    The distractors keep their relative order, so every rotation is a cyclic arrangement of the same set.
    """
    others = list(range(1, n_candidates))
    return [*others[:r], 0, *others[r:]]


def softmax(scores: Sequence[float]) -> np.ndarray:
    s = np.asarray(scores, dtype=float)
    e = np.exp(s - s.max())
    return e / e.sum()


def argmax_credit(scores: Sequence[float], true_index: int = 0) -> float:
    """1 when the true candidate has the unique best score; 1/t when it ties with t-1 others; else 0."""
    s = np.asarray(scores, dtype=float)
    best = np.flatnonzero(np.isclose(s, s.max(), rtol=0, atol=1e-9))
    return 1.0 / len(best) if true_index in best else 0.0


def identification_judge(verifier: Any, cfg: IdentifyConfig) -> Any:
    """The identification judge of one verifier: a model backend is read by ``IdentificationJudge``; a code
    verifier (``judges.claims_verifier.ClaimsVerifier``) brings its own judge through ``identification_judge``."""
    factory = getattr(verifier, "identification_judge", None)
    return factory(cfg) if callable(factory) else IdentificationJudge(verifier, cfg)


class IdentificationJudge:
    """Scores captions by identification; implements the ``Judge`` protocol.

    Columns: ``c2s`` needs ``candidates`` (per row a list of K series, index 0 the true series; a longer
    list is cut to K, so smaller K uses a prefix of the distractors). ``s2c`` needs ``series`` (the true
    series) and ``distractor_captions`` (per row the captions of the K-1 distractors).
    """

    def __init__(self, backend: Backend, cfg: IdentifyConfig | None = None) -> None:
        self.backend = backend
        self.cfg = cfg or IdentifyConfig()
        self.name = f"identify-{self.cfg.direction}-{self.cfg.mode}"

    # ------------------------------------------------------------------ entry point
    def judge(self, captions: Sequence[str], columns: Columns) -> list[Judgment]:
        n = len(captions)
        if self.cfg.direction == "c2s":
            require_columns(columns, ["candidates"], n, self.name)
            sets = [validate_candidate_set(columns["candidates"][i], self.cfg.k, f"candidates[{i}]", "identify.k")
                    for i in range(n)]
            if self.cfg.mode == "letter":
                return self._letter_c2s(captions, sets)
            return self._likelihood_c2s(captions, sets)
        require_columns(columns, ["series", "distractor_captions"], n, self.name)
        caps = [self._caption_set(captions[i], columns["distractor_captions"][i], i) for i in range(n)]
        series = [validate_values(columns["series"][i], f"series[{i}]") for i in range(n)]
        if self.cfg.mode == "letter":
            return self._letter_s2c(series, caps)
        return self._likelihood_s2c(series, caps)

    # ------------------------------------------------------------------ validation
    def _caption_set(self, caption: str, distractors: Sequence[str], row: int) -> list[str]:
        k = self.cfg.k
        if len(distractors) < k - 1:
            raise DataError(f"distractor_captions[{row}]", len(distractors), f"needs K-1={k - 1} captions",
                            "give each item the captions of its distractors, or lower identify.k")
        return [caption, *[str(d) for d in distractors[: k - 1]]]

    # ------------------------------------------------------------------ letter mode
    def _letter_c2s(self, captions: Sequence[str], sets: list[list[list[float]]]) -> list[Judgment]:
        k = self.cfg.k
        labels = option_letters(k)
        rendered: dict[int, list[str]] = {}
        prompts: list[list[Message]] = []
        index: list[tuple[int, int]] = []  # (row, rotation) of each prompt
        for group in _groups(sets):
            for r in range(k):
                for row in group:
                    texts = rendered.setdefault(row, [render_values(v, self.cfg) for v in sets[row]])
                    order = rotation(k, r)
                    blocks = "\n".join(f"{labels[p]}: {texts[c]}" for p, c in enumerate(order))
                    body = LETTER_C2S.format(k=k, labels=", ".join(labels), blocks=blocks, caption=captions[row].strip())
                    prompts.append([{"role": "user", "content": body}])
                    index.append((row, r))
        return self._collect_letter(len(captions), prompts, index, labels)

    def _letter_s2c(self, series: list[list[float]], caps: list[list[str]]) -> list[Judgment]:
        k = self.cfg.k
        labels = option_letters(k)
        prompts: list[list[Message]] = []
        index: list[tuple[int, int]] = []
        for row in range(len(series)):
            text = render_values(series[row], self.cfg)
            for r in range(k):
                order = rotation(k, r)
                blocks = "\n".join(f"{labels[p]}: \"{caps[row][c].strip()}\"" for p, c in enumerate(order))
                body = LETTER_S2C.format(series=text, k=k, labels=", ".join(labels), blocks=blocks)
                prompts.append([{"role": "user", "content": body}])
                index.append((row, r))
        return self._collect_letter(len(series), prompts, index, labels)

    def _collect_letter(
        self, n: int, prompts: list[list[Message]], index: list[tuple[int, int]], labels: list[str]
    ) -> list[Judgment]:
        results = self.backend.choose(prompts, labels)
        per_row: list[dict[int, Any]] = [{} for _ in range(n)]
        for (row, r), res in zip(index, results, strict=True):
            per_row[row][r] = res
        out: list[Judgment] = []
        for row in range(n):
            rots = [per_row[row][r] for r in range(self.cfg.k)]
            failed = [res for res in rots if res.probs is None]
            if failed:
                out.append(unscored(f"verifier failed on {len(failed)}/{len(rots)} rotations: {failed[0].error}",
                                    mode="letter", direction=self.cfg.direction))
                continue
            truth = [labels[r] for r in range(self.cfg.k)]  # rotation r puts the truth at position r
            decisions = [res.choice for res in rots]
            hard = float(np.mean([d == t for d, t in zip(decisions, truth, strict=True)]))
            soft = float(np.mean([res.probs[t] for res, t in zip(rots, truth, strict=True)]))
            out.append(self._judgment(hard, soft, decisions, method=rots[0].method,
                                      extra={"truth": truth, "mass": [res.mass for res in rots],
                                             "probs": [res.probs for res in rots], "replies": [res.raw for res in rots]}))
        return out

    # ------------------------------------------------------------------ likelihood mode
    def _likelihood_c2s(self, captions: Sequence[str], sets: list[list[list[float]]]) -> list[Judgment]:
        pairs: list[tuple[str, str]] = []
        for row, cands in enumerate(sets):
            cont = _continuation(captions[row])
            for values in cands:
                pairs.append((LIKELIHOOD_CONTEXT.format(series=render_values(values, self.cfg)), cont))
        scores = self.backend.loglikelihood(pairs)
        k = self.cfg.k
        return [self._from_scores(scores[row * k : (row + 1) * k]) for row in range(len(captions))]

    def _likelihood_s2c(self, series: list[list[float]], caps: list[list[str]]) -> list[Judgment]:
        k = self.cfg.k
        pairs: list[tuple[str, str]] = []
        for row, values in enumerate(series):
            ctx = LIKELIHOOD_CONTEXT.format(series=render_values(values, self.cfg))
            pairs.extend((ctx, _continuation(c)) for c in caps[row])
            pairs.extend((NULL_CONTEXT, _continuation(c)) for c in caps[row])
        scores = self.backend.loglikelihood(pairs)
        out = []
        for row in range(len(series)):
            block = scores[row * 2 * k : (row + 1) * 2 * k]
            cond, null = block[:k], block[k:]
            if any(s is None for s in block):
                out.append(self._from_scores([None]))
                continue
            out.append(self._from_scores([c - u for c, u in zip(cond, null, strict=True)], pmi=True))  # type: ignore[operator]
        return out

    def _from_scores(self, scores: Sequence[float | None], pmi: bool = False) -> Judgment:
        if any(s is None or math.isnan(s) for s in scores):
            err = backend_error(self.backend, "verifier returned no log-likelihood")
            return unscored(f"verifier failed: {err}", mode="likelihood", direction=self.cfg.direction)
        vals = [float(s) for s in scores]  # type: ignore[arg-type]
        hard = argmax_credit(vals)
        soft = float(softmax(vals)[0])
        return self._judgment(hard, soft, [int(np.argmax(vals))], method="loglikelihood",
                              extra={"scores": [round(v, 4) for v in vals], "pmi": pmi})

    def _judgment(self, hard: float, soft: float, decisions: list[Any], method: str, extra: dict[str, Any]) -> Judgment:
        acc = hard if self.cfg.signal == "hard" else soft
        return Judgment(
            score=self.cfg.lam * acc,
            decision=decisions,
            method=method,
            extra={"hard": hard, "soft": soft, "mode": self.cfg.mode, "direction": self.cfg.direction,
                   "k": self.cfg.k, **extra},
        )


def _continuation(caption: str) -> str:
    text = caption.strip()
    return " " + text if text else ""


def _groups(sets: list[list[list[float]]]) -> list[list[int]]:
    """Rows that share a candidate set (e.g. the G captions of one item), in first-seen order."""
    groups: dict[tuple, list[int]] = {}
    for row, cands in enumerate(sets):
        key = tuple(tuple(c) for c in cands)
        groups.setdefault(key, []).append(row)
    return list(groups.values())
