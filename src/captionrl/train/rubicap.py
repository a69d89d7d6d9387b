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

import argparse
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from captionrl.backends import BackendConfig
from captionrl.config import apply_overrides, from_dict, help_field, load_yaml
from captionrl.errors import ConfigError, DataError
from captionrl.judges.prompts import CAPTION_INSTRUCTION
from captionrl.train.common import PolicyConfig, TrainConfig

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
    instruction: str = help_field(CAPTION_INSTRUCTION, "the caption request shown after the image")
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
    caption_max_new_tokens: int = help_field(512, "build: committee and student caption length")
    writer_max_new_tokens: int = help_field(1024, "build: rubric reply length")

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
        if self.max_attempts < 1:
            raise ConfigError("rubrics.max_attempts", self.max_attempts, "must be >= 1", "set rubrics.max_attempts: 3")
        # Validate the backend mappings now (unknown keys, missing URLs), before any model or server is touched.
        for i, b in enumerate(self.committee):
            backend_config(b, f"rubrics.committee[{i}]")
        for name in ("writer", "student"):
            if getattr(self, name) is not None:
                backend_config(getattr(self, name), f"rubrics.{name}")


@dataclass
class RubicapRewardConfig:
    """How the judge decides each criterion (``RubricJudge``); the reward is the satisfied weight fraction."""

    mode: str = help_field("likelihood", "choose (p(yes) of one reply token), generate (JSON decisions; servers, larger judges) or likelihood (PMI of the criterion after the caption; small judges such as SmolLM2)")
    decision: str = help_field("hard", "hard (each criterion 0/1, the paper) or soft (p(yes), or a sigmoid of the likelihood evidence: a denser signal for weak judges)")
    threshold: float | None = help_field(None, "decision threshold (null = the mode's default: choose 0.5, likelihood 1.4 PMI per word, calibrated for SmolLM2)")
    max_new_tokens: int = help_field(512, "generate mode: judge reply length")

    def __post_init__(self) -> None:
        if self.mode not in ("choose", "generate", "likelihood"):
            raise ConfigError("reward.mode", self.mode, "unknown rubric judge mode", "use choose, generate or likelihood")
        if self.decision not in ("hard", "soft"):
            raise ConfigError("reward.decision", self.decision, "unknown decision rule", "use hard or soft")
        if self.mode == "generate" and self.decision == "soft":
            raise ConfigError("reward.decision", self.decision, "generate mode returns binary decisions only",
                              "use reward.decision: hard with reward.mode: generate")


@dataclass
class RubicapConfig:
    """A RubiCap run: fully described by its YAML plus overrides, saved as out_dir/config.yaml."""

    seed: int = help_field(0, "one seed for everything: item sampling, shuffling, sampling of captions")
    policy: PolicyConfig = help_field(None, "the captioner being trained (a VLM; 'tiny-vlm' = the offline test VLM)")  # type: ignore[assignment]
    judge: BackendConfig = help_field(None, "the text-only LLM that decides each rubric criterion")  # type: ignore[assignment]
    data: RubicapDataConfig = help_field(None, "training images")  # type: ignore[assignment]
    rubrics: RubricsConfig = help_field(None, "where rubrics come from")  # type: ignore[assignment]
    reward: RubicapRewardConfig = help_field(None, "rubric judging")  # type: ignore[assignment]
    train: TrainConfig = help_field(None, "TRL trainer settings (algorithm grpo)")  # type: ignore[assignment]

    def __post_init__(self) -> None:
        self.policy = self.policy or PolicyConfig(model=TINY_VLM)
        self.judge = self.judge or BackendConfig()
        self.data = self.data or RubicapDataConfig()
        self.rubrics = self.rubrics or RubricsConfig()
        self.reward = self.reward or RubicapRewardConfig()
        self.train = self.train or TrainConfig(algorithm="grpo", out_dir="runs/rubicap")
        if self.train.seed is None:
            self.train.seed = self.seed
        if self.policy.input not in ("auto", "chart"):
            raise ConfigError("policy.input", self.policy.input, "RubiCap captions images: the policy reads the image",
                              "remove policy.input (auto) and use a VLM policy")
        if self.train.algorithm != "grpo":
            raise ConfigError("train.algorithm", self.train.algorithm, "RubiCap trains with GRPO (the paper's algorithm)",
                              "set train.algorithm: grpo (use 'captionrl train lineup' for RLOO)")

    def store_path(self) -> Path:
        """The rubric store this run reads."""
        if self.rubrics.source == "store":
            return Path(str(self.rubrics.store))
        return Path(self.rubrics.store or Path(self.train.out_dir) / "rubrics") / "rubrics.jsonl"


def backend_config(value: Any, field: str) -> BackendConfig:
    """A ``BackendConfig`` from a mapping, with errors that name the config field."""
    if isinstance(value, BackendConfig):
        return value
    return from_dict(BackendConfig, value or {}, prefix=field + ".")


def load_rubicap_config(path: str | Path | None, overrides: Sequence[str] = ()) -> RubicapConfig:
    """YAML + ``key=value`` overrides -> validated ``RubicapConfig`` (no model is touched).

    A ``train`` section without an ``algorithm`` gets ``grpo`` and without ``out_dir`` gets
    ``runs/rubicap`` (the shared ``TrainConfig`` defaults are LineupRL's).
    """
    data = load_yaml(path) if path else {}
    data = apply_overrides(data, overrides)
    train = data.setdefault("train", {})
    if not isinstance(train, dict):
        raise ConfigError("train", train, "must be a mapping", "write train: {algorithm: grpo, ...}")
    train.setdefault("algorithm", "grpo")
    if train["algorithm"] != "grpo":  # before TrainConfig, whose GRPO-only keys would hide the real cause
        raise ConfigError("train.algorithm", train["algorithm"], "RubiCap trains with GRPO (the paper's algorithm)",
                          "set train.algorithm: grpo (use 'captionrl train lineup' for RLOO)")
    train.setdefault("out_dir", "runs/rubicap")
    return from_dict(RubicapConfig, data)


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
                              max_new_tokens=r.writer_max_new_tokens, seed=cfg.seed, with_image=r.writer_sees_image)
        student = make_backend(backend_config(r.student, "rubrics.student")) if r.student else None
        build_rubrics(items, teachers=teachers, writer=writer, out_dir=store.parent, student=student,
                      instruction=cfg.data.instruction, max_new_tokens=r.caption_max_new_tokens, seed=cfg.seed)
    elif cfg.rubrics.source == "store" and not store.is_file():
        raise ConfigError("rubrics.store", str(store), "file not found",
                          "build it first: captionrl rubrics build --items ITEMS --committee ... --writer ... --out DIR")
    return store


def build_data(cfg: RubicapConfig, *, allow_models: bool = True) -> RubicapData:
    """Items + rubrics -> TRL rows ``{prompt, image, item_id, rubric}``; no policy involved."""
    from captionrl.domains.scenes import caption_prompt
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
                "prompt": caption_prompt(cfg.data.instruction),
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
                       max_new_tokens=r.max_new_tokens, name=f"rubric-{r.mode}")


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
def preflight(cfg: RubicapConfig) -> None:
    """Fail fast, before anything loads, when a configured server does not answer."""
    from captionrl.train.lineup import probe_openai

    probe_openai(cfg.judge, "judge")
    if cfg.rubrics.source == "build":
        for i, b in enumerate(cfg.rubrics.committee):
            probe_openai(backend_config(b, f"rubrics.committee[{i}]"), f"rubrics.committee[{i}]")
        probe_openai(backend_config(cfg.rubrics.writer, "rubrics.writer"), "rubrics.writer")
        if cfg.rubrics.student:
            probe_openai(backend_config(cfg.rubrics.student, "rubrics.student"), "rubrics.student")


def run(cfg: RubicapConfig, judge_backend: Any = None, callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    """Train and save; returns the paths of what was written (and a few figures).

    ``judge_backend`` overrides ``cfg.judge`` with an already-loaded backend (tests share one model);
    ``callbacks`` are extra ``TrainerCallback``s (tests use one to interrupt a run).
    """
    from captionrl.records import write_json
    from captionrl.train import common
    from captionrl.train.logging import MetricsLog, SampleLog, load_metrics, plot_curves

    out = Path(cfg.train.out_dir)
    common.quiet_offline_env(out)
    resume_from = common.prepare_run_dir(cfg, out, cfg.train.resume)  # config diff check, before any load
    preflight(cfg)
    args = common.trainer_args(cfg.train, seed=int(cfg.train.seed or 0))
    _ = args.device  # sets up accelerate's process state with the run's settings (CPU or GPU, ranks)
    from accelerate import PartialState

    with PartialState().main_process_first():  # one rank writes the rubric store, the others then read it
        data = build_data(cfg)
    if data.skipped:
        print("left out of training: " + "; ".join(f"{len(v)} {k}" for k, v in data.skipped.items()))
    common.apply_threads(cfg.train.threads)

    from captionrl.backends import make_backend

    t0 = time.perf_counter()
    backend = judge_backend if judge_backend is not None else make_backend(cfg.judge)
    model, processing, is_vlm = common.load_policy(cfg.policy)  # 'tiny-vlm' resolves in the hf backend
    if not is_vlm:
        raise ConfigError("policy.model", cfg.policy.model, "is a language-only model: RubiCap's policy must see the image",
                          "use a VLM (its config has a vision_config), e.g. Qwen/Qwen2.5-VL-7B-Instruct or tiny-vlm")
    samples = SampleLog(out)
    reward = RubricReward(make_judge(cfg, backend), samples)
    from captionrl.train.image_checks import image_final_checks, references_of, rubicap_preflight

    references = references_of(load_items(cfg))
    rubicap_preflight(cfg, data.rows, reward, out, references)
    trainer = common.build_trainer(
        cfg.train, args, model, processing, [reward], to_dataset(data),
        callbacks=[MetricsLog(out / "metrics.jsonl"), *callbacks], peft_config=common.lora_config(cfg.policy),
    )
    if resume_from is not None:
        print(f"resuming from {resume_from}")
    try:
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    finally:
        samples.close()
    train_s = time.perf_counter() - t0
    result: dict[str, Any] = {"out_dir": str(out), "train_seconds": round(train_s, 1),
                              "items": len(data.rows), "skipped": {k: len(v) for k, v in data.skipped.items()},
                              "rubrics": str(data.store)}
    model_dir = common.save_final_model(trainer, out / "model")  # every rank: ZeRO-3 gathers the weights
    if not trainer.accelerator.is_main_process:
        return result
    result["model"] = str(model_dir)
    checks = image_final_checks(common.unwrap_for_inference(trainer), processing, data.rows, references,
                                out / "eval", cfg.train.max_completion_length, seed=cfg.seed)
    result["final_checks"] = {"table": str(out / "eval" / "final_checks.md"), "rows": checks["rows"]}
    metrics = load_metrics(out / "metrics.jsonl")
    present = {k for m in metrics for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    keys = [k for k in CURVE_KEYS if k in present]
    curves = plot_curves(out / "metrics.jsonl", out / "curves.png", keys=keys) if keys else None
    result["curves"] = str(curves) if curves else None
    result["metrics"] = str(out / "metrics.jsonl")
    result["samples"] = str(samples.path)
    result["tensorboard"] = str(out / "tensorboard") if cfg.train.report_to else None
    rewards = [m["reward"] for m in metrics if isinstance(m.get("reward"), (int, float)) and not math.isnan(m["reward"])]
    if rewards:
        result["reward_first"], result["reward_last"] = round(rewards[0], 4), round(rewards[-1], 4)
    times = [m["step_time"] for m in metrics if isinstance(m.get("step_time"), (int, float))]
    if times:
        result["step_seconds"] = round(float(np.mean(times)), 2)
    write_json(out / "result.json", result)
    return result


# ---------------------------------------------------------------------- CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="YAML run config, e.g. configs/rubicap-cpu.yaml")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.max_steps=10 train.out_dir=runs/x")
    p.add_argument("--check", action="store_true",
                   help="validate the config, the images and the rubric store, then stop (loads no model)")
    p.add_argument("--build-rubrics", action="store_true",
                   help="only write the rubric store (rubrics.source facts/build; resumable), then stop: run it once, "
                        "in one process, before a multi-GPU launch")


def main(args: argparse.Namespace) -> int:
    cfg = load_rubicap_config(args.config, args.overrides)
    if args.check:
        preflight(cfg)
        data = build_data(cfg, allow_models=False)
        print(json.dumps({"items": len(data.rows), "store": str(data.store),
                          "skipped": {k: len(v) for k, v in data.skipped.items()}}))
        return 0
    if getattr(args, "build_rubrics", False):
        preflight(cfg)
        data = build_data(cfg)
        print(json.dumps({"items": len(data.rows), "skipped": {k: len(v) for k, v in data.skipped.items()}}))
        print(f"rubrics:    {data.store}")
        return 0
    result = run(cfg)
    if "model" in result:
        print(f"model:      {result['model']}")
        print(f"curves:     {result.get('curves')}")
        print(f"metrics:    {result.get('metrics')}")
        print(f"records:    {result.get('samples')}")
        print(f"rubrics:    {result.get('rubrics')}")
        if result.get("tensorboard"):
            print(f"tensorboard: tensorboard --logdir {result['tensorboard']}")
        if "reward_first" in result:
            print(f"reward:     {result['reward_first']} (first step) -> {result['reward_last']} (last step); "
                  f"{result.get('step_seconds')} s/step")
    return 0

