"""The one training skeleton every recipe runs through, top to bottom:

    prepare the run folder -> checks (GPU settings, frozen bottom, memory plan, servers) -> build the dataset
    -> load the policy -> build the trainer -> preflight -> train -> save -> final evaluation -> curves
    -> result file

Each step is handed the config once and goes down into the module that does it (``run_folder``, ``checks``,
``loading``, ``builder``, ``sharding``, ``curves``); none calls back into a recipe except through ``Recipe``.

A recipe (LineupRL, RubiCap, MoCo Rubric, SFT) is its config, its dataset and its reward functions: it
subclasses ``Recipe`` and fills in ``dataset`` and ``reward_functions`` (and, where it differs, the
step it changes). A recipe that trains in phases rather than with one trainer (EvoLM: alternating Policy
and Generator trainers on one model) replaces the training step itself (``fit``) and what it saves
(``save_model``); the run folder, the config check, the servers, the data, the policy, the curves and the
result file stay the skeleton's. Two hooks are named for what they are for:

- ``preflight(run)``: runs before step 1, at the trainer's ``on_train_begin`` (the model is on its
  accelerator by then, on every rank), e.g. checking that the reward scores the policy's captions at
  all. Default: nothing.
- ``final_evaluation(run) -> dict``: runs on the main process after the model is saved; what it returns
  joins the result file. Default: nothing.

Every step that can fail on bad input (config differences with a saved run, an unreachable server, bad
data) comes before the policy loads, so a mistake costs seconds, not a model load.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from captionrl.train.run import builder, checks, loading, run_folder
from captionrl.train.run.sharding import full_weights, no_zero3_init

logger = logging.getLogger(__name__)


@dataclass
class Run:
    """What the skeleton has built so far; a recipe's steps and hooks read and fill it."""

    cfg: Any
    out: Path
    resume_from: Path | None = None
    args: Any = None  # the trainer's arguments (RLOOConfig, GRPOConfig, SFTConfig)
    data: Any = None  # whatever the recipe's ``dataset`` returned
    model: Any = None
    processing: Any = None
    is_vlm: bool = False
    trainer: Any = None
    train_output: Any = None  # what ``trainer.train()`` returned
    train_seconds: float = 0.0
    steps: int = 0  # optimizer steps the run has taken (the result file's ``steps``)
    result: dict[str, Any] = field(default_factory=dict)


class Recipe:
    """A training recipe: config, dataset, reward functions, and the two hooks. Subclasses fill in
    ``dataset`` and ``reward_functions``; every other method has the behaviour all RL recipes share."""

    title = "training"
    result_file = "result.json"
    curve_keys: Sequence[str] | None = None  # None: the watched metrics present in the log
    curve_smooth: int | None = None  # moving-average window of curves.png (None: plot_curves' default)
    checkpoint_files: Sequence[str] = ()  # files a complete checkpoint holds besides the Trainer's own

    def __init__(self, cfg: Any, callbacks: Sequence[Any] = ()) -> None:
        self.cfg = cfg
        self.extra_callbacks = list(callbacks)

    # ------------------------------------------------------------------ steps a recipe supplies
    def servers(self) -> list[tuple[Any, str]]:
        """(BackendConfig, config field) of every server the run needs, probed before anything loads."""
        return []

    def trainer_args(self, run: Run) -> Any:
        return builder.trainer_args(self.cfg.train, seed=int(self.cfg.train.seed or 0))

    def dataset(self, run: Run) -> Any:
        """The recipe's data, validated; runs before the policy loads."""
        raise NotImplementedError

    def load_policy(self, run: Run) -> None:
        run.model, run.processing, run.is_vlm = loading.load_policy(self.cfg.policy)

    def train_dataset(self, run: Run) -> Any:
        """The ``datasets.Dataset`` the trainer iterates (default: ``run.data`` as a list of rows)."""
        from datasets import Dataset

        return Dataset.from_list(list(run.data))

    def reward_functions(self, run: Run) -> list[Callable[..., Any]]:
        raise NotImplementedError

    def callbacks(self, run: Run) -> list[Any]:
        from captionrl.train.run.logging import MetricsLog

        return [MetricsLog(run.out / "metrics.jsonl"), *self.extra_callbacks]

    def reward_bound(self) -> Any:
        """The lost-reward bound (``rewards.bound.RewardBound``) of the run: the ``reward`` section of every RL
        recipe's config carries it; ``None`` (no bound) for recipes without rewards."""
        from captionrl.rewards.bound import RewardBound

        bound = getattr(self.cfg, "reward", None)
        return bound if isinstance(bound, RewardBound) else None

    def build_trainer(self, run: Run) -> Any:
        rewards, data, callbacks = self.reward_functions(run), self.train_dataset(run), self.callbacks(run)
        return builder.build_trainer(self.cfg.train, run.args, run.model, run.processing, rewards, data,
                                     callbacks=callbacks, peft_config=loading.lora_config(self.cfg.policy),
                                     bound=self.reward_bound())

    def fit(self, run: Run) -> None:
        """The training step: build the trainer, run the preflight hook before step 1, train (resuming from
        ``run.resume_from``); fills ``run.trainer``, ``run.train_output``, ``run.train_seconds`` (preflight
        excluded) and ``run.steps``."""
        from captionrl.train.run.callbacks import PreflightCallback, StopAtMaxSteps, TrainingAlreadyDone
        from captionrl.train.run.compact_head import compact_on_cpu
        from captionrl.train.run.freezing import frozen_bottom

        n_frozen = getattr(self.cfg.train, "freeze_layers", 0)
        # the optimizer is built inside trainer.train(): it must see the frozen weights' requires_grad
        with frozen_bottom(run.model, n_frozen, field="train.freeze_layers") as trainable:
            if n_frozen:
                logger.info(f"RL trains {trainable:,} parameters: the embeddings and the bottom {n_frozen} blocks are frozen")
            run.trainer = self.build_trainer(run)
            preflight = PreflightCallback(lambda: self.preflight(run))  # once the model is on the accelerator, every rank
            run.trainer.add_callback(preflight)
            run.trainer.add_callback(StopAtMaxSteps())
            if run.resume_from is not None:
                logger.info(f"resuming from {run.resume_from}")
            t0 = time.perf_counter()
            with compact_on_cpu():  # TRL's fused head: only the labelled positions on CPU too (train.run.compact_head)
                try:
                    run.train_output = run.trainer.train(
                        resume_from_checkpoint=str(run.resume_from) if run.resume_from else None)
                except TrainingAlreadyDone:
                    run.train_output = finished_output(run.trainer.state)
                    logger.info(f"{run.resume_from} is the last step ({run.trainer.state.max_steps}): nothing left to train")
            run.train_seconds = time.perf_counter() - t0 - preflight.seconds
        run.steps = int(run.trainer.state.global_step)

    def save_model(self, run: Run) -> Path:
        """Save the trained policy as ``out/model``, on every rank (ZeRO-3 gathers); returns the folder."""
        return builder.save_final_model(run.trainer, run.out / "model")

    def is_main_process(self, run: Run) -> bool:
        """Whether this process evaluates and writes the result file."""
        return bool(run.trainer.accelerator.is_main_process)

    def final_weights(self, run: Run) -> Any:
        """A context in which the trained weights are whole on this rank (ZeRO-3: gathered once on every rank,
        so rank 0 can evaluate them alone; a forward over partitioned weights on one rank would hang)."""
        import contextlib

        stack = contextlib.ExitStack()
        stack.enter_context(full_weights(run.trainer))
        stack.enter_context(no_zero3_init())
        return stack

    def metrics(self, run: Run) -> list[dict[str, Any]]:
        """The logged steps ``curves.png`` and the result file's reward and step-time figures read
        (default: ``out/metrics.jsonl``, one entry per step)."""
        from captionrl.train.run.curves import load_metrics

        path = run.out / "metrics.jsonl"
        return load_metrics(path) if path.is_file() else []

    # ------------------------------------------------------------------ hooks
    def preflight(self, run: Run) -> None:
        """Hook: runs once the trainer exists, before step 1. Default: nothing."""

    def final_evaluation(self, run: Run) -> dict[str, Any]:
        """Hook: runs on the main process after the model is saved; returns fields for the result file."""
        return {}

    # ------------------------------------------------------------------ reporting
    def close(self, run: Run) -> None:
        """Called when training ends, normally or not (sample logs flush here)."""

    def summary(self, run: Run) -> dict[str, Any]:
        """Recipe-specific fields of the result file."""
        return {}


def prepare(recipe: Recipe) -> Run:
    """The first half, shared by every recipe (EvoLM too): run folder, checks, data, policy."""
    cfg = recipe.cfg
    run = Run(cfg=cfg, out=Path(cfg.train.out_dir))
    run_folder.quiet_offline_env(run.out)
    run.resume_from = run_folder.prepare_run_dir(cfg, run.out, cfg.train.resume,  # config diff check, before any load
                                                 recipe.checkpoint_files)
    run.args = recipe.trainer_args(run)
    checks.check_run(cfg, run.args, recipe.servers())  # GPU settings, frozen bottom, memory plan, servers: before any load
    run.data = recipe.dataset(run)
    loading.apply_threads(cfg.train.threads)
    recipe.load_policy(run)
    return run


def train(recipe: Recipe) -> Run:
    """Run ``recipe`` through every step; returns the ``Run`` (its ``result`` is what the result file holds)."""
    run = prepare(recipe)
    try:
        recipe.fit(run)
    finally:
        recipe.close(run)
    run.result.update(out_dir=str(run.out), train_seconds=round(run.train_seconds, 1), steps=run.steps)
    run.result["model"] = str(recipe.save_model(run))  # every rank: ZeRO-3 gathers
    summary = recipe.summary(run)  # every rank: under ZeRO-3 the momentum's distances gather parameters
    # ZeRO-3: every rank gathers the trained weights once, then rank 0 evaluates them locally (and loads
    # checkpoints as plain models); a forward over partitioned weights on one rank alone would hang.
    with recipe.final_weights(run):
        if not recipe.is_main_process(run):
            return run
        run.result.update(recipe.final_evaluation(run))
    run.result.update(curves(recipe, run))
    timing = run.out / "timing.json"  # written by train.run.timing's StepTimer: parts of a step and the dtypes chosen
    if timing.is_file():
        import json

        run.result["timing"] = json.loads(timing.read_text())
    run.result.update(summary)
    from captionrl.records import write_json

    write_json(run.out / recipe.result_file, run.result)
    return run


def finished_output(state: Any) -> Any:
    """``trainer.train()``'s result for a run resumed at ``max_steps``: its step, and the mean of the losses its
    checkpoint logged as the training loss."""
    from transformers.trainer_utils import TrainOutput

    losses = [float(h["loss"]) for h in state.log_history if "loss" in h]
    return TrainOutput(state.global_step, sum(losses) / len(losses) if losses else float("nan"), {})


def curves(recipe: Recipe, run: Run) -> dict[str, Any]:
    """``curves.png`` from the recipe's logged steps (none when nothing was logged), first/last reward, step time."""
    from captionrl.train.run.curves import run_curves

    records = recipe.metrics(run)
    return run_curves(records, run.out, keys=recipe.curve_keys, smooth=recipe.curve_smooth, title=recipe.title,
                      tensorboard="tensorboard" in (run.args.report_to or []))


def run_summary(result: Mapping[str, Any], keys: Sequence[str]) -> str:
    """The console summary of a finished run, for its command to print: where each named output went, and
    how to open TensorBoard."""
    lines = [f"{key + ':':<11} {result[key]}" for key in keys if result.get(key) is not None]
    if result.get("tensorboard"):
        lines.append(f"tensorboard: tensorboard --logdir {result['tensorboard']}")
    if "reward_first" in result:
        lines.append(f"reward:     {result['reward_first']} (first step) -> {result['reward_last']} (last step); "
                     f"{result.get('step_seconds')} s/step")
    return "\n".join(lines)
