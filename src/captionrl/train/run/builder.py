"""The TRL trainer every RL recipe shares: its arguments, the trainer with captionrl's patches and callbacks,
and the final save.

A recipe (LineupRL, RubiCap, MoCo) differs only in its data and its reward callables; everything that
touches TRL's trainers lives here, so the CPU settings, the explicit algorithm defaults and the final save
are the same for all of them. We never subclass TRL's trainers: recipes plug in through reward callables
and ``TrainerCallback``s.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from captionrl.errors import ConfigError

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from captionrl.rewards.bound import RewardBound
    from captionrl.train.run.sections import TrainConfig


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


CHECKPOINTING = ("activation_checkpointing", "activation_checkpointing_kwargs", "gradient_checkpointing",
                 "gradient_checkpointing_kwargs")
"""transformers' names for recomputing activations: ``gradient_checkpointing*`` are deprecated aliases of
``activation_checkpointing*`` (a FutureWarning when given) where the latter exist, the only names before."""


def checkpointing_args(cls: type, on: bool, kwargs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Activation checkpointing (``on``, and its keyword arguments) for trainer-arguments class ``cls`` under
    the names it reads without a deprecation warning: ``activation_checkpointing*`` where ``cls`` has them,
    ``gradient_checkpointing*`` where those are its only names (older transformers, as a GPU install may pin)."""
    names = {f.name for f in dataclasses.fields(cls)}
    prefix = "activation" if "activation_checkpointing" in names else "gradient"
    return {f"{prefix}_checkpointing": on, **({f"{prefix}_checkpointing_kwargs": dict(kwargs)} if kwargs else {})}


def trainer_args(train: TrainConfig, seed: int, reward_weights: Sequence[float] | None = None) -> Any:
    """RLOOConfig or GRPOConfig holding every value of ``train`` (TRL validates them), plus what captionrl sets
    itself: the checkpoint folder, the seeds, the device choices and the recipe's reward weights."""
    import copy

    cls = train.trl_class()
    on_cpu = train.use_cpu if train.use_cpu is not None else not cuda_available()
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    values = {name: copy.deepcopy(getattr(train, name)) for name in names if hasattr(train, name)}
    given = [getattr(train, "activation_checkpointing", None), train.gradient_checkpointing]
    kwargs = getattr(train, "activation_checkpointing_kwargs", None) or getattr(train, "gradient_checkpointing_kwargs", None)
    values = {k: v for k, v in values.items() if k not in CHECKPOINTING}
    values.update({
        "output_dir": str(Path(train.out_dir) / "checkpoints"),
        "seed": seed,
        "data_seed": train.data_seed if train.data_seed is not None else seed,
        "use_cpu": on_cpu,
        "bf16": train.bf16 if train.bf16 is not None else not on_cpu,
        **checkpointing_args(cls, next((v for v in given if v is not None), not on_cpu), kwargs),
        "report_to": list(train.report_to) or "none",
        "reward_weights": list(reward_weights) if reward_weights else None,
    })
    try:
        return cls(**values)
    except ValueError as exc:  # TRL's own consistency checks, reported in our terms
        raise ConfigError("train", train.algorithm, f"TRL rejected the settings: {exc}", "adjust the named setting") from exc


def build_trainer(
    train: TrainConfig,
    args: Any,
    model: Any,
    processing_class: Any,
    reward_funcs: Sequence[Callable[..., Any]],
    train_dataset: Any,
    callbacks: Sequence[Any] = (),
    peft_config: Any = None,
    bound: RewardBound | None = None,
) -> Any:
    """The TRL trainer for ``train.algorithm`` (never a home-made loop).

    ``bound``: the recipe's lost-reward bound (``rewards.bound``); the run stops, saved, when its rewards
    stay unscored too long (``RewardBoundCallback``, registered last so every other callback ends first)."""
    if train.algorithm == "rloo":
        from trl import RLOOTrainer as Trainer
    else:
        from trl import GRPOTrainer as Trainer  # type: ignore[assignment]
    from captionrl.train.run.callbacks import ResumeShuffleCallback

    trainer = Trainer(
        model=model,
        reward_funcs=list(reward_funcs),
        args=args,
        train_dataset=train_dataset,
        processing_class=processing_class,
        callbacks=[*callbacks, ResumeShuffleCallback()],  # resume keeps the uninterrupted data order
        peft_config=peft_config,
    )
    from captionrl.train.run.on_policy import reuse_on_policy_logprobs
    from captionrl.train.run.shared_prefix import share_prompt_forward
    from captionrl.train.run.timing import install_step_timer
    from captionrl.train.run.unscored import exclude_unscored

    if train.shared_prompt_forward:  # patched first: the on-policy shortcut wraps whichever pass is in place
        why_not = share_prompt_forward(trainer)
        if is_main_process():
            logger.info(f"shared-prompt forward: off, {why_not}" if why_not else
                        f"shared-prompt forward: on, {trainer._captionrl_shared_prefix['sharing']}")
    reason = reuse_on_policy_logprobs(trainer)  # RLOO on-policy: no old-policy pass, as GRPO does
    if reason and is_main_process():
        logger.info(f"old-policy log-probs: not recomputed, {reason}")
    note = exclude_unscored(trainer)  # a verifier outage must not dilute the scored samples' loss
    if is_main_process():
        logger.info(note)
    install_step_timer(trainer, train.out_dir)  # time/* metrics per step, timing.json at the end
    if bound is not None:
        from captionrl.train.run.callbacks import RewardBoundCallback

        trainer.add_callback(RewardBoundCallback(bound, reward_funcs))
    return trainer


def is_main_process() -> bool:
    return os.environ.get("RANK", "0") == "0"


def unwrap_for_inference(trainer: Any) -> Any:
    """The trained model for generation: LoRA adapters merged into a copy when PEFT is used."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    if hasattr(model, "merge_and_unload") and hasattr(model, "peft_config"):
        import copy

        model = copy.deepcopy(model).merge_and_unload()
    model.eval()
    return model


def save_final_model(trainer: Any, folder: str | Path) -> Path:
    """Save the final policy (adapters only with LoRA, as PEFT does) and its processing class."""
    p = Path(folder)
    trainer.save_model(str(p))
    if trainer.accelerator.is_main_process and trainer.processing_class is not None:
        trainer.processing_class.save_pretrained(str(p))
    return p
