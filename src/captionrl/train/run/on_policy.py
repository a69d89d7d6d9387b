"""Skip RLOO's old-policy forward pass when training is on-policy.

TRL's ``RLOOTrainer`` (1.16) always runs a no-grad forward pass over every generated caption to get the
"old" policy's log-probs, then divides by them in the loss (``exp(logps - old_logps)``, PPO-style
clipping). When one generation batch feeds exactly one optimizer step (``num_iterations == 1`` and
``steps_per_generation == gradient_accumulation_steps``) and there is no KL term (``beta == 0``), the
old policy *is* the current one: the ratio is 1, clipping never acts, and the gradient is plain
``-A * grad(logps)``. TRL's own ``GRPOTrainer`` skips the pass in exactly this case and uses
``logps.detach()``; this module gives RLOO the same shortcut, so the loss and the gradient are the ones
TRL computes, minus one forward pass over the whole batch (8 s of a 66 s step in the README's CPU job).

It patches the one trainer instance (as :mod:`captionrl.train.run.timing` does), never TRL's class; the TRL
internals it relies on are declared (and tested) in :mod:`captionrl.train.run.trl_compat`.
"""

from __future__ import annotations

from typing import Any


def on_policy_reason(trainer: Any) -> str | None:
    """Why ``trainer`` needs no old-policy pass (a sentence), or ``None`` when it does need one."""
    try:
        from trl import RLOOTrainer
    except ImportError:  # pragma: no cover - TRL is a dependency of every training path
        return None
    if not isinstance(trainer, RLOOTrainer):
        return None  # GRPOTrainer already skips the pass itself when it may
    args = trainer.args
    if getattr(trainer, "num_iterations", 1) != 1:
        return None  # mu > 1: later passes over the batch are off-policy
    if args.steps_per_generation != args.gradient_accumulation_steps:
        return None  # one generation batch spans several optimizer steps: later ones are off-policy
    if getattr(trainer, "beta", 0.0) != 0.0:
        return None  # the KL estimate reads the old log-probs
    return ("on-policy (num_iterations 1, one generation batch per optimizer step, beta 0): the old-policy "
            "log-probs equal the loss pass's own, so that pass is skipped as TRL's GRPOTrainer does")


class _OldLogpsFromLoss(dict):  # type: ignore[type-arg]
    """The loss step's inputs, whose ``old_logps`` are the loss pass's own log-probs, detached."""

    def __init__(self, inputs: dict[str, Any], state: dict[str, Any]) -> None:
        super().__init__(inputs)
        self._state = state

    def __getitem__(self, key: str) -> Any:
        if key == "old_logps":
            per_token = self._state["per_token_logps"]
            if per_token is None:
                raise RuntimeError("old_logps read before the loss pass computed log-probs (TRL changed?)")
            return (per_token * super().__getitem__("completion_mask")).sum(1).detach()
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:  # a TRL that reads old_logps with .get gets them too
        if key in self:
            return self[key]  # through __getitem__, so old_logps is the loss pass's own
        return default


def reuse_on_policy_logprobs(trainer: Any) -> str | None:
    """Patch ``trainer`` to skip the redundant old-policy pass when :func:`on_policy_reason` allows.

    Returns the reason (also the note the run prints), or ``None`` when the trainer is left as it is.
    The generation step's no-grad pass returns placeholder zeros that nothing reads; the loss step then
    reads ``old_logps`` as its own log-probs, detached, so the importance ratio is exactly 1.
    """
    reason = on_policy_reason(trainer)
    if reason is None:
        return None
    import torch

    from captionrl.train.run.trl_compat import original

    per_token_pass = original(trainer, "_get_per_token_logps_and_entropies")
    loss_pass = original(trainer, "_compute_loss")
    state: dict[str, Any] = {"reason": reason, "in_loss": False, "per_token_logps": None, "skipped": 0}

    def logps_and_entropies(model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int,
                            *args: Any, **kwargs: Any) -> Any:
        if not state["in_loss"] and not torch.is_grad_enabled():  # the old-policy pass: redundant here
            state["skipped"] += 1
            zeros = torch.zeros(input_ids.size(0), logits_to_keep, device=input_ids.device)
            return zeros, None, None
        out = per_token_pass(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
        if state["in_loss"]:
            state["per_token_logps"] = out[0]
        return out

    def compute_loss(model: Any, inputs: dict[str, Any]) -> Any:
        state["in_loss"], state["per_token_logps"] = True, None
        try:
            return loss_pass(model, _OldLogpsFromLoss(inputs, state))
        finally:
            state["in_loss"], state["per_token_logps"] = False, None

    trainer._get_per_token_logps_and_entropies = logps_and_entropies
    trainer._compute_loss = compute_loss
    trainer._captionrl_on_policy = state
    return reason
