"""The TRL builder every RL recipe shares: policy loading, trainer arguments, resume, final save.

A recipe (LineupRL, RubiCap, MoCo) differs only in its data and its reward callables; everything that
touches TRL's trainers lives here, so the CPU settings, the explicit algorithm defaults, the checkpoint
and resume rules and the saved config are the same for all of them. We never subclass TRL's trainers:
recipes plug in through reward callables and ``TrainerCallback``s.

The train section (``TrainConfig``) is TRL's RLOOConfig / GRPOConfig fields plus captionrl's own settings;
``train.trl_settings`` builds it and holds our deliberate defaults. Every knob on which RLOO and GRPO
disagree is resolved to a value in our config when it loads, so the saved config says exactly what ran.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from captionrl.config import help_field, to_dict
from captionrl.errors import ConfigError
from captionrl.train import trl_settings
from captionrl.train.freezing import check_freeze_layers

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from captionrl.backends import BackendConfig
    from captionrl.rewards.bound import RewardBound

RESUME_SAFE_KEYS = ("train.threads", "train.report_to", "train.logging_steps", "train.max_steps", "train.memory_plan",
                    "train.resume", "eval", "check", "build_rubrics",
                    "reward.max_unscored_frac", "reward.unscored_patience", "reward.max_fallback_frac")
"""Settings that may change between an interrupted run and its resume (they do not change what was
learnt so far). ``train.max_steps`` may grow to train longer, and the lost-reward bound may be loosened
to resume a run it stopped; everything else must match the saved config."""


# ---------------------------------------------------------------------- configs
@dataclass
class PolicyConfig:
    """The captioner being trained."""

    model: str = help_field("embedded", "'embedded' (SmolLM2-135M-Instruct shipped offline), an HF folder, a .gguf file or a hub id (a hub id downloads: your choice, never a default)")
    input: str = help_field("auto", "what the captioner reads: numbers (the series printed as text, language-only policies), chart (a rendered chart image, VLM policies), or auto (chart for a VLM, numbers otherwise)")
    lora: bool = help_field(False, "train LoRA adapters (PEFT) instead of every weight")
    lora_r: int = help_field(16, "LoRA rank")
    lora_alpha: int = help_field(32, "LoRA alpha (scale = alpha / r)")
    lora_dropout: float = help_field(0.05, "LoRA dropout")
    lora_target_modules: str | list[str] = help_field("all-linear", "modules that get LoRA adapters: 'all-linear' or a list of module names")
    dtype: str = help_field("auto", "weights dtype when loading: auto (float32 for trained weights; bf16 speed comes from train.bf16 autocast), float32, bfloat16 or float16")
    trust_remote_code: bool = help_field(False, "allow model repositories' own Python code")
    attn_implementation: str | None = help_field(None, "attention kernel of the trained policy: null (transformers' default: sdpa), sdpa, eager, or flash_attention_2 (needs the flash-attn package, which builds from source against your CUDA torch)")

    def __post_init__(self) -> None:
        if self.attn_implementation not in (None, "sdpa", "eager", "flash_attention_2", "flash_attention_3"):
            raise ConfigError("policy.attn_implementation", self.attn_implementation, "unknown attention implementation",
                              "use null (transformers' default), sdpa, eager or flash_attention_2")
        if self.input not in ("auto", "numbers", "chart"):
            raise ConfigError("policy.input", self.input, "unknown captioner input", "use numbers, chart or auto")
        if self.dtype not in ("float32", "bfloat16", "float16", "auto"):
            raise ConfigError("policy.dtype", self.dtype, "unknown dtype", "use float32, bfloat16, float16 or auto")
        if self.lora and self.lora_r < 1:
            raise ConfigError("policy.lora_r", self.lora_r, "must be >= 1", "set policy.lora_r: 16")


@dataclass
class _CaptionRLTrain:
    """The settings of the train section that are captionrl's own; ``TrainConfig`` adds TRL's."""

    algorithm: str = help_field("rloo", "rloo (LineupRL's choice: leave-one-out baseline) or grpo (group-normalised advantages); picks TRL's RLOOConfig or GRPOConfig")
    out_dir: str = help_field("runs/lineup", "run folder: checkpoints, metrics, curves, final model, evaluation; rerunning with the same folder resumes")
    seed: int | None = help_field(None, "trainer seed (sampling, shuffling, init; also TRL's data_seed unless set); null = the run's top-level seed")
    threads: int | None = help_field(None, "torch CPU threads (null: leave torch's / OMP_NUM_THREADS's choice); 1 when sharing the CPU")
    use_cpu: bool | None = help_field(None, "train on CPU; null = CPU when no GPU is visible")
    bf16: bool | None = help_field(None, "bf16 mixed precision; null = on for GPUs, off on CPU")
    gradient_checkpointing: bool | None = help_field(None, "recompute activations to save memory; null = on for GPUs, off on CPU")
    resume: str = help_field("auto", "auto: resume from the last checkpoint in out_dir (the saved config must match); off: refuse to reuse a folder that holds checkpoints")
    shared_prompt_forward: bool = help_field(True, "loss pass: run each group's prompt once and reuse its key/value cache for the G completions (exact: same log-probs and gradients as TRL's pass; text batches and Qwen-VL policies with their images, whose vision tower then runs once per group; with gradient checkpointing (non-reentrant), DDP and DeepSpeed ZeRO-2/3 too; where it cannot run, TRL's pass runs and the run says why)")
    preflight_items: int = help_field(8, "reward preflight: training items on which an honest reference must beat every hacking probe before step 1 (0 = skip)")
    force_preflight: bool = help_field(False, "start training even when a hacking probe beats the honest reference in the reward preflight")
    preflight_margin: float = help_field(0.0, "reward preflight: every probe's mean reward must stay this far below the honest reference's (0: below it at all); a probe closer than this counts as winning")
    freeze_layers: int = help_field(0, "bottom transformer blocks kept frozen, with the embeddings, during RL (full fine-tuning only): the weights under a noisy policy-gradient step are only the top blocks, and a CPU step is cheaper (docs/main-job.md)")
    memory_plan: str = help_field("refuse", "on CUDA, plan the GPU memory before anything loads (captionrl plan) and: refuse a plan that does not fit, naming the fix; warn and go on; or off")

    if TYPE_CHECKING:  # the TRL fields are added by make_dataclass below
        def __getattr__(self, name: str) -> Any: ...

    def __post_init__(self) -> None:
        if self.algorithm not in trl_settings.ALGORITHMS:
            from captionrl.registry import suggest

            raise ConfigError("train.algorithm", self.algorithm, "unknown algorithm",
                              suggest(self.algorithm, list(trl_settings.ALGORITHMS)))
        trl_settings.resolve(self, self.algorithm, _TRL_PENDING)
        if self.num_generations < 2:
            raise ConfigError(
                "train.num_generations", self.num_generations,
                "G must be >= 2: the baseline of a caption is computed from the other captions of its group",
                "set train.num_generations: 4 (or more)",
            )
        for name in ("per_device_train_batch_size", "gradient_accumulation_steps", "num_iterations",
                     "max_completion_length", "save_steps", "logging_steps"):
            if getattr(self, name) is None or getattr(self, name) < 1:
                raise ConfigError(f"train.{name}", getattr(self, name), "must be >= 1", f"set train.{name} to 1 or more")
        if self.max_steps == 0 or self.max_steps < -1:
            raise ConfigError("train.max_steps", self.max_steps, "must be -1 (use epochs) or >= 1", "set train.max_steps: 100")
        if self.learning_rate <= 0:
            raise ConfigError("train.learning_rate", self.learning_rate, "must be > 0", "set train.learning_rate: 1e-6")
        if not self.preflight_margin >= 0:
            raise ConfigError("train.preflight_margin", self.preflight_margin, "must be >= 0", "set 0 or e.g. 0.2")
        if self.resume not in ("auto", "off"):
            raise ConfigError("train.resume", self.resume, "unknown resume mode", "use auto or off")
        check_memory_plan_mode(self.memory_plan)
        check_freeze_layers(self.freeze_layers, "train.freeze_layers")
        if self.threads is not None and self.threads < 1:
            raise ConfigError("train.threads", self.threads, "must be >= 1", "set train.threads: 1, or null")
        if isinstance(self.report_to, str):
            self.report_to = [] if self.report_to in ("none", "") else [self.report_to]
        from captionrl.train.unscored import settings_problem

        problem = settings_problem(self.algorithm, getattr(self, "loss_type", None),
                                   getattr(self, "entropy_coef", None), getattr(self, "use_adaptive_entropy", None))
        if problem is not None:
            raise ConfigError(*problem)
        spg = self.steps_per_generation or self.gradient_accumulation_steps
        gen_batch = self.per_device_train_batch_size * spg
        if gen_batch % self.num_generations:
            raise ConfigError(
                "train.per_device_train_batch_size", self.per_device_train_batch_size,
                f"a generation batch of {gen_batch} completions (per_device_train_batch_size x steps_per_generation) "
                f"cannot hold whole groups of num_generations={self.num_generations}",
                f"use a multiple of {self.num_generations}, e.g. per_device_train_batch_size: {2 * self.num_generations}",
            )

    def trl_class(self) -> type:
        """TRL's config class for ``algorithm`` (RLOOConfig or GRPOConfig)."""
        return _TRL_CLASSES[self.algorithm]


_TRL_CLASSES = trl_settings.trl_classes()
_TRL_SPECS, _TRL_PENDING = trl_settings.trl_fields(_TRL_CLASSES, skip={f.name for f in dataclasses.fields(_CaptionRLTrain)})
TrainConfig = dataclasses.make_dataclass(
    "TrainConfig", _TRL_SPECS, bases=(_CaptionRLTrain,),
    namespace={"__module__": __name__, "__doc__": (
        "How the policy is optimised: captionrl's own settings (algorithm, out_dir, threads, resume, preflight) and "
        "every field of TRL's RLOOConfig / GRPOConfig, with TRL's defaults and help except where "
        "``train.trl_settings`` overrides them (and says why).")},
)


@dataclass
class GRPOTrainConfig(TrainConfig):
    """``TrainConfig`` of the GRPO-only recipes (RubiCap, MoCo Rubric): GRPO by default, and any other
    algorithm refused before ``TrainConfig``'s GRPO-only keys could hide the real cause."""

    algorithm: str = help_field("grpo", "grpo (this recipe trains with GRPO, as its paper does)")

    def __post_init__(self) -> None:
        if self.algorithm != "grpo":
            raise ConfigError("train.algorithm", self.algorithm, "this recipe trains with GRPO (its paper's algorithm)",
                              "set train.algorithm: grpo (use 'captionrl train lineup' for RLOO)")
        super().__post_init__()


def check_memory_plan_mode(mode: str) -> None:
    if mode not in ("refuse", "warn", "off"):
        raise ConfigError("train.memory_plan", mode, "unknown mode", "use refuse (the default), warn or off")


# ---------------------------------------------------------------------- runtime
def apply_threads(threads: int | None) -> None:
    """Set torch's CPU threads when the user asked for a number (never hard-coded: the user knows the box)."""
    if threads is None:
        return
    import torch

    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)


def quiet_offline_env(out_dir: str | Path) -> None:
    """No telemetry pings (the trainer runs offline) and TensorBoard files in a known folder of the run."""
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TENSORBOARD_LOGGING_DIR", str(Path(out_dir) / "tensorboard"))


def probe_servers(servers: Sequence[tuple[BackendConfig, str]]) -> None:
    """Probe each (backend config, config field) a run needs: an OpenAI-compatible server that does not
    answer, or does not serve the named model, stops the run before any model loads. A server that is still
    starting is waited for (``startup_timeout_s``; unset: ``TRAINING_WAIT_S``, 600 s): a training run is
    often started together with its servers (``captionrl.backends.startup``)."""
    from captionrl.backends.startup import TRAINING_WAIT_S, probe_server

    for cfg, field in servers:
        probe_server(cfg, field, default_wait_s=TRAINING_WAIT_S)


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def load_policy(policy: PolicyConfig) -> tuple[Any, Any, bool]:
    """Load the policy model and its processing class; returns (model, processing_class, is_vlm).

    A tokenizer goes to TRL for language-only policies; a ``ProcessorMixin`` switches TRL into its VLM
    path (images from the ``image`` column).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoProcessor, AutoTokenizer

    from captionrl.backends.base import check_model_calls_allowed
    from captionrl.backends.hf import resolve_model_path

    check_model_calls_allowed(f"policy:{policy.model}")
    path, gguf = resolve_model_path(policy.model)
    kw: dict[str, Any] = {"trust_remote_code": policy.trust_remote_code}
    if gguf:
        kw["gguf_file"] = gguf
    check_attn_implementation(policy.attn_implementation)
    from captionrl.devices import record_dtype, resolve_dtype

    dtype, reason = resolve_dtype(policy.dtype, "cuda" if torch.cuda.is_available() else "cpu", training=True)
    record_dtype(f"policy:{policy.model}", dtype, reason)
    config = AutoConfig.from_pretrained(path, **kw)
    is_vlm = hasattr(config, "vision_config")
    if is_vlm:
        from transformers import AutoModelForImageTextToText

        model = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype, **kw, **attn_kw(policy))
        processing = AutoProcessor.from_pretrained(path, **kw)
        tok = processing.tokenizer
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kw, **attn_kw(policy))
        processing = AutoTokenizer.from_pretrained(path, **kw)
        tok = processing
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model, processing, is_vlm


def attn_kw(policy: PolicyConfig) -> dict[str, Any]:
    """``attn_implementation`` for ``from_pretrained`` when the config names one (else transformers chooses)."""
    return {"attn_implementation": policy.attn_implementation} if policy.attn_implementation else {}


def check_attn_implementation(name: str | None) -> None:
    """FlashAttention needs its package: say so before the weights load, with both ways out."""
    import importlib.util

    if name == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        raise ConfigError("policy.attn_implementation", name, "the flash-attn package is not installed",
                          "pip install flash-attn --no-build-isolation (builds against your CUDA torch), or set "
                          "policy.attn_implementation: sdpa (the same attention; PyTorch's own fused kernels)")


def lora_config(policy: PolicyConfig) -> Any:
    """A PEFT ``LoraConfig`` for the policy, or ``None`` for full fine-tuning."""
    if not policy.lora:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=policy.lora_r, lora_alpha=policy.lora_alpha, lora_dropout=policy.lora_dropout,
        target_modules=policy.lora_target_modules, task_type="CAUSAL_LM",
    )


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
    from captionrl.train.callbacks import ResumeShuffleCallback

    trainer = Trainer(
        model=model,
        reward_funcs=list(reward_funcs),
        args=args,
        train_dataset=train_dataset,
        processing_class=processing_class,
        callbacks=[*callbacks, ResumeShuffleCallback()],  # resume keeps the uninterrupted data order
        peft_config=peft_config,
    )
    from captionrl.train.on_policy import reuse_on_policy_logprobs
    from captionrl.train.shared_prefix import share_prompt_forward
    from captionrl.train.timing import install_step_timer
    from captionrl.train.unscored import exclude_unscored

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
        from captionrl.train.callbacks import RewardBoundCallback

        trainer.add_callback(RewardBoundCallback(bound, reward_funcs))
    return trainer


# ---------------------------------------------------------------------- resume
CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


PARTIAL_SUFFIXES = (".tmp", ".partial")
"""A file with one of these endings is a write that never finished (a file is written there, then renamed)."""


def incomplete_reason(checkpoint: Path, required: Sequence[str] = ()) -> str | None:
    """Why ``checkpoint`` is not a complete checkpoint, or ``None`` when it is.

    The Trainer writes ``trainer_state.json`` after the weights, optimizer and RNG states, so a folder
    without it (or with a torn one) was cut by a kill during save; ``required`` names files that callbacks
    write after it (MoCo's ``momentum.pt``), and a leftover ``*.tmp`` file is a write that never finished.
    """
    import json

    state = checkpoint / "trainer_state.json"
    if not state.is_file():
        return "no trainer_state.json (killed while saving?)"
    try:
        json.loads(state.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        return f"trainer_state.json is torn ({exc})"
    missing = [name for name in required if not (checkpoint / name).exists()]
    if missing:
        return f"no {', '.join(missing)} (killed while saving?)"
    partial = sorted(f.name for f in checkpoint.iterdir() if f.name.endswith(PARTIAL_SUFFIXES))
    if partial:
        return f"unfinished file(s) {', '.join(partial)}"
    return None


def last_checkpoint(out_dir: str | Path, required: Sequence[str] = ()) -> Path | None:
    """The most recent complete checkpoint of a run (see :func:`incomplete_reason`).

    Folders left half written by a kill during save are skipped with a message naming each and why, so
    a rerun resumes from the previous complete checkpoint instead of failing on (or silently trusting)
    the torn one.
    """
    folder = Path(out_dir) / "checkpoints"
    if not folder.is_dir():
        return None
    found = []
    for p in folder.iterdir():
        m = CHECKPOINT_RE.match(p.name)
        if not (m and p.is_dir()):
            continue
        reason = incomplete_reason(p, required)
        if reason is None:
            found.append((int(m.group(1)), p))
        elif is_main_process():
            logger.warning(f"skipping incomplete checkpoint {p}: {reason}")
    return max(found)[1] if found else None


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


RUN_FOLDER = "<run folder>"
"""What a path inside the run folder is compared as: the folder's own place does not change the run."""


def folder_relative(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``flat`` (a flattened config) with ``train.out_dir`` dropped and every path inside it written relative
    to it. Why: a run folder that was copied or moved (a warm start reused by a run with another verifier
    dtype, a run folder synced from another machine) holds the same run; its absolute paths alone must not
    refuse the resume."""
    out = dict(flat)
    root = out.pop("train.out_dir", None)
    if not isinstance(root, str) or not root:
        return out
    prefix = str(Path(root)).rstrip("/") + "/"
    return {k: RUN_FOLDER + "/" + v[len(prefix):] if isinstance(v, str) and v.startswith(prefix) else v
            for k, v in out.items()}


def config_differences(saved: Mapping[str, Any], current: Mapping[str, Any],
                       safe: Sequence[str] = RESUME_SAFE_KEYS,
                       defaults: Mapping[str, Any] | None = None) -> list[tuple[str, Any, Any]]:
    """(key, saved, current) for every setting that differs, except those safe to change on resume, and
    settings the saved config predates that are at their default now (``defaults``: a new setting's default
    keeps the behaviour the run was started with, so a run saved by an older captionrl still resumes).
    The run folder's own place is not compared (``folder_relative``): a copied folder resumes."""
    a, b = folder_relative(flatten(saved)), folder_relative(flatten(current))
    born_later = flatten(defaults or {})
    diffs = []
    for key in sorted(set(a) | set(b)):
        if any(key == s or key.startswith(s + ".") for s in safe):
            continue
        if key not in a and key in born_later and b.get(key) == born_later[key]:
            continue
        va, vb = a.get(key, "(absent)"), b.get(key, "(absent)")
        if isinstance(va, float) and isinstance(vb, float) and math.isclose(va, vb):
            continue
        if va != vb:
            diffs.append((key, va, vb))
    return diffs


def default_settings(cfg: Any) -> dict[str, Any]:
    """The defaults of ``cfg``'s config class as a nested mapping (empty when the class has required fields)."""
    try:
        return to_dict(type(cfg)())
    except (TypeError, ConfigError):
        return {}


def prepare_run_dir(cfg: Any, out_dir: str | Path, resume: str, required: Sequence[str] = ()) -> Path | None:
    """Check the run folder before anything loads; save the config; return the checkpoint to resume from.

    A folder with checkpoints is resumed only when its saved ``config.yaml`` matches ``cfg`` (apart from
    ``RESUME_SAFE_KEYS``); otherwise the user is told which settings differ and how to proceed.
    ``required``: files a complete checkpoint of this recipe holds besides the Trainer's own.
    """
    import yaml

    from captionrl.config import save_config

    out = Path(out_dir)
    ckpt = last_checkpoint(out, required)
    saved_path = out / "config.yaml"
    current = to_dict(cfg)
    if ckpt is not None:
        if resume == "off":
            raise ConfigError("train.out_dir", str(out), f"already holds checkpoints ({ckpt.name}) and train.resume is off",
                              "choose a new train.out_dir, or set train.resume: auto to continue that run")
        if saved_path.exists():
            saved = yaml.safe_load(saved_path.read_text()) or {}
            diffs = config_differences(saved, current, defaults=default_settings(cfg))
            if diffs:
                shown = "; ".join(f"{k}: saved {va!r}, now {vb!r}" for k, va, vb in diffs[:12])
                raise ConfigError(
                    "train.out_dir", str(out),
                    f"holds a run with a different config ({len(diffs)} setting(s) differ: {shown})",
                    "rerun with the saved settings (see config.yaml there) to resume, or choose a new train.out_dir",
                )
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, saved_path)
    return ckpt


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


# ---------------------------------------------------------------------- commands
def backend_config(value: Any, field: str) -> BackendConfig:
    """A ``BackendConfig`` from a mapping in a run config, with errors that name the config field."""
    from captionrl.backends import BackendConfig
    from captionrl.config import from_dict

    if isinstance(value, BackendConfig):
        return value
    return from_dict(BackendConfig, value or {}, prefix=field + ".")


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
