"""The reward's one configuration: family, identification scoring, shaping and the lost-reward bound.

``RewardSpec`` is the ``reward:`` section of every YAML that describes a reward: ``train lineup``'s and
``train rubicap``'s (``RubicapRewardConfig`` extends it with image defaults), the reward service's
(``captionrl serve reward``) and the engine adapters' (``CAPTIONRL_REWARD_CONFIG``), one spelling and one
name per judge family everywhere (``FAMILIES``). ``train moco`` and ``eval hacking`` describe their rewards
with it too. ``rewards.reward.build_reward`` turns it (with the verifier backend and how series are
printed) into the one ``Reward`` object every face wraps, so "shaped exactly as in training" holds by
construction.

``RewardSetup`` is what a process needs to build that reward on its own: the verifier, the spec and how
series are printed (``series``). The service's config extends it; the adapters' YAML is one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from captionrl.backends import BackendConfig
from captionrl.config import help_field
from captionrl.errors import ConfigError
from captionrl.judges.identification import IdentifyConfig, IdentifyScoring
from captionrl.judges.ngram import NgramConfig
from captionrl.judges.rubric import RubricJudgeSettings
from captionrl.judges.series_qa import SeriesQuestionsConfig
from captionrl.rewards.bound import RewardBound
from captionrl.rewards.shaping import ShapingConfig

FAMILIES = ("identification", "answerability", "judge", "rubric", "cider")
"""Which judge gives a reward's base score: LineupRL's identification; the answerability (CapRL) and
LLM-as-judge baselines; a rubric judge (RubiCap); CIDEr-D against references (RL-NLP baseline)."""

SERIES_FAMILIES = ("identification", "answerability", "judge")
"""The families ``train lineup`` trains with (LineupRL's own and Table 4's two RL baselines)."""

IMAGE_FAMILIES = ("rubric", "cider", "judge", "answerability")
"""The families ``train rubicap`` trains with (RubiCap's rubric and the paper's three baselines)."""

RENAMED_FAMILIES = {"scalar": "judge", "likert": "judge", "ngram": "cider", "qa": "answerability"}
"""Older names of a family (the judges' own names: ``scalar``, ``ngram``, ``qa``; RubiCap's ``likert``)."""


def check_family(family: str, choices: tuple[str, ...], field: str = "reward.family") -> None:
    """``family`` is one of ``choices``; a renamed family's error names its one name (``RENAMED_FAMILIES``)."""
    if family in choices:
        return
    new = RENAMED_FAMILIES.get(family)
    if new is not None:
        raise ConfigError(field, family, f"was renamed to {new}", f"write {field}: {new} (the same judge)")
    if family in FAMILIES:
        raise ConfigError(field, family, "is not a family this command trains", f"use one of {', '.join(choices)}")
    from captionrl.registry import suggest

    raise ConfigError(field, family, "unknown reward family", suggest(family, list(choices)))


@dataclass
class AnswerabilityConfig(SeriesQuestionsConfig):
    """The answerability family (Table 4, after CapRL): the frozen answerer's accuracy on the item's
    verified multiple-choice questions from the caption alone. ``train lineup`` writes and verifies the
    questions per series (``judges.series_qa``); the service and the adapters read them from the label."""

    n_questions: int = help_field(4, "questions drawn per caption (with replacement) from the item's verified ones")
    seed: int | None = help_field(None, "seed of the question draws and option shuffles, combined with each item's id (null = the run's seed)")
    cannot_answer: bool = help_field(True, "add a 'cannot be answered from the description' option to every question")
    shuffle_options: bool = help_field(True, "shuffle the options of every drawn question")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_questions < 1:
            raise ConfigError("reward.answerability.n_questions", self.n_questions, "must be >= 1",
                              "set reward.answerability.n_questions: 4")


@dataclass
class JudgeFamilyConfig:
    """The LLM-as-judge family (Table 4's baseline; RubiCap's RL-Judge): the frozen model grades each caption."""

    mode: str = help_field("generate", "generate (parse an integer grade 1-10, the paper's) or choose (expected grade over the digits 1-9 from the logits; never unparseable)")
    show_series: bool = help_field(True, "show the judge the series' values (as the verifier prints them) before the caption; false: it grades the caption alone (series rows only)")
    use_reference: bool = help_field(True, "show the item's reference caption (column 'reference') when the row has one")
    max_new_tokens: int = help_field(8, "generate: tokens for the grade")

    def __post_init__(self) -> None:
        if self.mode not in ("generate", "choose"):
            raise ConfigError("reward.judge.mode", self.mode, "unknown mode", "use generate or choose")
        if self.max_new_tokens < 1:
            raise ConfigError("reward.judge.max_new_tokens", self.max_new_tokens, "must be >= 1", "set 8")


@dataclass
class RubricFamilyConfig(RubricJudgeSettings):
    """The rubric family (RubiCap's reward): how the judge decides each weighted binary criterion (the
    settings RubiCap's and MoCo's judges share), and where rows that name an item find its rubric."""

    FIELD_PREFIX: ClassVar[str] = "reward.rubric"

    store: str | None = help_field(None, "rubric store JSONL for rows that give an item_id instead of a rubric")


@dataclass
class RewardSpec(ShapingConfig, RewardBound, IdentifyScoring):
    """A reward: its family's judge, the identification scoring (mode, k, signal, lam), the shaping around
    it (``ShapingConfig``: guard, factuality, length, numbers-masked pass, description terms) and the
    lost-reward bound (``RewardBound``; training only). Errors name keys as ``reward.<key>``."""

    FIELD_PREFIX: ClassVar[str] = "reward"

    family: str = help_field("identification", "which judge gives the base score: identification (LineupRL: find the series among K from the caption), answerability (accuracy on the item's verified questions answered from the caption), judge (a 1-10 grade of the caption), rubric (RubiCap, MoCo: weighted binary criteria) or cider (CIDEr-D against references)")
    subject: str = help_field("time series", "what the captions describe, as the answerer's and the grader's prompts name it (time series, image)")
    answerability: AnswerabilityConfig = field(default_factory=AnswerabilityConfig, metadata={"help": "family answerability: question writing (train lineup), verification and drawing"})
    judge: JudgeFamilyConfig = field(default_factory=JudgeFamilyConfig, metadata={"help": "family judge: how the grade is asked and read"})
    rubric: RubricFamilyConfig = field(default_factory=RubricFamilyConfig, metadata={"help": "family rubric: how each criterion is decided"})
    cider: NgramConfig = field(default_factory=NgramConfig, metadata={"help": "family cider: CIDEr-D settings and the training references its document frequencies are fitted on"})

    def __post_init__(self) -> None:
        RewardBound.__post_init__(self)  # the bound's checks, then (cooperatively) IdentifyScoring's
        check_family(self.family, FAMILIES)
        if self.false_claim_base == "chance" and self.family != "identification":
            raise ConfigError("reward.false_claim_base", "chance", f"chance (lam / k) is an identification score's; family is {self.family}",
                              "use false_claim_base: none, or full")
        if not self.subject.strip():
            raise ConfigError("reward.subject", self.subject, "must name what the captions describe",
                              "set reward.subject: time series (or image)")
        self.validate_shaping()

    def identify_config(self, precision: int = 2, normalise: str | None = None) -> IdentifyConfig:
        """The identification judge's settings: this scoring, caption -> series, series printed as given."""
        import dataclasses

        scoring = {f.name: getattr(self, f.name) for f in dataclasses.fields(IdentifyScoring)}
        return IdentifyConfig(**scoring, direction="c2s", precision=precision, normalise=normalise)


@dataclass
class SeriesPrint:
    """How the verifier prints a series (the prompt's numbers): ``train lineup`` takes them from ``data``."""

    precision: int = help_field(2, "decimals when printing series values")
    normalise: str | None = help_field(None, "print values as they are (null), or zscore / minmax normalised")

    def __post_init__(self) -> None:
        if self.precision < 0:
            raise ConfigError("series.precision", self.precision, "must be >= 0", "set series.precision: 2")
        if self.normalise not in (None, "zscore", "minmax"):
            raise ConfigError("series.normalise", self.normalise, "unknown normalisation", "use null, zscore or minmax")


@dataclass
class RewardSetup:
    """Everything a process needs to build the reward on its own: the verifier (the judge's model), the
    reward and how series are printed. The adapters' YAML is one; the service's config extends it."""

    MERGED_SECTIONS: ClassVar[dict[str, str]] = {
        "backend": "verifier", "identify": "reward", "shaping": "reward", "rubric": "reward.rubric",
        "scalar": "reward.judge", "qa": "reward.answerability", "ngram": "reward.cider"}
    """Sections of the adapters' and the service's YAML before the reward had one spelling, and where their
    keys went (``config.from_dict`` names the new place)."""

    verifier: BackendConfig = field(default_factory=BackendConfig, metadata={"help": "the frozen model behind the reward's judge (unused by cider)"})
    reward: RewardSpec = field(default_factory=RewardSpec, metadata={"help": "the reward: family, identification scoring, shaping (the reward.* keys of train lineup)"})
    series: SeriesPrint = field(default_factory=SeriesPrint, metadata={"help": "identification: how the verifier prints the candidate series"})

    def needs_main_column(self) -> bool:
        """Whether every label must carry the family's main column (the judge family grades without a reference
        when ``reward.judge.use_reference`` is off)."""
        return self.reward.family != "judge" or self.reward.judge.use_reference
