"""The trainer callback of the momentum model (MoCo Rubric).

``MomentumCallback`` plugs :mod:`captionrl.momentum` into any ``transformers``/TRL trainer without
subclassing it: ``on_step_end`` runs after the optimizer step (TRL passes the unwrapped model), applies the
EMA at synchronisation boundaries, and the distance ``||theta - phi|| / ||theta||`` joins the trainer's
logs. The momentum parameters travel with each checkpoint (``momentum.pt``) so that a resumed run keeps
its lagged Generator-Judge instead of silently restarting it from the Policy.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from captionrl.errors import ConfigError, RewardLostError
from captionrl.momentum import Momentum
from captionrl.records import RecordWriter
from captionrl.rewards.bound import LossTracker, RewardBound, RewardHealth, health_of, lost_message

MOMENTUM_STATE = "momentum.pt"
MOMENTUM_LOG = "momentum.jsonl"


class MomentumCallback(TrainerCallback):
    """Apply the momentum EMA every ``H`` optimizer steps and log its diagnostics.

    Build the momentum on ``trainer.model`` *after* the trainer exists (TRL wraps the model with PEFT
    when given a ``peft_config``), then attach it with :meth:`attach` rather than ``callbacks=[...]``:
    it then runs before the reporting callbacks (TensorBoard, ...), so they see ``momentum/distance`` in
    the same log line. Training a different module than the momentum tracks is refused at train begin.
    """

    def __init__(self, momentum: Momentum, resume_dir: str | Path | None = None) -> None:
        self.momentum = momentum
        self.resume_dir = Path(resume_dir) if resume_dir else None
        self._writer: RecordWriter | None = None

    def attach(self, trainer: Any) -> MomentumCallback:
        trainer.callback_handler.callbacks.insert(0, self)
        return self

    # -- training events
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model = kwargs.get("model")
        if model is not None and model is not self.momentum.policy_module:
            raise ConfigError(
                "momentum", type(self.momentum.policy_module).__name__,
                f"tracks a different module than the trainer trains ({type(model).__name__}), so the "
                "momentum would never follow the Policy",
                "build the momentum from trainer.model after creating the trainer, then attach the callback",
            )
        if state.global_step > 0:
            self._restore(args, state.global_step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.momentum.maybe_update(state.global_step)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if logs is None or "train_runtime" in logs:
            return
        diag = {k: round(v, 6) for k, v in self.momentum.diagnostics().items()}
        logs.update(diag)
        # Trainer.log appends a copy of ``logs`` to the history before calling us: update that copy too.
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(diag)
        if state.is_world_process_zero:
            if self._writer is None:
                self._writer = RecordWriter(Path(args.output_dir) / MOMENTUM_LOG)
            self._writer.write({"key": str(state.global_step), "step": state.global_step, **diag})

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        blob = self.momentum.state_dict()  # every rank takes part in gathering sharded parameters
        if state.is_world_process_zero:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            folder.mkdir(parents=True, exist_ok=True)
            # written aside, then renamed: a kill mid-write leaves no torn momentum.pt to resume from
            tmp = folder / (MOMENTUM_STATE + ".tmp")
            torch.save(blob, tmp)
            os.replace(tmp, folder / MOMENTUM_STATE)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _restore(self, args: Any, step: int) -> None:
        roots = [r for r in (self.resume_dir, Path(args.output_dir) / f"checkpoint-{step}") if r is not None]
        for root in roots:
            path = root / MOMENTUM_STATE if root.is_dir() else root
            if path.is_file():
                self.momentum.load_state_dict(torch.load(path, map_location="cpu", weights_only=False))
                return
        raise ConfigError(
            "resume_from_checkpoint", [str(r) for r in roots],
            f"resumes at step {step} but no {MOMENTUM_STATE} was found, so the momentum model would restart "
            "from the current Policy",
            f"resume from a checkpoint written with MomentumCallback, or pass resume_dir=<checkpoint folder with {MOMENTUM_STATE}>",
        )


class RewardBoundCallback(TrainerCallback):
    """Stop a run whose reward is gone: after ``unscored_patience`` optimizer steps in a row with more than
    ``max_unscored_frac`` of a reward's captions unscored (or ``max_fallback_frac`` of its rubric groups on
    the facts fallback), save a checkpoint, stop, and raise ``RewardLostError`` at the end of ``train()``.

    Why a callback that raises at train end rather than at the step: the Trainer saves the checkpoint the
    callback asked for after ``on_step_end``, so the run can be resumed from where the reward was lost.
    Counts are summed over processes first, so every rank takes the same decision (none waits on another)."""

    def __init__(self, bound: RewardBound, rewards: Sequence[Any]) -> None:
        self.bound = bound
        self.healths: list[tuple[str, RewardHealth]] = [
            (str(getattr(r, "__name__", type(r).__name__)), h) for r in rewards if (h := health_of(r)) is not None]
        self.tracker = LossTracker(bound)
        self.lost: dict[str, Any] | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        for _, health in self.healths:  # the preflight's calls are not a training step
            health.take()
        self.tracker = LossTracker(self.bound)
        self.lost = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.lost is not None:
            return
        for name, health in self.healths:
            verdict = self.tracker.step(state.global_step, name, _summed_over_ranks(health.take()))
            if verdict is not None and self.lost is None:
                what, share, streak = verdict
                self.lost = {"judge": health.judge, "what": what, "share": share, "streak": streak,
                             "first": self.tracker.first_step[(name, what)], "last": state.global_step,
                             "last_error": health.last_error}
        if self.lost is not None:
            control.should_save = True
            control.should_training_stop = True

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.lost is None:
            return
        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        raise RewardLostError(lost_message(**self.lost, bound=self.bound,
                                           checkpoint=str(ckpt) if ckpt.is_dir() else None))


def _summed_over_ranks(counts: Sequence[int]) -> tuple[int, ...]:
    """``counts`` summed over every process of a distributed run (each rank's reward sees only its slice)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return tuple(counts)
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    total = torch.tensor(list(counts), dtype=torch.long, device=device)
    dist.all_reduce(total)
    return tuple(int(x) for x in total.tolist())


class PreflightCallback(TrainerCallback):
    """Runs a recipe's reward preflight at ``on_train_begin``: after the Trainer has placed the model on
    its accelerator (DeepSpeed wraps and moves it only inside ``train()``), on every rank (under ZeRO-3
    the momentum roles' forward passes are collectives), after a resume has restored the checkpoint."""

    def __init__(self, preflight: Any) -> None:
        self.preflight = preflight
        self.seconds = 0.0  # kept out of the run's training time

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        import time

        t0 = time.perf_counter()
        self.preflight()
        self.seconds = time.perf_counter() - t0


class TrainingAlreadyDone(Exception):
    """Raised by ``StopAtMaxSteps`` before a step beyond ``max_steps``; ``train.run.skeleton`` catches it."""


class StopAtMaxSteps(TrainerCallback):
    """A run resumed from its last checkpoint (``max_steps`` reached: the final save or the final checks were
    interrupted) trains nothing more. transformers' Trainer checks the step count only after a step, so when
    ``max_steps`` ends inside an epoch (the LineupRL CPU job: 16 steps of a 32-step epoch) it resumes into one
    more generation and update than the run asked for; this stops it at the step's beginning, before anything
    is generated or scored."""

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.max_steps > 0 and state.global_step >= state.max_steps:
            raise TrainingAlreadyDone(state.global_step)


class ResumeShuffleCallback(TrainerCallback):
    """A run resumed in epoch e >= 1 continues with epoch e's data order, not epoch 0's.

    TRL's ``RepeatSampler`` (RLOO, GRPO) draws every epoch's shuffle from one generator seeded when the
    trainer is built, and transformers 5 no longer replays the skipped epochs through the sampler on
    resume: a resumed run would replay epoch 0's order, and a mid-epoch resume would skip the wrong
    items (some seen twice in that epoch, some never). At train begin of a resumed run this draws the
    skipped epochs' shuffles, so the sampler goes on exactly as in the uninterrupted run.
    """

    def on_train_begin(self, args: Any, state: Any, control: Any, train_dataloader: Any = None, **kwargs: Any) -> None:
        if state.global_step <= 0 or train_dataloader is None:
            return
        sampler = _repeat_sampler(train_dataloader)
        if sampler is None or not sampler.shuffle:
            return
        n, ga = len(train_dataloader), args.gradient_accumulation_steps
        per_epoch = max(n // ga + int(n % ga > 0), 1)  # the Trainer's own num_update_steps_per_epoch
        for _ in range(state.global_step // per_epoch):
            torch.randperm(sampler.num_samples, generator=sampler.generator)  # one shuffle per epoch, as __iter__


def _repeat_sampler(loader: Any) -> Any:
    """TRL's ``RepeatSampler`` under a (prepared) dataloader, or ``None``."""
    from captionrl.train.run.trl_compat import trl_object

    RepeatSampler = trl_object("trl.trainer.utils.RepeatSampler")

    todo, seen = [loader], 0
    while todo and seen < 16:  # DataLoaderShard -> BatchSampler(Shard) -> BatchSampler -> RepeatSampler
        obj = todo.pop(0)
        seen += 1
        if isinstance(obj, RepeatSampler):
            return obj
        todo += [getattr(obj, a) for a in ("batch_sampler", "sampler") if getattr(obj, a, None) is not None]
    return None
