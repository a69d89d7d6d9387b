"""``captionrl train rubicap``: RubiCap, GRPO of an image captioner with rubric rewards.

The paper's loop: every training image has an offline, image-specific rubric (weighted binary criteria
written from a teacher committee's consensus, or, for synthetic scenes, from their known facts); the
policy samples a group of G captions per image; a text-only LLM judge decides each criterion for each
caption; the reward is ``sum(w * satisfied) / sum(w)`` (``captionrl.judges.rubric.RubricJudge``); GRPO
turns the group's rewards into advantages. Everything trainer-side is TRL through ``train.common``; this
module builds the items, the rubric store and the reward, and reports what was written.

Images reach the policy as TRL 1.16 expects for VLMs: an ``image`` column plus chat prompts whose user
turn holds an ``{"type": "image"}`` placeholder, and a ``ProcessorMixin`` processing class (loaded by
``common.load_policy`` for any model whose config has a ``vision_config``).

Rubrics (``rubrics.source``): ``facts`` builds them from the items' known facts (synthetic scenes,
easy-vqa); ``store`` reads a JSONL store written by ``captionrl rubrics build``; ``build`` runs that
pipeline first (committee captions -> writer -> store; resumable). In every case the rubrics that ran are
kept in ``out_dir/rubrics/rubrics.jsonl``-style stores and copied into the dataset's ``rubric`` column, so
each per-caption sample record carries the rubric it was judged against. An item whose rubric the writer
could not produce is left out of training and counted (a rubric-less item has no reward to learn from).

Run folder (``train.out_dir``): ``config.yaml``, ``rubrics/`` (store and build records), ``checkpoints/``,
``metrics.jsonl``, ``samples.rank*.jsonl`` (step, item, caption, reward, per-criterion decisions),
``tensorboard/``, ``curves.png``, ``model/`` and ``result.json``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from captionrl.backends import BackendConfig
from captionrl.config import help_field
from captionrl.domains.captioning import IMAGE_CAPTION_INSTRUCTION
from captionrl.errors import ConfigError, DataError
from captionrl.judges.rubric import RubricJudgeSettings
from captionrl.train import common
from captionrl.train.common import (
    GRPOTrainConfig,
    PolicyConfig,
    backend_config,
    print_result,
    probe_servers,
)
from captionrl.train.skeleton import Recipe, Run, train

TINY_VLM = "tiny-vlm"
"""Policy name resolved to ``captionrl.testing.tiny_vlm.tiny_vlm_dir()`` (the offline test VLM)."""

CURVE_KEYS = ("reward", "frac_reward_zero_std", "rubric/unscored_frac", "completions/mean_length",
              "rubric/caption_chars", "rubric/criteria_met", "loss", "kl")
"""Panels of ``curves.png``: mean reward, zero-std group fraction, unscored fraction, caption length."""


# ---------------------------------------------------------------------- config
@dataclass
class RubicapDataConfig:
    """The training images and the instruction the policy captions them with."""

    items: str = help_field("scenes:64:0", "images: scenes:N[:SEED] (synthetic, known facts), easy-vqa[:SPLIT[:LIMIT]], a folder, a JSONL manifest ({id, image, ...}) or a datasets.save_to_disk folder")
    n_train: int | None = help_field(None, "training items (null = all; a seeded sample of the items otherwise)")
    instruction: str = help_field(IMAGE_CAPTION_INSTRUCTION, "the caption request shown after the image")
    on_error: str = help_field("raise", "unreadable images: raise (stop and name the item) or skip (leave out and count)")

    def __post_init__(self) -> None:
        if self.n_train is not None and self.n_train < 1:
            raise ConfigError("data.n_train", self.n_train, "must be >= 1 (or null for all)", "set data.n_train: 64")
        if self.on_error not in ("raise", "skip"):
            raise ConfigError("data.on_error", self.on_error, "unknown policy", "use raise or skip")
        if not self.instruction.strip():
            raise ConfigError("data.instruction", self.instruction, "is empty", "ask for a caption, e.g. 'Describe this image in detail.'")


@dataclass
class RubricsConfig:
    """Where each image's rubric comes from (offline, before training)."""

    source: str = help_field("facts", "facts (from the items' known facts: synthetic scenes, easy-vqa), store (a JSONL rubric store from 'captionrl rubrics build') or build (run the committee + writer pipeline first; resumable)")
    store: str | None = help_field(None, "store: path of rubrics.jsonl; facts/build: folder of the store (null = out_dir/rubrics)")
    missing: str = help_field("error", "items absent from the store: error (stop, name them) or skip (train on the items that have rubrics)")
    committee: list[dict[str, Any]] = help_field([], "build: teacher backends (BackendConfig mappings, e.g. {kind: openai, model: ..., base_url: ...})")
    writer: dict[str, Any] | None = help_field(None, "build: the rubric writer backend (BackendConfig mapping)")
    student: dict[str, Any] | None = help_field(None, "build: optional student backend whose captions the writer diagnoses (null = none)")
    writer_sees_image: bool = help_field(False, "build: show the image to a VLM writer too")
    max_attempts: int = help_field(3, "build: writer attempts per item before it is recorded unscored")
    min_items: int = help_field(3, "build: fewest items a valid rubric has")
    max_items: int = help_field(10, "build: most items a valid rubric has")
    caption_max_new_tokens: int = help_field(512, "build: committee and student caption length")
    writer_max_new_tokens: int = help_field(1024, "build: rubric reply length")
    image_text: str = help_field("none", "build: none (teachers see the image) or references (language-only teachers read the items' reference captions instead)")
    structured_output: str = help_field("none", "build: constrain the writer's reply to the rubric JSON schema: none, json_schema (OpenAI/vLLM) or json_object (llama.cpp)")

    def __post_init__(self) -> None:
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
        if not 1 <= self.min_items <= self.max_items:
            raise ConfigError("rubrics.min_items", self.min_items, f"must be 1..rubrics.max_items ({self.max_items})",
                              "set rubrics.min_items <= rubrics.max_items")
        if self.max_attempts < 1:
            raise ConfigError("rubrics.max_attempts", self.max_attempts, "must be >= 1", "set rubrics.max_attempts: 3")
        # Validate the backend mappings now (unknown keys, missing URLs), before any model or server is touched.
        for i, b in enumerate(self.committee):
            backend_config(b, f"rubrics.committee[{i}]")
        for name in ("writer", "student"):
            if getattr(self, name) is not None:
                backend_config(getattr(self, name), f"rubrics.{name}")


@dataclass
class RubicapRewardConfig(RubricJudgeSettings):
    """How the judge decides each criterion (``RubricJudge``); the reward is the satisfied weight fraction."""

    FIELD_PREFIX: ClassVar[str] = "reward"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode == "generate" and self.decision == "soft":
            raise ConfigError("reward.decision", self.decision, "generate mode returns binary decisions only",
                              "use reward.decision: hard with reward.mode: generate")

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
    reward: RubicapRewardConfig = field(default_factory=RubicapRewardConfig, metadata={"help": "rubric judging"})
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


def load_items(cfg: RubicapConfig) -> list[Any]:
    """The configured images (validated: each opens and decodes), seeded sample of ``n_train``."""
    from captionrl.domains.images import load_images

    items = list(load_images(cfg.data.items, on_error=cfg.data.on_error))  # type: ignore[arg-type]
    if not items:
        raise DataError("data.items", cfg.data.items, "holds no readable image", "check the path or the spec")
    n = cfg.data.n_train
    if n is not None and n < len(items):
        rng = np.random.default_rng([cfg.seed, 6])  # recorded: the config holds the seed
        keep = sorted(rng.choice(len(items), size=n, replace=False).tolist())
        items = [items[i] for i in keep]
    return items


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
            raise DataError("data.items", f"{len(no_facts)} item(s), e.g. {no_facts[:3]}", "have no known facts to build rubrics from",
                            "use scenes:N or easy-vqa items, or set rubrics.source: store / build")
        build_rubrics(items, teachers=[], writer=None, out_dir=store.parent, seed=cfg.seed, progress=False)
    elif cfg.rubrics.source == "build" and allow_models:
        from captionrl.backends import make_backend
        from captionrl.judges.rubric_build import RubricWriter

        r = cfg.rubrics
        teachers = [make_backend(backend_config(b, f"rubrics.committee[{i}]")) for i, b in enumerate(r.committee)]
        writer = RubricWriter(make_backend(backend_config(r.writer, "rubrics.writer")), max_attempts=r.max_attempts,
                              max_new_tokens=r.writer_max_new_tokens, seed=cfg.seed, with_image=r.writer_sees_image,
                              structured_output=r.structured_output, min_items=r.min_items, max_items=r.max_items)
        student = make_backend(backend_config(r.student, "rubrics.student")) if r.student else None
        build_rubrics(items, teachers=teachers, writer=writer, out_dir=store.parent, student=student,
                      instruction=cfg.data.instruction, max_new_tokens=r.caption_max_new_tokens, seed=cfg.seed,
                      image_text=r.image_text)
    elif cfg.rubrics.source == "store" and not store.is_file():
        raise ConfigError("rubrics.store", str(store), "file not found",
                          "build it first: captionrl rubrics build --items ITEMS --committee ... --writer ... --out DIR")
    return store


def build_data(cfg: RubicapConfig, *, allow_models: bool = True) -> RubicapData:
    """Items + rubrics -> TRL rows ``{prompt, image, item_id, rubric}``; no policy involved."""
    from captionrl.domains.captioning import image_caption_messages
    from captionrl.judges.rubric import RubricStore

    items = load_items(cfg)
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
    return RubicapData(rows=rows, lazy_images=lazy, skipped={k: v for k, v in skipped.items() if v}, store=store_path)


def to_dataset(data: RubicapData) -> Any:
    """Rows as a ``datasets.Dataset``; file paths become a lazily decoded RGB ``Image`` column."""
    import datasets

    ds = datasets.Dataset.from_list(data.rows)
    if data.lazy_images:
        ds = ds.cast_column("image", datasets.Image(mode="RGB"))
    return ds


# ---------------------------------------------------------------------- reward
def make_judge(cfg: RubicapConfig, backend: Any) -> Any:
    """The rubric judge of this run (the same object scores training captions and re-checks them)."""
    from captionrl.judges.rubric import RubricJudge

    r = cfg.reward
    return RubricJudge(backend, mode=r.mode, decision=r.decision, threshold=r.threshold,  # type: ignore[arg-type]
                       max_new_tokens=r.max_new_tokens, name=f"rubric-{r.mode}", structured_output=r.structured_output)


def _reward_base() -> type:
    from captionrl.rewards import JudgeReward

    return JudgeReward


class RubricReward(_reward_base()):  # type: ignore[misc]
    """The RubiCap reward for TRL: ``RubricJudge`` scores (``None`` when the judge failed: skipped, never 0),
    plus per-step metrics (``rubric/unscored_frac``, ``rubric/caption_chars``, ``rubric/criteria_met``,
    ``rubric/size``) and one sample record per caption with its per-criterion decisions."""

    def __init__(self, judge: Any, samples: Any = None) -> None:
        super().__init__(judge, name="rubric", log_fields=(), on_judgments=self._keep)
        self.samples = samples
        self._last: tuple[list[str], dict[str, list[Any]], list[Any]] = ([], {}, [])

    def _keep(self, captions: list[str], columns: dict[str, list[Any]], judgments: list[Any]) -> None:
        self._last = (captions, columns, judgments)

    def __call__(self, prompts: Any = None, completions: Sequence[Any] = (), completion_ids: Any = None,
                 **kwargs: Any) -> list[float | None]:
        self._last = ([], {}, [])
        scores = super().__call__(prompts, completions, completion_ids, **kwargs)
        captions, columns, judgments = self._last
        met = [float(np.mean(j.extra["satisfied"])) for j in judgments if j.scored and j.extra.get("satisfied")]
        sizes = [len(r) for r in columns.get("rubric", []) if isinstance(r, list)]
        log_metric = kwargs.get("log_metric")
        if callable(log_metric):
            log_metric("rubric/caption_chars", float(np.mean([len(c) for c in captions])) if captions else 0.0)
            if met:
                log_metric("rubric/criteria_met", float(np.mean(met)))
            if sizes:
                log_metric("rubric/size", float(np.mean(sizes)))
        if self.samples is not None:
            state = kwargs.get("trainer_state")
            ids = columns.get("item_id") or [None] * len(captions)
            rows = []
            for i, (cap, j) in enumerate(zip(captions, judgments, strict=True)):
                rows.append({
                    "item_id": ids[i], "caption": cap, "reward": scores[i], "error": j.error, "method": j.method,
                    "satisfied": j.extra.get("satisfied"), "values": j.extra.get("values"),
                    "weights": j.extra.get("weights"), "rubric_size": sizes[i] if i < len(sizes) else None,
                })
            self.samples.write(int(getattr(state, "global_step", -1)) if state is not None else -1, rows)
        return scores


# ---------------------------------------------------------------------- run
def servers(cfg: RubicapConfig) -> list[tuple[BackendConfig, str]]:
    """Every server the run talks to: the judge, and the committee, writer and student when building."""
    out = [(cfg.judge, "judge")]
    if cfg.rubrics.source == "build":
        named = [*[(b, f"rubrics.committee[{i}]") for i, b in enumerate(cfg.rubrics.committee)],
                 (cfg.rubrics.writer, "rubrics.writer"), *([(cfg.rubrics.student, "rubrics.student")] if cfg.rubrics.student else [])]
        out += [(backend_config(b, name), name) for b, name in named]
    return out


class RubicapRecipe(Recipe):
    """RubiCap in the shared skeleton: images with rubrics as data, the rubric judge's score as reward."""

    title = "RubiCap"
    curve_keys = CURVE_KEYS

    def __init__(self, cfg: RubicapConfig, judge_backend: Any = None, callbacks: Sequence[Any] = ()) -> None:
        super().__init__(cfg, callbacks)
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
        if data.skipped:
            print("left out of training: " + "; ".join(f"{len(v)} {k}" for k, v in data.skipped.items()))
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
        from captionrl.train.logging import SampleLog

        backend = self.judge_backend if self.judge_backend is not None else make_backend(self.cfg.judge)
        self.samples = SampleLog(run.out)
        self.reward = RubricReward(make_judge(self.cfg, backend), self.samples)
        return [self.reward]

    def references(self) -> dict[str, list[str]]:
        """Reference captions per item, for the preflight's honest caption and the final CIDEr-D check."""
        from captionrl.train.image_checks import references_of

        if self._references is None:
            self._references = references_of(load_items(self.cfg))
        return self._references

    def preflight(self, run: Run) -> None:
        """A reference caption must beat every hacking probe under the trainer's own rubric reward."""
        from captionrl.train.image_checks import rubicap_preflight

        rubicap_preflight(self.cfg, run.data.rows, self.reward, run.out, self.references())

    def close(self, run: Run) -> None:
        if self.samples is not None:
            self.samples.close()

    def final_evaluation(self, run: Run) -> dict[str, Any]:
        """A check the policy was not trained on: CIDEr-D of its greedy captions against the references."""
        from captionrl.train.image_checks import image_final_checks

        checks = image_final_checks(common.unwrap_for_inference(run.trainer), run.processing, run.data.rows,
                                    self.references(), run.out / "eval", self.cfg.train.max_completion_length,
                                    seed=self.cfg.seed)
        return {"final_checks": {"table": str(run.out / "eval" / "final_checks.md"), "rows": checks["rows"]}}

    def summary(self, run: Run) -> dict[str, Any]:
        data = run.data
        return {"items": len(data.rows), "skipped": {k: len(v) for k, v in data.skipped.items()},
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
        probe_servers(servers(cfg))
        data = build_data(cfg, allow_models=not cfg.check)
        print(json.dumps({"items": len(data.rows), "store": str(data.store),
                          "skipped": {k: len(v) for k, v in data.skipped.items()}}))
        if not cfg.check:
            print(f"rubrics:    {data.store}")
        return 0
    result = run(cfg)
    if "curves" in result:
        print_result(result, ["model", "curves", "metrics", "samples", "rubrics"])
    return 0
