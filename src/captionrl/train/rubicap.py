"""``captionrl train rubicap``: RubiCap, GRPO of an image captioner with rubric rewards.

The paper's loop: every training image has an offline, image-specific rubric (weighted binary criteria
written from a teacher committee's consensus, or, for synthetic scenes, from their known facts); the
policy samples a group of G captions per image; a text-only LLM judge decides each criterion for each
caption; the reward is ``sum(w * satisfied) / sum(w)`` (``captionrl.judges.rubric.RubricJudge``); GRPO
turns the group's rewards into advantages. Everything trainer-side is TRL through ``train.run.builder``; this
module builds the items, the rubric store and the reward, and reports what was written.

Images reach the policy as TRL 1.16 expects for VLMs: an ``image`` column plus chat prompts whose user
turn holds an ``{"type": "image"}`` placeholder, and a ``ProcessorMixin`` processing class (loaded by
``train.run.loading.load_policy`` for any model whose config has a ``vision_config``).

Rubrics (``rubrics.source``): ``facts`` builds them from the items' known facts (synthetic scenes,
easy-vqa); ``store`` reads a JSONL store written by ``captionrl rubrics build``; ``build`` runs that
pipeline first (committee captions -> writer -> store; resumable). In every case the rubrics that ran are
kept in ``out_dir/rubrics/rubrics.jsonl``-style stores and copied into the dataset's ``rubric`` column, so
each per-caption sample record carries the rubric it was judged against. An item whose rubric the writer
could not produce is left out of training and counted (a rubric-less item has no reward to learn from).

Reward families (``reward.family``, the one reward spec's: ``rewards.spec.RewardSpec``, built by
``rewards.reward.build_reward``): ``rubric`` (the above) or one of the paper's baselines through the same
recipe, data, preflight and checks: ``cider`` (CIDEr-D against the item's references), ``judge`` (the
judge LLM's 1-10 grade of the caption next to its reference: RL-Judge / Reference-Likert) and
``answerability`` (the judge LLM answers the item's multiple-choice questions from the caption). Each goes
through one reward callable (``RubricReward``: ``None`` for unscored, never 0), names its metrics
``<family>/...`` and ``rewards/<family>/mean``, and the result file records ``reward_family``. The rubric
judge then becomes the end-of-run check the baseline was not trained on (next to CIDEr-D, unless CIDEr-D
was the reward).

Run folder (``train.out_dir``): ``config.yaml``, ``rubrics/`` (store and build records), ``checkpoints/``,
``metrics.jsonl``, ``samples.rank*.jsonl`` (step, item, caption, reward, per-criterion decisions),
``tensorboard/``, ``curves.png``, ``model/`` and ``result.json``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from captionrl.backends import BackendConfig
from captionrl.backends.startup import probe_servers
from captionrl.config import help_field
from captionrl.domains.captioning import IMAGE_CAPTION_INSTRUCTION
from captionrl.domains.image_data import ImageDataConfig, ImageLoadResult
from captionrl.errors import ConfigError, DataError
from captionrl.judges.rubric_build import RubricWriterSettings
from captionrl.rewards.reward import Reward, build_reward
from captionrl.rewards.spec import IMAGE_FAMILIES, JudgeFamilyConfig, RewardSpec, check_family
from captionrl.rewards.trl_face import RewardFunction
from captionrl.train.run import builder
from captionrl.train.run.sections import GRPOTrainConfig, PolicyConfig, backend_config
from captionrl.train.run.skeleton import Recipe, Run, run_summary, train

logger = logging.getLogger(__name__)

TINY_VLM = "tiny-vlm"
"""Policy name resolved to ``captionrl.tiny_models.vlm.tiny_vlm_dir()`` (the tiny offline VLM)."""

CURVE_KEYS = ("reward", "frac_reward_zero_std", "rubric/unscored_frac", "completions/mean_length",
              "rubric/caption_chars", "rubric/criteria_met", "loss", "kl")
"""Panels of ``curves.png``: mean reward, zero-std group fraction, unscored fraction, caption length
(``rubric/`` keys are renamed to the reward family's prefix, ``RubicapRecipe.curve_keys``)."""

REWARD_FAMILIES = IMAGE_FAMILIES
"""``reward.family``: which judge produces the GRPO reward. ``rubric`` is RubiCap; the others are the paper's
baselines through the same recipe: ``cider`` (RL-NLP: CIDEr-D against the item's reference captions),
``judge`` (RL-Judge / Reference-Likert: a 1-10 grade of the caption next to its reference by the judge
LLM, ``judges.scalar``) and ``answerability`` (CapRL: the judge LLM answers the item's multiple-choice
questions from the caption alone, ``judges.qa``)."""


# ---------------------------------------------------------------------- config
@dataclass
class RubicapDataConfig(ImageDataConfig):
    """The training images (``ImageDataConfig``: source, path, n, on_bad_image, ...) and the instruction
    the policy captions them with. ``items``, ``n_train`` and ``on_error`` are the older spellings, mapped
    onto the shared fields (and cleared) when set."""

    min_references: int = help_field(0, "reference captions an image must have (0: RubiCap's rubrics come from the teacher committee; references feed only the reward preflight and the final CIDEr-D check)")
    items: str | None = help_field(None, "older shorthand, replaces source/path/images/n when set: scenes:N[:SEED], easy-vqa[:SPLIT[:LIMIT]], or a manifest/folder path (source manifest)")
    n_train: int | None = help_field(None, "older name of data.n")
    instruction: str = help_field(IMAGE_CAPTION_INSTRUCTION, "the caption request shown after the image")
    on_error: str | None = help_field(None, "older name of data.on_bad_image: raise (= error) or skip")

    def __post_init__(self) -> None:
        if self.items is not None:  # first: it replaces source, path, images and n; n_train may then set n
            apply_items_spec(self, self.items)
            self.items = None
        if self.n_train is not None:
            if self.n_train < 1:
                raise ConfigError("data.n_train", self.n_train, "must be >= 1 (or null for all)", "set data.n: 64")
            self.n, self.n_train = self.n_train, None
        if self.on_error is not None:
            if self.on_error not in ("raise", "skip"):
                raise ConfigError("data.on_error", self.on_error, "unknown policy", "use data.on_bad_image: error or skip")
            self.on_bad_image, self.on_error = ("error" if self.on_error == "raise" else "skip"), None
        self.check_image_data()
        if not self.instruction.strip():
            raise ConfigError("data.instruction", self.instruction, "is empty", "ask for a caption, e.g. 'Describe this image in detail.'")


def apply_items_spec(d: ImageDataConfig, spec: str) -> None:
    """Map the older ``data.items`` string onto the shared fields (it replaces source, path, images and n)."""
    head, *rest = str(spec).split(":")
    d.path, d.images, d.n = "", None, None
    try:
        if head == "scenes":
            d.source, d.scene_count = "scenes", int(rest[0]) if rest else 8
            d.scene_seed = int(rest[1]) if len(rest) > 1 else 0
        elif head == "easy-vqa":
            d.source, d.split = "easy-vqa", rest[0] if rest else "train"
            if len(rest) > 1 and d.n is None:
                d.n = int(rest[1])
        else:
            d.source, d.path = "manifest", str(spec)
    except ValueError as exc:
        raise ConfigError("data.items", spec, "scenes and easy-vqa take integers", "write scenes:N[:SEED] or easy-vqa:SPLIT:LIMIT") from exc


@dataclass
class RubricsConfig(RubricWriterSettings):
    """Where each image's rubric comes from (offline, before training). With ``source: build`` the writer's
    attempts, retry temperature and rubric size are every rubric writer's (``RubricWriterSettings``)."""

    FIELD_PREFIX: ClassVar[str] = "rubrics"

    source: str = help_field("facts", "facts (from the items' known facts: synthetic scenes, easy-vqa), store (a JSONL rubric store from 'captionrl rubrics build') or build (run the committee + writer pipeline first; resumable)")
    store: str | None = help_field(None, "store: path of rubrics.jsonl; facts/build: folder of the store (null = out_dir/rubrics)")
    missing: str = help_field("error", "items absent from the store: error (stop, name them) or skip (train on the items that have rubrics)")
    committee: list[dict[str, Any]] = help_field([], "build: teacher backends (BackendConfig mappings, e.g. {kind: openai, model: ..., base_url: ...})")
    writer: dict[str, Any] | None = help_field(None, "build: the rubric writer backend (BackendConfig mapping)")
    student: dict[str, Any] | None = help_field(None, "build: optional student backend whose captions the writer diagnoses (null = none)")
    writer_sees_image: bool = help_field(False, "build: show the image to a VLM writer too")
    caption_max_new_tokens: int = help_field(512, "build: committee and student caption length")
    writer_max_new_tokens: int = help_field(1024, "build: rubric reply length")
    image_text: str = help_field("none", "build: none (teachers see the image) or references (language-only teachers read the items' reference captions instead)")
    structured_output: str = help_field("none", "build: constrain the writer's reply to the rubric JSON schema: none, json_schema (OpenAI/vLLM) or json_object (llama.cpp)")
    max_teacher_failure_share: float = help_field(0.05, "build: largest share of the items a committee teacher may fail on (no caption, or an empty one) before on_teacher_failure applies")
    on_teacher_failure: str = help_field("error", "build: a teacher over max_teacher_failure_share: error (stop before writing rubrics; rerun resumes and retries the failed captions) or warn (build from fewer teachers, said loudly and in summary.json)")

    def __post_init__(self) -> None:
        from captionrl.judges.rubric_build import check_teacher_failure_policy

        super().__post_init__()
        check_teacher_failure_policy(self.max_teacher_failure_share, self.on_teacher_failure, "rubrics.")
        if self.source not in ("facts", "store", "build"):
            raise ConfigError("rubrics.source", self.source, "unknown rubric source", "use facts, store or build")
        if self.missing not in ("error", "skip"):
            raise ConfigError("rubrics.missing", self.missing, "unknown policy", "use error or skip")
        if self.source == "store" and not self.store:
            raise ConfigError("rubrics.store", self.store, "source 'store' needs the store's path",
                              "set rubrics.store: path/to/rubrics.jsonl (written by 'captionrl rubrics build')")
        if self.source == "build":
            if not self.committee:
                raise ConfigError("rubrics.committee", self.committee, "building rubrics needs teacher backends",
                                  "list them, e.g. [{kind: openai, model: Qwen2.5-VL-72B-Instruct, base_url: http://HOST:8001/v1}]")
            if not self.writer:
                raise ConfigError("rubrics.writer", self.writer, "building rubrics needs a writer backend",
                                  "set rubrics.writer: {kind: openai, model: ..., base_url: ...}")
        from captionrl.judges.roles import STRUCTURED_OUTPUTS

        if self.image_text not in ("none", "references"):
            raise ConfigError("rubrics.image_text", self.image_text, "unknown choice", "use none or references")
        if self.structured_output not in STRUCTURED_OUTPUTS:
            raise ConfigError("rubrics.structured_output", self.structured_output, "unknown style",
                              f"use one of {', '.join(STRUCTURED_OUTPUTS)}")
        # Validate the backend mappings now (unknown keys, missing URLs), before any model or server is touched.
        for i, b in enumerate(self.committee):
            backend_config(b, f"rubrics.committee[{i}]")
        for name in ("writer", "student"):
            if getattr(self, name) is not None:
                backend_config(getattr(self, name), f"rubrics.{name}")


@dataclass
class ImageJudgeFamilyConfig(JudgeFamilyConfig):
    """The judge family on image captions: the grade read from the logits by default (small judges)."""

    mode: str = help_field("choose", "choose (expected grade over the digits 1-9 from the logits; never unparseable) or generate (parse an integer grade 1-10, the paper's)")


@dataclass
class RubicapRewardConfig(RewardSpec):
    """The reward spec (``rewards.spec.RewardSpec``, the ``reward:`` section of every recipe) with RubiCap's
    defaults: the rubric family on image captions, every shaping term off. ``reward.rubric`` decides each
    criterion (reward = satisfied weight fraction) and also serves the other families' end-of-run check:
    there the rubric judge is the score the policy was not trained on."""

    MERGED_SECTIONS: ClassVar[dict[str, str]] = {
        "likert": "judge", **dict.fromkeys(("decision", "threshold", "max_new_tokens", "structured_output", "temperature"),
                                           "rubric")}
    """RubiCap's keys before its reward was the one spec, and where they went (``config.from_dict`` names it)."""

    family: str = help_field("rubric", "the reward: rubric (RubiCap), cider (CIDEr-D vs the references: RL-NLP baseline), judge (1-10 grade of the caption next to its reference by the judge LLM: RL-Judge baseline) or answerability (the judge LLM answers the item's multiple-choice questions from the caption: CapRL)")
    subject: str = help_field("image", "what the captions describe, as the answerer's and the grader's prompts name it")
    judge: ImageJudgeFamilyConfig = field(default_factory=ImageJudgeFamilyConfig, metadata={"help": "family judge: how the judge LLM is asked for the grade"})
    transcription_penalty: float = help_field(0.0, "penalty per copied series value (image captions have no series: off)")
    run_penalty: float = help_field(0.0, "penalty for a run of copied series values (image captions have no series: off)")

    def __post_init__(self) -> None:
        if self.mode not in ("letter", "likelihood"):  # the rubric judge's mode, written where it was before
            raise ConfigError("reward.mode", self.mode, "is the identification verifier's mode; the rubric judge's is reward.rubric.mode",
                              f"write reward.rubric.mode: {self.mode}")
        super().__post_init__()
        check_family(self.family, REWARD_FAMILIES)


@dataclass
class RubicapTrainConfig(GRPOTrainConfig):
    """GRPO settings with RubiCap's own run folder."""

    out_dir: str = help_field("runs/rubicap", "run folder: rubrics, checkpoints, metrics, curves, final model; rerunning with the same folder resumes")


@dataclass
class RubicapConfig:
    """A RubiCap run: fully described by its YAML plus overrides, saved as out_dir/config.yaml."""

    seed: int = help_field(0, "one seed for everything: item sampling, shuffling, sampling of captions")
    check: bool = help_field(False, "validate the config, the images and the rubric store, then stop (loads no model)")
    build_rubrics: bool = help_field(False, "only write the rubric store (rubrics.source facts/build; resumable), then stop: run it once, in one process, before a multi-GPU launch")
    policy: PolicyConfig = field(default_factory=lambda: PolicyConfig(model=TINY_VLM),
                                 metadata={"help": "the captioner being trained (a VLM; 'tiny-vlm' = the offline test VLM)"})
    judge: BackendConfig = field(default_factory=BackendConfig, metadata={"help": "the text-only LLM that decides each rubric criterion"})
    data: RubicapDataConfig = field(default_factory=RubicapDataConfig, metadata={"help": "training images"})
    rubrics: RubricsConfig = field(default_factory=RubricsConfig, metadata={"help": "where rubrics come from"})
    reward: RubicapRewardConfig = field(default_factory=RubicapRewardConfig, metadata={"help": "the reward (the reward spec of every recipe): family, its judge (reward.rubric, reward.judge, ...), lost-reward bound"})
    train: RubicapTrainConfig = field(default_factory=RubicapTrainConfig, metadata={"help": "TRL trainer settings (algorithm grpo)"})

    def __post_init__(self) -> None:
        if self.train.seed is None:
            self.train.seed = self.seed
        if self.policy.input not in ("auto", "chart"):
            raise ConfigError("policy.input", self.policy.input, "RubiCap captions images: the policy reads the image",
                              "remove policy.input (auto) and use a VLM policy")

    def store_path(self) -> Path:
        """The rubric store this run reads."""
        if self.rubrics.source == "store":
            return Path(str(self.rubrics.store))
        return Path(self.rubrics.store or Path(self.train.out_dir) / "rubrics") / "rubrics.jsonl"


# ---------------------------------------------------------------------- data
@dataclass
class RubicapData:
    """Training rows (TRL shape) and what was left out, with why."""

    rows: list[dict[str, Any]]
    lazy_images: bool  # True: ``image`` holds file paths, decoded by the dataset on access
    skipped: dict[str, list[str]]  # reason -> item ids
    store: Path
    images: dict[str, Any] = field(default_factory=dict)  # ImageLoadResult.summary(): loaded, skipped by reason
    references: dict[str, list[str]] = field(default_factory=dict)  # item id -> reference captions


def load_items(cfg: RubicapConfig) -> ImageLoadResult:
    """The configured images, validated (each opens and decodes, has its references), seeded sample of
    ``data.n``; what was skipped comes back with them (``result.json`` records it)."""
    from captionrl.domains.image_data import load_image_items

    return load_image_items(cfg.data, seed=cfg.seed)


def ensure_rubrics(cfg: RubicapConfig, items: Sequence[Any], *, allow_models: bool = True) -> Path:
    """Make sure the store holds every item's rubric; returns the store path.

    ``facts`` writes the facts' rubrics (no model); ``build`` runs the committee + writer pipeline
    (``allow_models=False``, as in ``--check``, only reports); ``store`` is read as is.
    """
    from captionrl.judges.rubric_build import build_rubrics

    store = cfg.store_path()
    if cfg.rubrics.source == "facts":
        no_facts = [it.id for it in items if not it.facts]
        if no_facts:
            raise DataError("data.source", f"{len(no_facts)} item(s), e.g. {no_facts[:3]}", "have no known facts to build rubrics from",
                            "use data.source: scenes or easy-vqa (or a manifest with facts), or set rubrics.source: store / build")
        build_rubrics(items, teachers=[], writer=None, out_dir=store.parent, seed=cfg.seed, progress=False)
    elif cfg.rubrics.source == "build" and allow_models:
        from captionrl.backends import make_backend
        from captionrl.judges.rubric_build import RubricWriter

        r = cfg.rubrics
        teachers = [make_backend(backend_config(b, f"rubrics.committee[{i}]")) for i, b in enumerate(r.committee)]
        writer = RubricWriter(make_backend(backend_config(r.writer, "rubrics.writer")), r,
                              max_new_tokens=r.writer_max_new_tokens, seed=cfg.seed, with_image=r.writer_sees_image,
                              structured_output=r.structured_output)
        student = make_backend(backend_config(r.student, "rubrics.student")) if r.student else None
        build_rubrics(items, teachers=teachers, writer=writer, out_dir=store.parent, student=student,
                      instruction=cfg.data.instruction, max_new_tokens=r.caption_max_new_tokens, seed=cfg.seed,
                      image_text=r.image_text, max_teacher_failure_share=r.max_teacher_failure_share,
                      on_teacher_failure=r.on_teacher_failure, failure_field="rubrics.max_teacher_failure_share")
    elif cfg.rubrics.source == "store" and not store.is_file():
        raise ConfigError("rubrics.store", str(store), "file not found",
                          "build it first: captionrl rubrics build --items ITEMS --committee ... --writer ... --out DIR")
    return store


def family_columns(reward: RubicapRewardConfig, item: Any) -> dict[str, Any]:
    """The dataset columns the reward family's judge reads, checked now (before any model loads):
    ``references`` (cider), ``reference`` (judge with use_reference) or ``questions`` (answerability)."""
    from captionrl.judges.qa import to_question

    refs = [str(r) for r in getattr(item, "references", ()) or ()]
    if reward.family == "cider" or (reward.family == "judge" and reward.judge.use_reference):
        if not refs:
            fix = ("give every item reference captions (manifest 'captions'), or leave it out"
                   + ("" if reward.family == "cider" else ", or set reward.judge.use_reference: false"))
            raise DataError(f"data.items[{item.id}].references", [], f"reward family {reward.family!r} needs reference captions", fix)
        return {"references": refs} if reward.family == "cider" else {"reference": refs[0]}
    if reward.family == "answerability":
        qa = [q for q in getattr(item, "qa", ()) or () if q.get("options") or q.get("choices")]
        if not qa:
            raise DataError(f"data.items[{item.id}].qa", list(getattr(item, "qa", ()) or ()),
                            "reward family 'answerability' needs multiple-choice questions (with options)",
                            "give every item 'qa' records {question, options, answer} (scenes and easy-vqa have them)")
        qs = [to_question(q, f"data.items[{item.id}].qa[{i}]") for i, q in enumerate(qa)]
        # one Arrow type for every row: answers as the option index
        return {"questions": [{"question": q.question, "options": list(q.options), "answer": q.answer} for q in qs]}
    return {}


def build_data(cfg: RubicapConfig, *, allow_models: bool = True) -> RubicapData:
    """Items + rubrics -> TRL rows ``{prompt, image, item_id, rubric}``; no policy involved."""
    from captionrl.domains.captioning import image_caption_messages
    from captionrl.judges.rubric import RubricStore
    from captionrl.train.image_checks import references_of

    loaded = load_items(cfg)
    items = loaded.items
    store_path = ensure_rubrics(cfg, items, allow_models=allow_models)
    skipped: dict[str, list[str]] = {"not in store": [], "rubric unscored": []}
    rows: list[dict[str, Any]] = []
    lazy = all(isinstance(it.image, (str, Path)) for it in items)
    store = RubricStore(store_path) if store_path.is_file() else None
    try:
        for it in items:
            rec = store.record(it.id) if store is not None else None
            if rec is None:
                skipped["not in store"].append(it.id)
                continue
            if rec.get("rubric") is None:
                skipped["rubric unscored"].append(it.id)
                continue
            rubric = store.get(it.id)  # schema-checked
            rows.append({
                "prompt": image_caption_messages(cfg.data.instruction),
                "image": str(it.image) if lazy else it.load(),
                "item_id": str(it.id),
                "rubric": [r.to_dict() for r in rubric or []],
                **family_columns(cfg.reward, it),
            })
    finally:
        if store is not None:
            store.close()
    missing = skipped["not in store"]
    if missing and cfg.rubrics.missing == "error" and (allow_models or cfg.rubrics.source != "build"):
        raise DataError("rubrics.store", str(store_path), f"has no rubric for {len(missing)} of {len(items)} item(s), e.g. {missing[:3]}",
                        "build them (captionrl rubrics build ... --out the store's folder), or set rubrics.missing: skip")
    if not rows and allow_models:
        raise DataError("rubrics.store", str(store_path), "no training item has a rubric",
                        "check that the store's keys are the items' ids, and the writer's errors in the store")
    return RubicapData(rows=rows, lazy_images=lazy, skipped={k: v for k, v in skipped.items() if v}, store=store_path,
                       images=loaded.summary(), references=references_of(items))


def to_dataset(data: RubicapData) -> Any:
    """Rows as a ``datasets.Dataset``; file paths become a lazily decoded RGB ``Image`` column."""
    import datasets

    ds = datasets.Dataset.from_list(data.rows)
    if data.lazy_images:
        ds = ds.cast_column("image", datasets.Image(mode="RGB"))
    return ds


# ---------------------------------------------------------------------- reward
def make_judge(cfg: RubicapConfig, backend: Any) -> Any:
    """The rubric judge of this run (``reward.rubric``): the held-out end-of-run check of every family
    other than ``rubric`` (whose reward judge, built by ``make_reward``, re-checks its own captions)."""
    return cfg.reward.rubric.rubric_judge(backend)


def make_reward(cfg: RubicapConfig, backend: Any, rows: Sequence[Mapping[str, Any]]) -> Reward:
    """The reward ``cfg.reward`` describes (``rewards.reward.build_reward``); CIDEr-D fits its document
    frequencies once, here, on the training references (``reward.cider.references`` when set, else the
    run's training rows), never per batch. The answerability draws are seeded with the run's seed."""
    r = cfg.reward
    own = [list(row["references"]) for row in rows] if r.family == "cider" and not r.cider.references else None
    return build_reward(r, backend, seed=cfg.seed, cider_corpus=own, name=r.family)


class RubricReward(RewardFunction):
    """The RubiCap reward for TRL, for any reward family: the TRL face over the run's reward (``None`` when
    the judge failed: skipped, never 0), plus per-step metrics (``<family>/unscored_frac``,
    ``<family>/caption_chars``; for rubrics ``rubric/criteria_met`` and ``rubric/size``) and one sample record
    per caption (the rubric's per-criterion decisions, or the other judges' own fields under ``judgment``)."""

    def __init__(self, reward: Reward, samples: Any = None) -> None:
        super().__init__(reward, log_fields=(), samples=samples)

    def metrics(self, captions: Sequence[str], columns: Mapping[str, Sequence[Any]],
                judgments: Sequence[Any]) -> dict[str, float]:
        out = super().metrics(captions, columns, judgments)
        out[f"{self.family}/caption_chars"] = float(np.mean([len(c) for c in captions])) if captions else 0.0
        if self.family == "rubric":
            met = [float(np.mean(j.extra["satisfied"])) for j in judgments if j.scored and j.extra.get("satisfied")]
            sizes = [len(r) for r in columns.get("rubric", []) if isinstance(r, list)]
            if met:
                out["rubric/criteria_met"] = float(np.mean(met))
            if sizes:
                out["rubric/size"] = float(np.mean(sizes))
        return out

    def sample_row(self, i: int, caption: str, columns: Mapping[str, Sequence[Any]], j: Any) -> dict[str, Any]:
        ids = columns.get("item_id")
        row = {"item_id": ids[i] if ids else None, "caption": caption, "reward": j.score if j.scored else None,
               "error": j.error, "method": j.method}
        if self.family == "rubric":
            rubrics = columns.get("rubric") or []
            rubric = rubrics[i] if i < len(rubrics) else None
            row.update(satisfied=j.extra.get("satisfied"), values=j.extra.get("values"), weights=j.extra.get("weights"),
                       rubric_size=len(rubric) if isinstance(rubric, list) else None)
        else:
            row.update(family=self.family, raw=j.raw, judgment={k: v for k, v in j.extra.items()
                                                                if k not in ("caption_chars", "ends_with_stop",
                                                                             "numbers", "length_penalty", "base")})
        return row


# ---------------------------------------------------------------------- run
def build_servers(cfg: RubicapConfig) -> list[tuple[BackendConfig, str]]:
    """The servers that building the rubric store talks to: the committee, the writer and the student (none
    unless ``rubrics.source`` is build). ``--build-rubrics`` probes only these: the judge may not be up yet (on
    one node the rubric committee and the judge take the same GPUs, one after the other)."""
    if cfg.rubrics.source != "build":
        return []
    named = [*[(b, f"rubrics.committee[{i}]") for i, b in enumerate(cfg.rubrics.committee)],
             (cfg.rubrics.writer, "rubrics.writer"), *([(cfg.rubrics.student, "rubrics.student")] if cfg.rubrics.student else [])]
    return [(backend_config(b, name), name) for b, name in named]


def servers(cfg: RubicapConfig) -> list[tuple[BackendConfig, str]]:
    """Every server the run talks to: the judge, and the committee, writer and student when building."""
    return [(cfg.judge, "judge"), *build_servers(cfg)]


class RubicapRecipe(Recipe):
    """RubiCap in the shared skeleton: images with rubrics as data, the rubric judge's score as reward."""

    title = "RubiCap"

    def __init__(self, cfg: RubicapConfig, judge_backend: Any = None, callbacks: Sequence[Any] = ()) -> None:
        super().__init__(cfg, callbacks)
        family = cfg.reward.family
        if family != "rubric":
            self.title = f"RubiCap recipe, {family} reward"
        self.curve_keys = tuple(k.replace("rubric/", f"{family}/") for k in CURVE_KEYS)
        self.judge_backend = judge_backend
        self.samples: Any = None
        self.reward: Any = None
        self._references: dict[str, list[str]] | None = None

    def servers(self) -> list[tuple[Any, str]]:
        return list(servers(self.cfg))

    def dataset(self, run: Run) -> RubicapData:
        _ = run.args.device  # sets up accelerate's process state with the run's settings (CPU or GPU, ranks)
        from accelerate import PartialState

        with PartialState().main_process_first():  # one rank writes the rubric store, the others then read it
            data = build_data(self.cfg)
        self._references = data.references
        if data.skipped:
            logger.warning("left out of training: " + "; ".join(f"{len(v)} {k}" for k, v in data.skipped.items()))
        return data

    def load_policy(self, run: Run) -> None:
        super().load_policy(run)  # 'tiny-vlm' resolves in the hf backend
        if not run.is_vlm:
            raise ConfigError("policy.model", self.cfg.policy.model, "is a language-only model: RubiCap's policy must see the image",
                              "use a VLM (its config has a vision_config), e.g. Qwen/Qwen2.5-VL-7B-Instruct or tiny-vlm")

    def train_dataset(self, run: Run) -> Any:
        return to_dataset(run.data)

    def reward_functions(self, run: Run) -> list[Any]:
        from captionrl.backends import make_backend
        from captionrl.train.run.logging import SampleLog

        if self.judge_backend is None:  # every family needs it: the reward's or the end-of-run rubric judge
            self.judge_backend = make_backend(self.cfg.judge)
        family = self.cfg.reward.family
        self.samples = SampleLog(run.out)
        self.reward = RubricReward(make_reward(self.cfg, self.judge_backend, run.data.rows), self.samples)
        logger.info(f"reward family: {family} ({type(self.reward.judge).__name__})")
        return [self.reward]

    def references(self) -> dict[str, list[str]]:
        """Reference captions per item, for the preflight's honest caption and the final CIDEr-D check."""
        from captionrl.train.image_checks import references_of

        if self._references is None:
            self._references = references_of(load_items(self.cfg).items)
        return self._references

    def preflight(self, run: Run) -> None:
        """A reference caption must beat every hacking probe under the trainer's own rubric reward."""
        from captionrl.train.image_checks import rubicap_preflight

        rubicap_preflight(self.cfg, run.data.rows, self.reward.quiet(), run.out, self.references())

    def close(self, run: Run) -> None:
        if self.samples is not None:
            self.samples.close()

    def final_evaluation(self, run: Run) -> dict[str, Any]:
        """Checks the policy was not trained on: CIDEr-D of its greedy captions against the references and,
        for the baseline families, the rubric judge's score (for a CIDEr-D run that is the held-out one)."""
        from captionrl.train.image_checks import image_final_checks

        family = self.cfg.reward.family
        judges = {} if family == "rubric" else {"rubric": make_judge(self.cfg, self.judge_backend)}
        checks = image_final_checks(builder.unwrap_for_inference(run.trainer), run.processing, run.data.rows,
                                    self.references(), run.out / "eval", self.cfg.train.max_completion_length,
                                    seed=self.cfg.seed, judges=judges, reward_family=family)
        return {"final_checks": {"table": str(run.out / "eval" / "final_checks.md"), "rows": checks["rows"]}}

    def summary(self, run: Run) -> dict[str, Any]:
        data = run.data
        return {"reward_family": self.cfg.reward.family, "items": len(data.rows),
                "skipped": {k: len(v) for k, v in data.skipped.items()}, "images": data.images,
                "rubrics": str(data.store), "samples": str(self.samples.path) if self.samples else None}


def run(cfg: RubicapConfig, judge_backend: Any = None, callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    """Train and save; returns what the result file holds (paths and a few figures).

    ``judge_backend`` overrides ``cfg.judge`` with an already-loaded backend (tests share one model);
    ``callbacks`` are extra ``TrainerCallback``s (tests use one to interrupt a run).
    """
    return train(RubicapRecipe(cfg, judge_backend, callbacks)).result


# ---------------------------------------------------------------------- command
CONFIG = RubicapConfig


def run_command(cfg: RubicapConfig) -> int:
    """``captionrl train rubicap``: check, build the rubric store only, or train; print what was written."""
    if cfg.check or cfg.build_rubrics:
        probe_servers(servers(cfg) if cfg.check else build_servers(cfg))
        data = build_data(cfg, allow_models=not cfg.check)
        print(json.dumps({"items": len(data.rows), "store": str(data.store),
                          "skipped": {k: len(v) for k, v in data.skipped.items()}, "images": data.images}))
        if not cfg.check:
            print(f"rubrics:    {data.store}")
        return 0
    result = run(cfg)
    if "curves" in result:
        print(run_summary(result, ["model", "curves", "metrics", "samples", "rubrics"]))
    return 0
