"""The one reward object: a family's judge and the shaping around it, scoring captions into judgments.

``build_reward(spec, verifier)`` -> ``Reward``; ``Reward.score(captions, columns)`` returns one shaped
``Judgment`` per caption: ``score`` is the shaped reward (``None`` = unscored: the judge failed, never a
0), ``extra`` holds the judge's own fields (hard/soft, accuracy, grade...) and every shaping term
(``base``, ``masked``, ``length_penalty``, ``transcription_penalty``, ``red_share``, ...), and ``raw``,
``decision``, ``error`` keep the judge's evidence. It knows nothing of TRL, HTTP or engines: the TRL reward
function (``rewards.trl_face.RewardFunction``), the reward service (``serve``) and the OpenRLHF/verl functions
(``adapters``) are thin faces over it, so a caption is shaped exactly as in training wherever it is scored,
the numbers-masked pass included (the object makes its second judge call itself).

A ``Reward`` is also a ``Judge`` (``judge`` is ``score``): evaluation code and the service's batching take
it as one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from captionrl.errors import DataError
from captionrl.judges.base import Columns, Judge
from captionrl.rewards.shaping import Shaper, ShapingConfig, mask_numbers, terms
from captionrl.rewards.spec import RewardSpec, SeriesPrint
from captionrl.types import Judgment

if TYPE_CHECKING:
    from captionrl.judges.online_rubric import OnlineRubricConfig

FAMILY_FIELDS = {"identification": ("hard", "soft"), "answerability": ("accuracy", "cannot_answer_rate"),
                 "judge": ("expected_grade", "grade"), "rubric": (), "cider": ()}
"""The numeric fields each family's judge puts in a judgment's ``extra`` (logged by every face)."""


class Reward:
    """A judge's scores shaped by ``shaping`` (see the module doc); ``family`` names the judge in logs.

    Args:
        judge: any ``Judge`` (``judge(captions, columns) -> list[Judgment]``).
        shaping: the shaping settings (a ``RewardSpec`` or any ``ShapingConfig``); None: every term off.
        family: the reward family (``rewards.spec.FAMILIES``); decides the judge fields logged.
        name: the reward's name in logs (TRL's ``rewards/<name>/mean``); default: the family.
    """

    def __init__(self, judge: Judge, shaping: ShapingConfig | None = None, family: str = "identification",
                 name: str | None = None, series_rows: bool | None = None, instruction: str | None = None) -> None:
        self.base = judge
        self.shaping = shaping if shaping is not None else ShapingConfig.off()
        self.shaper = Shaper(self.shaping, instruction)
        self.family = family
        self.name = name or family
        self.series_rows = family == "identification" if series_rows is None else series_rows
        self.backend = getattr(judge, "backend", None)  # which model to bring back when it fails (/health too)

    # ------------------------------------------------------------------ columns
    def needed_columns(self) -> list[str]:
        """Columns the shaping terms read where every row describes a series (``series_rows``: identification
        rows, and every row of ``train lineup``): the true series (``candidates[0]`` serves for identification).
        Elsewhere (an image judge through the service) the series terms apply to the rows that carry a series."""
        return ["series"] if self.series_rows and self.shaper.needs_series() else []

    def columns_for(self, columns: Columns, n: int) -> dict[str, list[Any]]:
        """``columns`` as lists, with ``series`` taken from the candidates' first (true) series when a row
        set gives candidates but no series (an engine's label), and checked for what the terms need."""
        cols = {k: list(v) for k, v in columns.items()}
        if "series" not in cols and "candidates" in cols:
            cols["series"] = [c[0] if isinstance(c, (list, tuple)) and c else [] for c in cols["candidates"]]
        for name in self.needed_columns():
            value = cols.get(name)
            if value is None or len(value) != n or not any(len(v or []) for v in value):
                raise DataError(f"columns.{name}", sorted(cols),
                                f"reward {self.name!r} needs the {name!r} column (transcription guard / factuality "
                                "term) and did not get it",
                                f"keep a {name!r} column in the rows (train.remove_unused_columns stays off; engines: "
                                "the label's candidates), or switch the terms off (reward.transcription_penalty: 0, "
                                "reward.run_penalty: 0, reward.factuality_penalty: 0, reward.factuality_bonus: 0)")
        return cols

    # ------------------------------------------------------------------ scoring
    def score(self, captions: Sequence[str], columns: Columns) -> list[Judgment]:
        """One shaped judgment per caption (``score`` None where the judge, or its masked pass, failed)."""
        captions = [str(c) for c in captions]
        cols = self.columns_for(columns, len(captions))
        base = self.base.judge(captions, cols)
        masked = None
        if self.shaping.masked_weight > 0:
            masked = self.base.judge([mask_numbers(c) for c in captions], cols)
        shaped = self.shaper.shape(captions, [j.score if j.scored else None for j in base], cols.get("series"),
                                   cols.get("series_text"), [m.score if m.scored else None for m in masked]
                                   if masked is not None else None)
        out = []
        for i, (cap, j, s) in enumerate(zip(captions, base, shaped, strict=True)):
            error = j.error
            if error is None and masked is not None and not masked[i].scored:
                error = f"numbers-masked pass: {masked[i].error or 'unscored'}"
            out.append(Judgment(score=s.reward, decision=j.decision, raw=j.raw, reason=j.reason, method=j.method,
                                error=error, extra={**j.extra, **terms(cap, s)}))
        return out

    judge = score  # a Reward is a Judge too

    def log_keys(self) -> tuple[str, ...]:
        """The numeric ``extra`` fields of this reward's judgments that engines log, one fixed set."""
        keys = [*FAMILY_FIELDS.get(self.family, ()), "base", "length_penalty", "caption_chars"]
        if self.shaping.masked_weight > 0:
            keys.append("masked")
        if self.series_rows:
            keys += ["transcription_penalty", "copied_values", "transcription_share"]
        if self.series_rows and self.shaper.factuality.enabled:
            keys += ["red_share", "green_share", "factuality_penalty"]
        if self.series_rows:
            keys += ["key_facts", "wrong_facts", "direction_stated", "direction_right", "degenerate", "description_term"]
        return tuple(dict.fromkeys(keys))


def build_reward(spec: RewardSpec, verifier: Any = None, *, series: SeriesPrint | None = None, seed: int = 0,
                 cider_corpus: Sequence[Sequence[str]] | None = None, name: str | None = None,
                 series_rows: bool | None = None, instruction: str | None = None,
                 online: OnlineRubricConfig | None = None, records: Any = None) -> Reward:
    """The reward ``spec`` describes, its judge on ``verifier`` (a backend, or a code verifier such as
    ``judges.claims_verifier.ClaimsVerifier`` for identification; unused by ``cider``).

    Args:
        series: how the verifier prints candidate series (identification, and the judge family's context).
        seed: seeds the answerability family's question draws (combined with each item's id) unless
            ``reward.answerability.seed`` is set.
        cider_corpus: reference sets the CIDEr-D document frequencies are fitted on, once; default: the file
            or folder ``spec.cider.references`` names (the service and adapters refuse CIDEr-D without one).
        series_rows: every row describes a series, so a missing ``series`` column is an error rather than the
            series terms switching off (default: identification rows; ``train lineup`` says so for every family).
        instruction: the captioning instruction the policy reads (the degenerate check catches its echo).
        online: the rubric family's rubrics are written per group by a Generator (MoCo): ``verifier`` is then a
            ``judges.online_rubric.RoleServer`` serving the Generator and the Judge, these its settings;
            ``records`` writes one record per group. Without it a rubric comes with each row (or its store).
    """
    judge = family_judge(spec, verifier, series or SeriesPrint(), seed, cider_corpus, online, records)
    return Reward(judge, spec, family=spec.family, name=name, series_rows=series_rows, instruction=instruction)


def family_judge(spec: RewardSpec, verifier: Any, series: SeriesPrint, seed: int,
                 cider_corpus: Sequence[Sequence[str]] | None, online: OnlineRubricConfig | None = None,
                 records: Any = None) -> Judge:
    """The judge of ``spec.family`` (``rewards.spec.FAMILIES``)."""
    family = spec.family
    if family == "cider":
        from captionrl.judges.ngram import NgramJudge

        return NgramJudge(spec.cider, corpus=cider_corpus, field_prefix="reward.cider")
    if verifier is None:
        raise DataError("verifier", None, f"the {family} reward needs a verifier backend", "give the verifier section")
    if family == "identification":
        from captionrl.judges.identification import identification_judge

        return identification_judge(verifier, spec.identify_config(series.precision, series.normalise))
    if family == "answerability":
        from captionrl.judges.qa import QAConfig, QAJudge

        a = spec.answerability
        return QAJudge(verifier, QAConfig(n_questions=a.n_questions, seed=seed if a.seed is None else a.seed,
                                          cannot_answer=a.cannot_answer, shuffle_options=a.shuffle_options,
                                          subject=spec.subject))
    if family == "judge":
        from captionrl.judges.scalar import ScalarConfig, ScalarJudge

        j = spec.judge
        article = "an" if spec.subject[:1].lower() in "aeiou" else "a"
        return ScalarJudge(verifier, ScalarConfig(mode=j.mode, use_reference=j.use_reference,
                                                  max_new_tokens=j.max_new_tokens, subject=f"{article} {spec.subject}",
                                                  context_column="series_text" if j.show_series and series_subject(spec)
                                                  else None))
    r = spec.rubric
    if online is not None:
        from captionrl.judges.online_rubric import OnlineRubricJudge, moco_judge_factory

        return OnlineRubricJudge(verifier, online, judge_factory=moco_judge_factory(r), records=records)
    from captionrl.judges.rubric import RubricStore

    return r.rubric_judge(verifier, store=RubricStore(r.store) if r.store else None)


def series_subject(spec: RewardSpec) -> bool:
    """Whether the captions describe series (``reward.subject``), so the judge family shows the values."""
    return "series" in spec.subject.lower()


def sample_extras(judgment: Judgment) -> Mapping[str, Any]:
    """The numeric fields of a judgment's ``extra`` (what a sample record keeps beside the caption)."""
    return {k: v for k, v in judgment.extra.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
