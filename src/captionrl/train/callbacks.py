"""The trainer callback of the momentum model (MoCo Rubric).

``MomentumCallback`` plugs :mod:`captionrl.momentum` into any ``transformers``/TRL trainer without
subclassing it: ``on_step_end`` runs after the optimizer step (TRL passes the unwrapped model), applies the
EMA at synchronisation boundaries, and the distance ``||theta - phi|| / ||theta||`` joins the trainer's
logs. The momentum parameters travel with each checkpoint (``momentum.pt``) so that a resumed run keeps
its lagged Generator-Judge instead of silently restarting it from the Policy.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from captionrl.errors import ConfigError
from captionrl.momentum import Momentum
from captionrl.records import RecordWriter

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
    from captionrl.train.trl_compat import trl_object

    RepeatSampler = trl_object("trl.trainer.utils.RepeatSampler")

    todo, seen = [loader], 0
    while todo and seen < 16:  # DataLoaderShard -> BatchSampler(Shard) -> BatchSampler -> RepeatSampler
        obj = todo.pop(0)
        seen += 1
        if isinstance(obj, RepeatSampler):
            return obj
        todo += [getattr(obj, a) for a in ("batch_sampler", "sampler") if getattr(obj, a, None) is not None]
    return None
