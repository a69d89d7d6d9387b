"""Unscored samples leave no trace in the loss: their tokens and rows leave its normaliser too.

A sample whose every reward is ``None`` (a verifier outage, a judge that failed) is *unscored*. TRL 1.16
already gives it advantage 0 and leaves it out of its group's baseline (``_generate_and_score_completions``
in ``grpo_trainer.py`` / ``rloo_trainer.py``), but it stays in the loss's normaliser, so an outage dilutes
the step: the scored samples' loss is divided by more tokens (``dapo``), or more rows (``grpo``, RLOO), than
took part, and under ``beta > 0`` GRPO's KL term still pulls on the unscored captions. Here the batch TRL
returns from generation is changed before any loss reads it, so a batch with unscored samples gives the
loss and the gradients of the same batch without them (``tests/test_unscored.py`` checks it on the tiny
Llama for every loss type the recipes use):

- GRPO: the unscored rows of ``completion_mask`` are zeroed (what TRL's own ``mask_truncated_completions``
  does to truncated captions), and ``num_items_in_batch`` is recounted from the masked tensor as TRL counts
  it, so the token-normalised losses (``dapo``, ``cispo``, ``vespo``: the generation batch's tokens, across
  processes; ``bnpo``: the micro-batch's) and the KL and entropy terms see only scored tokens;
- losses normalised by the number of rows (GRPO ``grpo``, ``sapo``, ``dr_grpo``, ``luspo``; RLOO's
  per-sequence mean) cannot be fixed by a mask: their loss is multiplied by ``N / N_scored``, the generation
  batch's samples over its scored ones (both counted across processes). With one generation batch per
  optimizer step (TRL's default) that turns TRL's mean over all rows into the mean over the scored rows.
  RLOO's mask is left alone: its unscored rows already contribute exactly 0 (advantage 0, KL in the reward),
  and its old log-probs were summed under the original mask.

A batch with no unscored sample is returned untouched, so a run without outages computes exactly TRL's loss.
Where the row rescale would also scale a term that is not the policy's (GRPO's entropy bonus), the config is
refused when it loads (:func:`settings_problem`); a MoE router loss is scaled with it (noted in the log).

It patches the one trainer instance, never TRL's class; the internals it relies on are declared (and
tested) in :mod:`captionrl.train.run.trl_compat`.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

TOKEN_LOSSES = ("dapo", "cispo", "vespo", "bnpo")
"""GRPO loss types normalised by a token count (of the masked tensor): zeroing the mask is enough."""
ROW_LOSSES = ("grpo", "sapo", "dr_grpo", "luspo")
"""GRPO loss types normalised by the number of rows: their loss is rescaled by ``N / N_scored``."""
SCALE_KEY = "captionrl_scored_rows_scale"
"""The batch entry (a 0-dim tensor, copied to every micro-batch as TRL copies ``num_items_in_batch``) holding
``N / N_scored`` for the row-normalised losses."""


def normaliser(trainer: Any) -> str:
    """``tokens`` (the mask's token count) or ``rows`` (the number of samples) for ``trainer``'s loss."""
    loss_type = getattr(trainer, "loss_type", None)
    if loss_type is None:  # RLOO: a per-sequence loss averaged over the rows
        return "rows"
    if loss_type in TOKEN_LOSSES:
        return "tokens"
    if loss_type in ROW_LOSSES:
        return "rows"
    raise ValueError(f"train.run.unscored: unknown GRPO loss_type {loss_type!r} (TRL changed?): declare how it "
                     "normalises in captionrl.train.run.unscored")


def settings_problem(algorithm: str, loss_type: str | None, entropy_coef: float | None,
                     adaptive_entropy: bool | None) -> tuple[str, Any, str, str] | None:
    """(field, value, problem, fix) when unscored samples cannot be kept out of the loss exactly, else None.

    A row-normalised GRPO loss is rescaled as a whole, and GRPO adds its entropy bonus inside that loss, so
    the bonus would be rescaled with it."""
    if algorithm != "grpo" or loss_type not in ROW_LOSSES:
        return None
    if entropy_coef or adaptive_entropy:
        field = "train.entropy_coef" if entropy_coef else "train.use_adaptive_entropy"
        return (field, entropy_coef if entropy_coef else adaptive_entropy,
                f"an entropy bonus with loss_type {loss_type} cannot be kept apart from the rescale that keeps "
                "unscored samples out of the loss's normaliser",
                "use train.loss_type: dapo (token-normalised: unscored tokens are masked), or no entropy bonus")
    return None


def exclude_unscored(trainer: Any) -> str:
    """Patch ``trainer`` so unscored samples leave its loss and its normaliser; returns what it does (a note).

    The gathered rewards of each generation batch are read as TRL computes them; counts of the samples left
    out land in ``trainer._captionrl_unscored`` (``batches``, ``samples``)."""
    import torch

    from captionrl.train.run.trl_compat import original

    kind = normaliser(trainer)
    grpo = getattr(trainer, "loss_type", None) is not None
    rewards_pass = original(trainer, "_calculate_rewards")
    generate_pass = original(trainer, "_generate_and_score_completions")
    loss_pass = original(trainer, "_compute_loss")
    state: dict[str, Any] = {"normaliser": kind, "unscored": None, "batches": 0, "samples": 0}

    def calculate_rewards(inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any) -> Any:
        rewards = rewards_pass(inputs, prompts, completions, completion_ids_list)
        state["unscored"] = torch.isnan(rewards).all(dim=1)  # every process's samples, as TRL's mask
        return rewards

    def generate_and_score(inputs: Any) -> Any:
        state["unscored"] = None
        out = generate_pass(inputs)
        unscored = state["unscored"]
        if unscored is None:
            raise RuntimeError("train.run.unscored: _generate_and_score_completions returned without calling "
                               "_calculate_rewards (TRL changed?)")
        if not bool(unscored.any()):  # the same answer on every process: the rewards are gathered
            return out
        mask = out["completion_mask"]
        local = unscored[trainer.accelerator.process_index * mask.size(0):][: mask.size(0)].to(mask.device)
        total, scored = unscored.numel(), int((~unscored).sum())
        state["batches"] += 1
        state["samples"] += total - scored
        if grpo:
            out["completion_mask"] = mask * (~local).unsqueeze(1).to(mask.dtype)
            tool_mask = out.get("tool_mask")
            loss_mask = out["completion_mask"] if tool_mask is None else out["completion_mask"] * tool_mask
            out["num_items_in_batch"] = trainer.accelerator.gather(loss_mask.sum()).sum()
        if kind == "rows":
            out[SCALE_KEY] = torch.tensor(total / max(scored, 1), device=mask.device)
        return out

    def compute_loss(model: Any, inputs: Any) -> Any:
        loss = loss_pass(model, inputs)
        scale = inputs.get(SCALE_KEY)
        return loss if scale is None else loss * scale

    trainer._calculate_rewards = calculate_rewards
    trainer._generate_and_score_completions = generate_and_score
    if kind == "rows":
        trainer._compute_loss = compute_loss
        if getattr(trainer, "aux_loss_enabled", False):
            logger.warning("unscored samples: the MoE router loss is rescaled with the policy loss "
                           f"({getattr(trainer, 'loss_type', None) or 'RLOO'} normalises by rows)")
    trainer._captionrl_unscored = state
    how = ("their tokens leave the mask and the token count" if kind == "tokens"
           else "the loss is the mean over scored rows" + (" (their tokens also leave the mask)" if grpo else ""))
    return f"unscored samples leave the loss: {how}"
