"""The ``policy`` and ``train`` sections every RL recipe's config holds.

The train section (``TrainConfig``) is TRL's RLOOConfig / GRPOConfig fields plus captionrl's own settings;
``train.run.trl_settings`` builds it and holds our deliberate defaults. Every knob on which RLOO and GRPO
disagree is resolved to a value in our config when it loads, so the saved config says exactly what ran.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from captionrl.config import help_field
from captionrl.errors import ConfigError
from captionrl.train.run import trl_settings
from captionrl.train.run.freezing import check_freeze_layers

if TYPE_CHECKING:
    from captionrl.backends import BackendConfig


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
        from captionrl.train.run.unscored import settings_problem

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
        "``train.run.trl_settings`` overrides them (and says why).")},
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


def backend_config(value: Any, field: str) -> BackendConfig:
    """A ``BackendConfig`` from a mapping in a run config, with errors that name the config field."""
    from captionrl.backends import BackendConfig
    from captionrl.config import from_dict

    if isinstance(value, BackendConfig):
        return value
    return from_dict(BackendConfig, value or {}, prefix=field + ".")
