"""Every private TRL name captionrl relies on, in one place, and the check that the installed TRL still has it.

captionrl never subclasses TRL's trainers, but six modules patch one trainer instance or read TRL
internals: ``train.run.compact_head`` (the fused LM head scores only labelled positions on CPU too), ``train.run.on_policy`` (RLOO's redundant old-policy pass), ``train.run.shared_prefix`` (each group's
prompt once in the loss pass), ``train.run.unscored`` (unscored samples leave the loss's normaliser),
``train.run.timing`` (the per-step time breakdown) and ``train.run.callbacks`` (the sampler's shuffle on resume). A TRL release may rename or reshape
any of them, and some breaks would be silent (a timing breakdown of zeros; placeholder old log-probs read
with ``.get``). So each internal is declared here as an ``Internal`` (where it lives, the parameters the
patch passes on, the source text the patch relies on, who uses it and why), the patches fetch them through
:func:`original` (which fails naming the attribute and the TRL version), and ``tests/test_trl_compat.py``
checks every entry against the installed TRL with ``inspect``. pyproject pins TRL to the minor release
these were checked against.

Adding a patch: declare its internals with :func:`register` (or add them to ``INTERNALS``) and fetch them
with :func:`original`; the test then covers them.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

CHECKED_TRL = "1.16"
"""The TRL minor release every entry below was read from."""
TRL_PIN = "trl>=1.16,<1.17"
"""pyproject.toml's requirement: only the release the entries were checked against."""

TRAINERS = ("RLOOTrainer", "GRPOTrainer")


@dataclass(frozen=True)
class Internal:
    """One private TRL name and what captionrl relies on about it.

    ``owner``: a class in ``trl`` (``RLOOTrainer``) or a dotted path (``trl.trainer.utils.RepeatSampler``);
    ``name``: the attribute (``None``: the owner itself); ``params``: the leading parameters (after ``self``)
    the patch passes positionally; ``source``: text the attribute's source must contain (a key the patch
    feeds, a call it intercepts); ``used_by``: the module and the reason.
    """

    owner: str
    name: str | None
    used_by: str
    params: tuple[str, ...] = ()
    source: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return self.owner if self.name is None else f"{self.owner}.{self.name}"


def _both(name: str, used_by: str, params: tuple[str, ...] = (), source: tuple[str, ...] = ()) -> list[Internal]:
    return [Internal(t, name, used_by, params, source) for t in TRAINERS]


INTERNALS: list[Internal] = [
    # train.run.on_policy: RLOO's old-policy pass is skipped when training is on-policy
    Internal("RLOOTrainer", "_get_per_token_logps_and_entropies", "train.run.on_policy (returns placeholder log-probs "
             "from the no-grad old-policy pass; keeps the loss pass's own)",
             params=("model", "input_ids", "attention_mask", "logits_to_keep")),
    Internal("RLOOTrainer", "_compute_loss", "train.run.on_policy (feeds inputs whose old_logps are the loss pass's own)",
             params=("model", "inputs"), source=('inputs["old_logps"]',)),
    Internal("RLOOTrainer", "_generate_and_score_completions", "train.run.on_policy (the old-policy pass it skips runs "
             "there under no_grad and is stored as old_logps)",
             source=("torch.no_grad()", "old_per_token_logps, _, _ = self._get_per_token_logps_and_entropies(",
                     '"old_logps": old_logps')),
    Internal("RLOOTrainer", "__init__", "train.run.on_policy (reads trainer.num_iterations and trainer.beta)",
             source=("self.num_iterations = args.num_iterations", "self.beta = args.beta")),
    # train.warm_start.anchor_reference: the KL reference is loaded from the policy config's _name_or_path
    *_both("__init__", "train.warm_start.anchor_reference (the reference model is built from the policy "
           "config's _name_or_path, which it points at the warm-started weights)",
           source=("create_model_from_path(get_config_model_id(self.model.config)",)),
    # train.run.timing: time/generation, time/reward, time/logprobs and time/backward per step
    *_both("_generate", "train.run.timing (time/generation)", params=("prompts",)),
    *_both("_calculate_rewards", "train.run.timing (time/reward)",
           params=("inputs", "prompts", "completions", "completion_ids_list")),
    *_both("_prepare_inputs", "train.run.timing (generation + scoring + log-prob passes of a step)",
           params=("generation_batch",)),
    *_both("training_step", "train.run.timing (time/backward: the step less its _prepare_inputs)",
           params=("model", "inputs", "num_items_in_batch")),
    Internal("transformers.Trainer", "training_step", "train.run.timing (TRL's training_step reaches _prepare_inputs "
             "through it, so the step less _prepare_inputs is the forward-backward pass)",
             source=("self._prepare_inputs(",)),
    # train.run.shared_prefix: each group's prompt once in the loss pass (TRL's fused LM head on a shared cache)
    *_both("_get_per_token_logps_and_entropies", "train.run.shared_prefix (the loss pass it replaces for text "
           "batches: same arguments, same (logps, entropies, aux_loss) result)",
           params=("model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy",
                   "compute_aux_loss"),
           source=("fused_lm_head=True", "labels[:, :-logits_to_keep] = -100", "outputs.log_probs[:, -logits_to_keep:]")),
    Internal("trl.trainer.utils.add_fused_lm_head", None, "train.run.shared_prefix (the fused head runs the backbone "
             "with the caller's kwargs, so a cache passed in is used; log_probs/entropy over label != -100)",
             source=("backbone_outputs = getattr(self, backbone_attr)(*args, **kwargs)", "labels = labels[:, 1:]")),
    # train.run.compact_head: on CPU too, the fused LM head scores only the labelled positions
    Internal("trl.trainer.utils", "_use_triton", "train.run.compact_head (rebound for the fused head's choice between "
             "scoring the labelled positions and scoring all; the kernel module keeps its own binding)"),
    Internal("trl.trainer.utils.add_fused_lm_head", None, "train.run.compact_head (its one use of _use_triton is the "
             "compact choice, and the compact path gathers the labelled rows)",
             source=("compact = _use_triton(hidden_states.device)", "hidden_states[mask] if compact else",
                     "labels[mask] if compact else")),
    # train.run.unscored: samples every reward left None leave the loss and its normaliser
    *_both("_calculate_rewards", "train.run.unscored (which samples every reward left None: the all-NaN rows of the "
           "gathered rewards)", params=("inputs", "prompts", "completions", "completion_ids_list"),
           source=("rewards_per_func = gather(rewards_per_func)", "torch.nan")),
    *_both("_generate_and_score_completions", "train.run.unscored (the batch it returns is masked and recounted "
           "before the loss reads it; unscored rows get advantage 0 there)",
           source=('"completion_mask": completion_mask', "unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)",
                   "advantages = torch.nan_to_num(advantages, nan=0.0)",
                   "self.accelerator.process_index * len(prompts)")),
    Internal("GRPOTrainer", "_generate_and_score_completions", "train.run.unscored (num_items_in_batch is the gathered "
             "sum of the loss mask; it is recounted the same way after masking)",
             source=("loss_mask = completion_mask if tool_mask is None else completion_mask * tool_mask",
                     "num_items_in_batch = self.accelerator.gather(loss_mask.sum()).sum()")),
    *_both("_compute_loss", "train.run.unscored (the row-normalised losses are rescaled by N / N_scored)",
           params=("model", "inputs")),
    Internal("GRPOTrainer", "_compute_loss", "train.run.unscored (which loss types divide by a token count of the "
             "mask, which by the number of rows)",
             source=('inputs["num_items_in_batch"]', "loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)",
                     "(per_token_loss.size(0) * self.max_completion_length)", "loss = (per_token_loss * mask).sum(-1).mean()",
                     "loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()")),
    Internal("RLOOTrainer", "_compute_loss", "train.run.unscored (RLOO's loss is a mean over rows; an unscored row's "
             "advantage 0 makes its term exactly 0)", source=("loss = per_sequence_loss.mean()",)),
    *_both("_prepare_inputs", "train.run.shared_prefix.micro_batch_sharing (what a loss pass holds: each rank's "
           "generation batch shuffled, then cut into steps_per_generation loss passes)",
           source=("shuffle_sequence_dict(generation_batch)",
                   "split_tensor_dict(generation_batch, self.args.steps_per_generation)")),
    *_both("_get_train_sampler", "train.run.shared_prefix.micro_batch_sharing (the G copies of a prompt are adjacent "
           "in the sampler's order)", source=("mini_repeat_count=self.num_generations",)),
    # train.run.callbacks: a resumed run continues the sampler's shuffle sequence
    Internal("trl.trainer.utils.RepeatSampler", None, "train.run.callbacks.ResumeShuffleCallback (finds the sampler)"),
    Internal("trl.trainer.utils.RepeatSampler", "__iter__", "train.run.callbacks.ResumeShuffleCallback (replays one "
             "shuffle per skipped epoch: one randperm of num_samples from the sampler's generator)",
             source=("torch.randperm(self.num_samples, generator=self.generator)", "if self.shuffle")),
]


def register(*internals: Internal) -> None:
    """Declare the internals of another patch module (checked with the rest)."""
    for internal in internals:
        if internal not in INTERNALS:
            INTERNALS.append(internal)


def trl_version() -> str:
    import trl

    return str(getattr(trl, "__version__", "unknown"))


def _resolve_owner(owner: str) -> Any:
    import importlib

    import trl

    if "." not in owner:
        return getattr(trl, owner)
    module, _, name = owner.rpartition(".")
    return getattr(importlib.import_module(module), name)


def problems(internal: Internal) -> list[str]:
    """What no longer holds for ``internal`` in the installed TRL (empty: the patch can rely on it)."""
    where = f"TRL {trl_version()} (captionrl's patches were checked against {CHECKED_TRL})"
    try:
        obj = _resolve_owner(internal.owner)
    except (AttributeError, ImportError) as exc:
        return [f"{internal.owner} is gone in {where} ({exc}); used by {internal.used_by}"]
    if internal.name is not None:
        if not hasattr(obj, internal.name):
            return [f"{internal.label} is gone in {where}; used by {internal.used_by}"]
        obj = getattr(obj, internal.name)
    found: list[str] = []
    if internal.params:
        try:
            params = [p for p in inspect.signature(obj).parameters if p != "self"]
        except (TypeError, ValueError):
            params = []
        if tuple(params[: len(internal.params)]) != internal.params:
            found.append(f"{internal.label} takes {tuple(params)} in {where}, the patch passes {internal.params} "
                         f"first; used by {internal.used_by}")
    if internal.source:
        try:
            text = inspect.getsource(inspect.unwrap(obj))
        except (OSError, TypeError):
            text = ""
        missing = [s for s in internal.source if s not in text]
        if missing:
            found.append(f"{internal.label} no longer contains {missing} in {where}; used by {internal.used_by}")
    return found


def check_all() -> list[str]:
    """Every problem of every declared internal (what the test asserts empty)."""
    return [p for internal in INTERNALS for p in problems(internal)]


def trl_object(path: str) -> Any:
    """A declared TRL object by its dotted path (``trl.trainer.utils.RepeatSampler``), or an error naming it
    and the TRL version when it moved."""
    if not any(i.owner == path for i in INTERNALS):
        raise RuntimeError(f"captionrl.train.run.trl_compat: {path} is not a declared TRL internal; declare it in "
                           "INTERNALS (or register()) so tests/test_trl_compat.py checks it")
    try:
        return _resolve_owner(path)
    except (AttributeError, ImportError) as exc:
        raise RuntimeError(f"{path} does not exist in TRL {trl_version()} ({exc}); captionrl was checked against "
                           f"TRL {CHECKED_TRL}: install {TRL_PIN} (see pyproject.toml) or update "
                           "captionrl.train.run.trl_compat") from exc


def original(obj: Any, name: str) -> Any:
    """``obj.name`` for a declared internal, or an error naming the attribute and the TRL version.

    Patches fetch what they wrap through here, so an undeclared name cannot slip in and a renamed one
    stops the run with the cause instead of breaking it somewhere later."""
    owners = {i.owner for i in INTERNALS if i.name == name}
    if not owners:
        raise RuntimeError(f"captionrl.train.run.trl_compat: {name} is not a declared TRL internal; declare it in "
                           "INTERNALS (or register()) so tests/test_trl_compat.py checks it")
    if not hasattr(obj, name):
        raise RuntimeError(
            f"{type(obj).__name__}.{name} does not exist in TRL {trl_version()}; captionrl's patches were checked "
            f"against TRL {CHECKED_TRL}: install {TRL_PIN} (see pyproject.toml) or update "
            "captionrl.train.run.trl_compat and the patch that uses it")
    return getattr(obj, name)
