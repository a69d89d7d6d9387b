"""``captionrl train moco``: MoCo Rubric RL, and the EvoLM baseline (``method: evolm``).

MoCo Rubric (paper §3.3): GRPO updates the Policy only. For each group of G captions the Generator
writes a rubric from the image, two references and a seeded subset of 4 current captions, and a
text-only Judge scores all G captions against it (``judges.online_rubric``). Generator and Judge are
served by the *momentum* model, an EMA of the Policy (``captionrl.momentum``): with a LoRA Policy the
``momentum`` adapter on the same base weights, otherwise a full copy. Both decode under their JSON schemas
(the rubric and the judgment schema of ``judges.roles``; ``backends.structured``), and the backend that
serves a role is named after its weights (``served_by``: ``momentum:adapter=momentum``), so each rubric
record's ``source`` says which weights wrote it. One switch, ``momentum.variant``,
runs the paper's ablations (joint, generator_only, judge_only, full_sync, frozen); ``momentum.m`` and
``momentum.interval`` (H) are checked against TRL's reward interval, so the momentum never changes
inside a generation batch whose rewards were already computed. ``MomentumCallback`` applies the EMA
after optimizer steps, logs the Policy-momentum relative L2 distance and the Policy's and the momentum's
distance to their initial weights (Figure 4: ``momentum/policy_to_initial``, ``momentum/momentum_to_initial``
and their ``_l2`` twins) and checkpoints the momentum with every trainer checkpoint (resume keeps the
lagged Generator-Judge). ``momentum.init: separate`` (Table 3) starts the momentum from another checkpoint
(``momentum.init_from``) instead of the Policy.

Logged every step (``metrics.jsonl``, TensorBoard) and drawn into ``curves.png`` at the end: mean reward,
TRL's fraction of zero-std groups, momentum distance, rubric size, the rubric weight mix, and how groups
got their rubric (generator-valid / facts-fallback / unscored). One record per group goes to
``rubrics.rank<R>.jsonl`` (subset and its seed, Generator replies, rubric, scores).

EvoLM (appendix A.2.2, ``method: evolm``): phases alternate ``evolm.policy_steps`` Policy updates and
``evolm.generator_steps`` Generator updates, both GRPO, with two TRL trainers sharing one model (the
shared-SFT initialisation plays both roles) and a fixed Judge (a frozen copy of the initial model).
The Policy's reward is the online rubric of the *current* Generator; the Generator's reward for a rubric
is ``judge_weight * (mean Judge score of the current captions - mean score of the captions from
policy_steps updates earlier) + format_weight * (rubric parses)``. Simplifications, stated: each phase
builds a fresh trainer (Adam moments restart per phase), and an interrupted run resumes at the last
completed phase (``evolm/state.pt`` + ``evolm/phases.jsonl``), redoing the phase it was in. EvoLM runs on
the shared skeleton (``EvolmRecipe``): only its training step (the phases) and its save are its own.

Multi-process note: a reward function sees only its own process's completions; a group split across
processes gets one rubric per part, from that part's captions.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from captionrl.config import help_field
from captionrl.domains.image_data import ImageDataConfig, ImageLoadResult, load_image_items
from captionrl.errors import ConfigError, DataError
from captionrl.judges.online_rubric import (
    OnlineRubricConfig,
    RoleServer,
    choose_subset,
    fixed_roles,
    moco_judge_factory,
    parse_generator_reply,
    rubric_stats,
    stable_int,
)
from captionrl.judges.roles import generator_messages, policy_messages
from captionrl.judges.rubric import RubricJudge, RubricJudgeSettings
from captionrl.momentum import VARIANTS, MomentumSettings, reward_interval_steps
from captionrl.rewards.bound import RewardBound, RewardHealth
from captionrl.rewards.reward import Reward, build_reward
from captionrl.rewards.shaping import ShapingConfig
from captionrl.rewards.spec import RewardSpec, RubricFamilyConfig
from captionrl.rewards.trl_face import RewardFunction, completion_text
from captionrl.train.run import builder, loading
from captionrl.train.run.sections import GRPOTrainConfig, PolicyConfig
from captionrl.train.run.skeleton import Recipe, Run, run_summary, train

logger = logging.getLogger(__name__)

METHODS = ("moco", "evolm")
INITS = ("shared", "separate")
CURVE_KEYS = ("reward", "frac_reward_zero_std", "momentum/distance", "momentum/policy_to_initial",
              "momentum/momentum_to_initial", "rubric/size", "rubric/weight1_frac",
              "rubric/weight2_frac", "rubric/weight3_frac", "rubric/unscored_groups_frac", "rubric/fallback_frac",
              "rubric/generator_valid_frac")
EVOLM_KEYS = ("reward", "frac_reward_zero_std", "rubric/size", "rubric/unscored_groups_frac",
              "generator/reward", "generator/evolm/format_valid", "generator/evolm/score_gain")


# ---------------------------------------------------------------------- config
@dataclass
class MocoDataConfig(ImageDataConfig):
    """Training images (``ImageDataConfig``). Synthetic scenes (the offline default) know their facts, so the
    facts fallback and evaluation can check captions; every image needs two references (A.1.2), so
    ``min_references`` defaults to 2. ``n_train`` is the older name of ``n``."""

    n: int | None = help_field(16, "training images: a seeded sample (null = all usable; more than exist is an error naming both numbers)")
    min_references: int = help_field(2, "reference captions an image must have: the Generator reads two (A.1.2)")
    n_train: int | None = help_field(None, "older name of data.n")

    def __post_init__(self) -> None:
        if self.n_train is not None:
            if self.n_train < 1:
                raise ConfigError("data.n_train", self.n_train, "must be >= 1", "set data.n: 16")
            self.n, self.n_train = self.n_train, None
        self.check_image_data()
        if self.min_references < 2:
            raise ConfigError("data.min_references", self.min_references, "MoCo's Generator reads two references per image",
                              "set data.min_references: 2 (or more), and give each image two captions")


@dataclass
class MocoJudgeConfig(RubricJudgeSettings):
    """The text-only Judge (A.1.3) and how its criterion decisions are read."""

    mode: str = help_field("generate", "generate (the paper: reason + yes/no JSON per criterion), choose (p(yes) per criterion from one forward pass: small models) or likelihood")
    max_new_tokens: int = help_field(512, "longest Judge reply (generate mode)")

    def factory(self, backend: Any) -> RubricJudge:
        """The Judge on a served backend (``judges.online_rubric.moco_judge_factory``: EvoLM's fixed Judge)."""
        return moco_judge_factory(self)(backend)


@dataclass
class MocoMomentumConfig:
    """The EMA Generator-Judge (paper §3.3-3.4, Tables 4-5)."""

    m: float = help_field(0.99, "EMA coefficient m: phi <- m*phi + (1-m)*theta")
    interval: int = help_field(1, "H: EMA every H optimizer steps; must be a multiple of TRL's reward interval")
    variant: str = help_field("joint", "joint | generator_only | judge_only | full_sync | frozen")
    implementation: str = help_field("auto", "auto (LoRA adapter for a LoRA Policy, full copy otherwise), lora_adapter or full_copy")
    init: str = help_field("shared", "shared (the paper: the momentum starts as the Policy, the shared multi-role SFT checkpoint) or separate (Table 3 ablation: the momentum starts from momentum.init_from, e.g. a Generator-Judge SFT trained apart from a caption-only SFT Policy)")
    init_from: str | None = help_field(None, "init separate: the momentum's starting checkpoint, same architecture as the Policy: a model folder (momentum.implementation: full_copy when the Policy is LoRA) or a LoRA adapter folder (adapter_config.json) for a LoRA momentum")

    def __post_init__(self) -> None:
        if self.implementation not in ("auto", "lora_adapter", "full_copy"):
            raise ConfigError("momentum.implementation", self.implementation, "unknown implementation",
                              "use auto, lora_adapter or full_copy")
        if self.init not in INITS:
            raise ConfigError("momentum.init", self.init, f"unknown initialisation (choices: {', '.join(INITS)})",
                              "use momentum.init: shared (the paper) or separate with momentum.init_from: PATH")
        if self.init == "separate" and not self.init_from:
            raise ConfigError("momentum.init_from", self.init_from, "momentum.init: separate needs the momentum's starting checkpoint",
                              "set momentum.init_from: a model or LoRA adapter folder of the Policy's architecture")
        if self.init == "shared" and self.init_from:
            raise ConfigError("momentum.init_from", self.init_from, "is only read with momentum.init: separate",
                              "set momentum.init: separate, or remove momentum.init_from")

    def settings(self, reward_interval: int | None) -> MomentumSettings:
        return MomentumSettings(m=self.m, interval=self.interval, variant=self.variant, reward_interval=reward_interval)


@dataclass
class EvolmConfig:
    """The EvoLM baseline (appendix A.2.2): alternating Policy and Generator GRPO phases."""

    policy_steps: int = help_field(50, "Policy updates per phase (the paper: 50)")
    generator_steps: int = help_field(50, "Generator updates per phase (the paper: 50)")
    judge_weight: float = help_field(0.7, "weight of the Judge-score difference (current - earlier captions) in the Generator reward")
    format_weight: float = help_field(0.3, "weight of format validity (the rubric parses) in the Generator reward")
    generator_num_generations: int = help_field(4, "rubrics sampled per item in the Generator's GRPO groups")
    n_captions: int = help_field(4, "Policy captions per item snapshotted after each Policy phase (current vs earlier)")

    def __post_init__(self) -> None:
        for name in ("policy_steps", "generator_steps", "n_captions"):
            if getattr(self, name) < 1:
                raise ConfigError(f"evolm.{name}", getattr(self, name), "must be >= 1", f"set evolm.{name}: 50")
        if self.generator_num_generations < 2:
            raise ConfigError("evolm.generator_num_generations", self.generator_num_generations, "must be >= 2",
                              "set evolm.generator_num_generations: 4")


@dataclass
class MocoTrainConfig(GRPOTrainConfig):
    """GRPO settings with MoCo Rubric's own run folder."""

    out_dir: str = help_field("runs/moco", "run folder: checkpoints, metrics, rubric records, curves, final model; rerunning with the same folder resumes")


@dataclass
class MocoConfig:
    """A MoCo Rubric (or EvoLM) run: its YAML plus overrides, saved as out_dir/config.yaml."""

    seed: int = help_field(0, "one seed: subsets, retries, shuffling, caption sampling")
    method: str = help_field("moco", "moco (momentum Generator-Judge) or evolm (alternating Policy/Generator GRPO, fixed Judge)")
    check: bool = help_field(False, "validate the config and build the data, then stop (loads no model)")
    policy: PolicyConfig = field(default_factory=PolicyConfig, metadata={"help": "the captioner (a VLM; the shared-SFT checkpoint in the paper)"})
    data: MocoDataConfig = field(default_factory=MocoDataConfig, metadata={"help": "training images"})
    rubric: OnlineRubricConfig = field(default_factory=OnlineRubricConfig, metadata={"help": "online rubric generation"})
    judge: MocoJudgeConfig = field(default_factory=MocoJudgeConfig, metadata={"help": "the text-only Judge"})
    momentum: MocoMomentumConfig = field(default_factory=MocoMomentumConfig, metadata={"help": "momentum Generator-Judge (method moco)"})
    evolm: EvolmConfig = field(default_factory=EvolmConfig, metadata={"help": "EvoLM phases (method evolm)"})
    reward: RewardBound = field(default_factory=RewardBound, metadata={"help": "lost-reward bound: the run stops, saved, when the rubric reward stays unscored (or on the facts fallback) too long"})
    train: MocoTrainConfig = field(default_factory=MocoTrainConfig, metadata={"help": "TRL GRPO settings"})

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError("method", self.method, "unknown method", "use moco or evolm")
        if self.train.seed is None:
            self.train.seed = self.seed
        if self.rubric.group_size is None:
            self.rubric.group_size = self.train.num_generations
        elif self.rubric.group_size != self.train.num_generations:
            raise ConfigError("rubric.group_size", self.rubric.group_size,
                              f"differs from train.num_generations ({self.train.num_generations})",
                              "leave rubric.group_size null (it follows G)")
        if self.method == "moco":
            if self.momentum.variant not in VARIANTS:
                self.momentum.settings(None)  # raises with close matches
            self.momentum.settings(self.reward_interval())  # validates H against the reward interval
        if self.method == "moco" and self.momentum.init == "separate":
            self._check_init_from()
        if self.method == "evolm" and self.train.max_steps < 1:
            raise ConfigError("train.max_steps", self.train.max_steps, "EvoLM counts Policy updates",
                              "set train.max_steps (e.g. 600 = 12 phases of 50)")

    def _check_init_from(self) -> None:
        """The separate checkpoint must fit the momentum's implementation (before any model loads)."""
        path = Path(str(self.momentum.init_from))
        if not path.exists():
            raise ConfigError("momentum.init_from", str(path), "not found",
                              "give a local model folder or LoRA adapter folder (e.g. a 'train moco-sft' model/ folder)")
        adapter = (path / "adapter_config.json").is_file()
        impl = self.momentum.implementation
        lora_momentum = impl == "lora_adapter" or (impl == "auto" and self.policy.lora)
        if adapter and not lora_momentum:
            raise ConfigError("momentum.init_from", str(path), "is a LoRA adapter, but the momentum is a full model copy",
                              "use a LoRA Policy (policy.lora: true) with momentum.implementation auto, or give a full model folder")
        if not adapter and lora_momentum:
            raise ConfigError("momentum.init_from", str(path), "is a full model, but the momentum is a LoRA adapter on the Policy's own base weights",
                              "set momentum.implementation: full_copy (the separate model's own weights), or give a LoRA adapter folder")

    def reward_spec(self) -> RewardSpec:
        """MoCo's reward as the one reward spec: the rubric family (its rubrics written online per group, see
        ``online_rubric_reward``) decided under the Judge's settings (``judge``), on image captions, with no
        shaping term and this run's lost-reward bound (``reward``)."""
        judge = {f.name: getattr(self.judge, f.name) for f in dataclasses.fields(RubricJudgeSettings)}
        return RewardSpec(family="rubric", subject="image", rubric=RubricFamilyConfig(**judge),
                          **dataclasses.asdict(self.reward), **ShapingConfig.OFF)

    def reward_interval(self) -> int:
        t = self.train
        return reward_interval_steps(t.steps_per_generation or t.gradient_accumulation_steps, t.num_iterations,
                                     t.gradient_accumulation_steps)


# ---------------------------------------------------------------------- data
def load_items(cfg: MocoConfig) -> ImageLoadResult:
    """The configured images, validated before any model loads (``domains.image_data``)."""
    return load_image_items(cfg.data, seed=cfg.seed)


def build_rows(cfg: MocoConfig, loaded: ImageLoadResult | None = None) -> list[dict[str, Any]]:
    """Dataset rows: Policy prompt (image placeholder), image, item id, the first two references, facts (JSON).

    Scenes and embedded images are decoded now (PIL); file images stay paths and become a lazily decoded
    ``Image`` column (``MocoRecipe.train_dataset``)."""
    loaded = loaded if loaded is not None else load_items(cfg)
    rows = []
    for it in loaded.items:
        rows.append({
            "prompt": policy_messages(with_images=True),
            "image": str(it.image) if isinstance(it.image, (str, Path)) else it.load(),
            "item_id": str(it.id),
            "references": list(it.references[:2]),
            "facts": json.dumps(list(it.facts)),
        })
    return rows


def rows_dataset(rows: Sequence[Mapping[str, Any]]) -> Any:
    """Rows as a ``datasets.Dataset``; file paths become a lazily decoded RGB ``Image`` column."""
    import datasets

    ds = datasets.Dataset.from_list(list(rows))
    if rows and isinstance(rows[0]["image"], str):
        ds = ds.cast_column("image", datasets.Image(mode="RGB"))
    return ds


# ---------------------------------------------------------------------- roles and reward
@contextlib.contextmanager
def _rng_untouched() -> Iterator[None]:
    """Rubric sampling must not shift the Policy's sampling stream (seeded retries reseed torch)."""
    import torch

    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        yield


def served_by(momentum: Any, role: str) -> str:
    """Which weights play ``role``: ``momentum:adapter=<name>`` (LoRA: the adapter switched on for the
    request) or ``momentum:copy=<slot>`` (a full copy: ``ema``, or ``frozen`` for the one-sided variants).
    It names the backend, so every rubric record's ``source`` says which weights wrote that rubric."""
    if hasattr(momentum, "adapter_for"):
        return f"momentum:adapter={momentum.adapter_for(role)}"
    return f"momentum:copy={momentum.settings.slot_for(role)}"


def momentum_roles(box: Mapping[str, Any], processing: Any, batch_size: int = 8) -> RoleServer:
    """Serve each role from the momentum model (``box["momentum"]``, set once the trainer exists); the
    backend's name is ``served_by`` (one backend per model and weights, so compiled grammars are reused)."""
    from captionrl.backends.hf import HFBackend

    cache: dict[tuple[int, str], Any] = {}

    @contextlib.contextmanager
    def serve(role: str) -> Iterator[Any]:
        momentum = box["momentum"]
        label = served_by(momentum, role)
        with momentum.serving(role) as model, _rng_untouched():
            backend = cache.get((id(model), label))
            if backend is None:
                backend = HFBackend.from_model(model, processing, name=label, batch_size=batch_size)
                cache[(id(model), label)] = backend
            yield backend

    return serve


def model_roles(generator_model: Any, judge_model: Any, processing: Any, batch_size: int = 8) -> RoleServer:
    """EvoLM: the shared model (eval mode, no grads) writes rubrics, a frozen copy judges."""
    import torch

    from captionrl.backends.hf import HFBackend

    gen = HFBackend.from_model(generator_model, processing, name="generator", batch_size=batch_size)
    judge = HFBackend.from_model(judge_model, processing, name="fixed-judge", batch_size=batch_size)
    plain = fixed_roles(gen, judge)

    @contextlib.contextmanager
    def serve(role: str) -> Iterator[Any]:
        model = generator_model if role == "generator" else judge_model
        training = model.training
        model.eval()
        try:
            with plain(role) as backend, _rng_untouched(), torch.no_grad():
                yield backend
        finally:
            model.train(training)

    return serve


class MocoReward(RewardFunction):
    """The online rubric judge as a TRL reward: passes the optimizer step (seeds the subsets) and logs the
    rubric diagnostics every call; unscored groups stay ``None``. ``weights`` is entered around each call on
    every rank (``sharding.full_weights``: under ZeRO-3 the momentum roles then generate on gathered weights,
    however many generate calls each rank's groups need)."""

    weights: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext

    def __init__(self, reward: Reward) -> None:
        super().__init__(reward, log_fields=())

    def __call__(self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] = (),
                 completion_ids: Any = None, **kwargs: Any) -> list[float | None]:
        state = kwargs.get("trainer_state")
        kwargs["step"] = [int(state.global_step) if state is not None else -1] * len(completions)
        with self.weights():
            scores = super().__call__(prompts, completions, completion_ids, **kwargs)
        groups = self.judge.last_groups  # type: ignore[attr-defined]
        fallback = [g for g in groups if g.source == "facts-fallback"]
        # a fallback rubric is the item's facts, not the Generator's: the bound stops a run living on them
        self.health.record_fallback(len(groups), len(fallback), "; ".join(fallback[-1].errors[-1:]) if fallback else None)
        log_metric = kwargs.get("log_metric")
        if callable(log_metric):
            for key, value in rubric_stats(groups).items():
                log_metric(key, value)
        return scores


def online_rubric_reward(cfg: MocoConfig, roles: RoleServer, records: Any = None) -> MocoReward:
    """MoCo's reward for TRL: ``cfg.reward_spec()`` built by ``rewards.reward.build_reward`` with the rubrics
    written online by the Generator that ``roles`` serves (``cfg.rubric``), judged by its Judge."""
    return MocoReward(build_reward(cfg.reward_spec(), roles, online=cfg.rubric, records=records, name="moco_rubric"))


def records_path(out: Path, name: str = "rubrics") -> Path:
    return out / f"{name}.rank{os.environ.get('RANK', '0')}.jsonl"


# ---------------------------------------------------------------------- run: MoCo
class MocoRecipe(Recipe):
    """MoCo Rubric in the shared skeleton: images (data.source) as data, the online rubric of the momentum
    Generator-Judge as reward; the momentum is built on the trainer's model and checkpointed with it."""

    curve_keys = CURVE_KEYS
    checkpoint_files = ("momentum.pt",)  # written by MomentumCallback after the Trainer's state: part of a complete checkpoint

    def __init__(self, cfg: MocoConfig, wrap_roles: Callable[[RoleServer], RoleServer] | None = None) -> None:
        super().__init__(cfg)
        self.box: dict[str, Any] = {}
        self.wrap_roles = wrap_roles
        self.records: Any = None
        self.images: ImageLoadResult | None = None
        self.reward: Any = None
        m = cfg.momentum
        self.title = f"MoCo Rubric ({m.variant}, m={m.m}, H={m.interval}{', separate init' if m.init == 'separate' else ''})"

    def dataset(self, run: Run) -> list[dict[str, Any]]:
        self.images = load_items(self.cfg)
        return build_rows(self.cfg, self.images)

    def train_dataset(self, run: Run) -> Any:
        return rows_dataset(run.data)

    def load_policy(self, run: Run) -> None:
        super().load_policy(run)  # 'tiny-vlm' resolves in the hf backend
        if not run.is_vlm:
            raise ConfigError("policy.model", self.cfg.policy.model, "is a language-only model; MoCo Rubric captions images",
                              "use a vision-language model (e.g. a Qwen3-VL folder, or the tiny test VLM of configs/moco-cpu.yaml)")

    def reward_functions(self, run: Run) -> list[Any]:
        from captionrl.records import RecordWriter

        cfg = self.cfg
        self.records = RecordWriter(records_path(run.out))
        roles = momentum_roles(self.box, run.processing)
        if self.wrap_roles is not None:
            roles = self.wrap_roles(roles)
        self.reward = online_rubric_reward(cfg, roles, self.records)
        return [self.reward]

    def build_trainer(self, run: Run) -> Any:
        from captionrl.momentum import build_momentum
        from captionrl.train.run.callbacks import MomentumCallback

        trainer = super().build_trainer(run)
        self.box["momentum"] = build_momentum(trainer.model, self.cfg.momentum.settings(self.cfg.reward_interval()),
                                              self.cfg.momentum.implementation)
        if self.cfg.momentum.init == "separate":
            n = self.box["momentum"].load_initial(separate_state(self.cfg))
            logger.info(f"momentum: separate initialisation from {self.cfg.momentum.init_from} ({n} tensors)")
        MomentumCallback(self.box["momentum"], resume_dir=run.resume_from).attach(trainer)
        from captionrl.train.run.sharding import full_weights

        self.reward.weights = lambda: full_weights(trainer)  # ZeRO-3: the roles read gathered weights
        return trainer

    def preflight(self, run: Run) -> None:
        """Before step 1 (the momentum exists now): the exact-facts reference caption must beat every hacking
        probe under the online rubric of the momentum Generator-Judge (``train.image_checks.moco_preflight``)."""
        from captionrl.train.image_checks import moco_preflight

        moco_preflight(self.cfg, run.data, self.reward.quiet(), run.out, run.trainer.state)

    def close(self, run: Run) -> None:
        if self.records is not None:
            self.records.close()

    def final_evaluation(self, run: Run) -> dict[str, Any]:
        """A check the policy was not trained on: CIDEr-D of its greedy captions against the references."""
        from captionrl.train.image_checks import image_final_checks

        rows = run.data
        refs = {str(r["item_id"]): list(r["references"]) for r in rows}
        checks = image_final_checks(builder.unwrap_for_inference(run.trainer), run.processing, rows, refs,
                                    run.out / "eval", self.cfg.train.max_completion_length, seed=self.cfg.seed)
        return {"final_checks": {"table": str(run.out / "eval" / "final_checks.md"), "rows": checks["rows"]}}

    def summary(self, run: Run) -> dict[str, Any]:
        cfg, momentum = self.cfg, self.box["momentum"]
        steps = max(1, run.trainer.state.global_step - _checkpoint_step(run.resume_from))
        return {"method": "moco", "seconds_per_step": round(run.train_seconds / steps, 2),
                "records": str(self.records.path), "images": self.images.summary() if self.images else None,
                "momentum": {"variant": cfg.momentum.variant, "m": momentum.settings.effective_m,
                             "interval": cfg.momentum.interval, "implementation": type(momentum).__name__,
                             "init": momentum.init, "init_from": cfg.momentum.init_from,
                             "updates": momentum.updates, "final_distance": momentum.distance(),
                             **{f"final_{k.split('/')[1]}": round(v, 6) for k, v in momentum.initial_distances().items()}}}


def separate_state(cfg: MocoConfig) -> dict[str, Any]:
    """The weights ``momentum.init_from`` holds: a LoRA adapter's factors, or a whole model's parameters
    (loaded like the Policy: same dtype)."""
    path = Path(str(cfg.momentum.init_from))
    if (path / "adapter_config.json").is_file():
        from peft import load_peft_weights

        return dict(load_peft_weights(str(path), device="cpu"))
    model, _processing, _vlm = loading.load_policy(dataclasses.replace(cfg.policy, model=str(path), lora=False))
    return dict(model.named_parameters())


def run(cfg: MocoConfig, wrap_roles: Callable[[RoleServer], RoleServer] | None = None) -> dict[str, Any]:
    """Train (MoCo or EvoLM), save, plot; returns what the result file holds, with the step time.
    ``wrap_roles`` wraps the momentum role server (the rehearsal records which weights served each role
    request through it; a wrapper is entered inside the momentum's own serving context)."""
    recipe = EvolmRecipe(cfg) if cfg.method == "evolm" else MocoRecipe(cfg, wrap_roles)
    return train(recipe).result


def _checkpoint_step(ckpt: Path | None) -> int:
    if ckpt is None:
        return 0
    return int(ckpt.name.split("-")[-1])  # last_checkpoint only returns checkpoint-<N> folders


# ---------------------------------------------------------------------- EvoLM
def snapshot_captions(model: Any, processing: Any, rows: Sequence[Mapping[str, Any]], n: int, phase: int,
                      cfg: MocoConfig, writer: Any) -> dict[str, list[str]]:
    """``n`` sampled Policy captions per item after ``phase`` Policy phases (records keyed phase|item|k)."""
    from captionrl.backends.base import ChatRequest
    from captionrl.backends.hf import HFBackend

    todo = [(r, k) for r in rows for k in range(n) if not writer.has(f"{phase}|{r['item_id']}|{k}")]
    if todo:
        backend = HFBackend.from_model(model, processing, name=f"policy-phase{phase}", batch_size=8)
        training = model.training
        model.eval()
        try:
            with _rng_untouched():
                reqs = []
                for r, k in todo:
                    msgs = [{"role": "user", "content": [{"type": "image", "image": r["image"]},
                                                         {"type": "text", "text": r["prompt"][0]["content"][1]["text"]}]}]
                    seed = stable_int(f"{cfg.seed}|{phase}|{r['item_id']}|{k}")
                    reqs.append(ChatRequest(msgs, max_new_tokens=cfg.train.max_completion_length,
                                            temperature=cfg.train.temperature, top_p=cfg.train.top_p, seed=seed))
                gens = backend.generate(reqs)
        finally:
            model.train(training)
        writer.write_many([{"key": f"{phase}|{r['item_id']}|{k}", "phase": phase, "item_id": r["item_id"], "k": k,
                            "caption": g.text or "", "error": g.error, "seed": q.seed}
                           for (r, k), g, q in zip(todo, gens, reqs, strict=True)])
    out: dict[str, list[str]] = {}
    for r in rows:
        out[str(r["item_id"])] = [writer.get(f"{phase}|{r['item_id']}|{k}")["caption"] for k in range(n)]
    return out


class EvolmGeneratorReward:
    """Generator reward (A.2.2): ``judge_weight * (score(current) - score(earlier)) + format_weight * valid``.

    The score of a caption set is the fixed Judge's mean score under the generated rubric. A reply the
    parser *rejects* (``DataError``: no JSON, wrong schema, a copied example) earns 0 for both terms: format
    validity is a verifiable outcome of the Generator's own text, not an outage. Any other failure of the
    parser is ours, not the Generator's, so that sample is unscored (``None``, error kept), never a 0 the
    Generator would learn from; so is a valid rubric the Judge could not score on either caption set.
    """

    __name__ = "evolm_generator"

    def __init__(self, cfg: MocoConfig, roles: RoleServer) -> None:
        self.cfg = cfg
        self.roles = roles
        self.health = RewardHealth("evolm-generator")

    def __call__(self, prompts: Any = None, completions: Sequence[Any] = (), completion_ids: Any = None,
                 **kw: Any) -> list[float | None]:
        rc, ev = self.cfg.rubric, self.cfg.evolm
        texts = [completion_text(c) for c in completions]
        rubrics: list[list[Any] | None] = []
        failed: dict[int, str] = {}  # the parser itself failed: unscored, not an invalid format
        for i, t in enumerate(texts):
            try:
                rubrics.append(parse_generator_reply(t, rc.min_items, rc.max_items))
            except DataError:  # the parser's verdict: the reply is not a valid rubric (format 0)
                rubrics.append(None)
            except ValueError as exc:  # not a verdict on the reply: the parser broke
                rubrics.append(None)
                failed[i] = f"rubric parser failed: {type(exc).__name__}: {exc}"
        out: list[float | None] = []
        gains: list[float] = []
        with self.roles("judge") as backend:
            judge = self.cfg.judge.factory(backend)
            for i, rub in enumerate(rubrics):
                if i in failed:
                    out.append(None)
                    continue
                if rub is None:
                    out.append(0.0)
                    continue
                cur, old = list(kw["current"][i]), list(kw["earlier"][i])
                js = judge.judge(cur + old, {"rubric": [rub] * (len(cur) + len(old))})
                s_cur = _mean_scored(js[: len(cur)])
                s_old = _mean_scored(js[len(cur):])
                if s_cur is None or s_old is None:
                    out.append(None)
                    continue
                gains.append(s_cur - s_old)
                out.append(ev.judge_weight * (s_cur - s_old) + ev.format_weight * 1.0)
        self.health.record(out, list(failed.values()))
        log_metric = kw.get("log_metric")
        if callable(log_metric):
            log_metric("evolm/format_valid", sum(r is not None for r in rubrics) / max(1, len(rubrics)))
            if gains:
                log_metric("evolm/score_gain", float(np.mean(gains)))
        return out


def _mean_scored(js: Sequence[Any]) -> float | None:
    vals = [j.score for j in js if j.scored]
    return float(np.mean(vals)) if vals else None


def generator_rows(cfg: MocoConfig, rows: Sequence[Mapping[str, Any]], current: Mapping[str, list[str]],
                   earlier: Mapping[str, list[str]], phase: int) -> list[dict[str, Any]]:
    """Generator training rows: the MoCo Generator prompt over a seeded subset of the current captions."""
    out = []
    for r in rows:
        item = str(r["item_id"])
        cur = current[item]
        subset = choose_subset(len(cur), cfg.rubric.n_candidates, [cfg.seed, phase, stable_int(item), 0])
        out.append({
            "prompt": generator_messages(r["references"], [cur[i] for i in subset], with_images=True),
            "image": r["image"], "item_id": item, "current": cur, "earlier": list(earlier[item]),
            "subset": subset,
        })
    return out


class EvolmRecipe(MocoRecipe):
    """EvoLM in the shared skeleton: MoCo's data and policy, but trained in phases (``fit``): alternating
    Policy and Generator GRPO trainers on one shared model, the Judge a frozen copy of the initial model.

    What the skeleton keeps: the run folder and its config check, the servers, the data, the policy, the
    curves (``metrics.jsonl`` merged from the phases: Policy steps numbered across phases, Generator metrics
    under ``generator/``), and ``result.json``. What EvoLM replaces: the training step (phases, resumed at the
    last completed one from ``evolm/state.pt`` + ``evolm/phases.jsonl``) and the save (the shared model as it
    stands: no trainer outlives its phase)."""

    title = "EvoLM"
    curve_keys = EVOLM_KEYS
    curve_smooth = 1
    checkpoint_files = ()

    def __init__(self, cfg: MocoConfig) -> None:
        if cfg.train.freeze_layers:  # its phases build their own trainers: the skeleton's freezing never runs here
            raise ConfigError("train.freeze_layers", cfg.train.freeze_layers, "EvoLM's alternating phases train the "
                              "whole shared model", "set train.freeze_layers: 0 with method=evolm")
        super().__init__(cfg)
        self.title = "EvoLM"
        self.writers: list[Any] = []
        self.phases = 0
        self.policy_seconds = 0.0
        self.merged: list[dict[str, Any]] = []

    def fit(self, run: Run) -> None:
        """Alternate Policy and Generator GRPO phases on one shared model; the Judge is a frozen initial copy."""
        import torch

        from captionrl.records import RecordWriter
        from captionrl.train.run.logging import MetricsLog

        cfg, out, processing, rows = self.cfg, run.out, run.processing, run.data
        if cfg.policy.lora:
            from peft import get_peft_model

            run.model = get_peft_model(run.model, loading.lora_config(cfg.policy))  # one adapter, trained by both phases
        model = run.model
        judge_model = copy.deepcopy(model)
        for p in judge_model.parameters():
            p.requires_grad_(False)
        judge_model.eval()
        ev = cfg.evolm
        self.phases = n_phases = math.ceil(cfg.train.max_steps / ev.policy_steps)
        state_path = out / "evolm" / "state.pt"
        phases = RecordWriter(out / "evolm" / "phases.jsonl")
        captions = RecordWriter(out / "evolm" / "captions.jsonl")
        self.records = RecordWriter(records_path(out))
        self.writers = [self.records, captions, phases]
        done = sorted(int(k) for k in phases.done_keys)
        if done and state_path.exists():
            saved = torch.load(state_path, map_location="cpu", weights_only=True)
            model.load_state_dict(saved, strict=False)
            logger.info(f"resuming after EvoLM phase {done[-1]}")
        roles = model_roles(model, judge_model, processing)
        t0 = time.perf_counter()
        earlier = snapshot_captions(model, processing, rows, ev.n_captions, 0, cfg, captions)
        for phase in range(1, n_phases + 1):
            if str(phase) in phases.done_keys:
                earlier = snapshot_captions(model, processing, rows, ev.n_captions, phase, cfg, captions)
                continue
            steps = steps_in(phase, cfg)
            # Policy phase: online rubrics from the current Generator, fixed Judge.
            pcfg = dataclasses.replace(cfg.train, out_dir=str(out / "evolm" / f"phase{phase}-policy"), max_steps=steps,
                                       save_steps=10**9, resume="auto")
            reward = online_rubric_reward(cfg, roles, self.records)
            pt = builder.build_trainer(pcfg, builder.trainer_args(pcfg, seed=int(cfg.train.seed or 0) + phase), model,
                                       processing, [reward], rows_dataset(rows),
                                       callbacks=[MetricsLog(Path(pcfg.out_dir) / "metrics.jsonl")], bound=cfg.reward)
            run.trainer = pt
            tp = time.perf_counter()
            pt.train()
            self.policy_seconds += time.perf_counter() - tp
            current = snapshot_captions(model, processing, rows, ev.n_captions, phase, cfg, captions)
            # Generator phase: rubrics that rank the current captions above those of policy_steps updates ago.
            gcfg = dataclasses.replace(cfg.train, out_dir=str(out / "evolm" / f"phase{phase}-generator"),
                                       max_steps=ev.generator_steps, num_generations=ev.generator_num_generations,
                                       per_device_train_batch_size=ev.generator_num_generations,
                                       steps_per_generation=None, gradient_accumulation_steps=1,
                                       max_completion_length=cfg.rubric.max_new_tokens, save_steps=10**9)
            gt = builder.build_trainer(gcfg, builder.trainer_args(gcfg, seed=int(cfg.train.seed or 0) + 1000 + phase),
                                       model, processing, [EvolmGeneratorReward(cfg, roles)],
                                       rows_dataset(generator_rows(cfg, rows, current, earlier, phase)),
                                       callbacks=[MetricsLog(Path(gcfg.out_dir) / "metrics.jsonl")], bound=cfg.reward)
            run.trainer = gt
            gt.train()
            earlier = current
            state_path.parent.mkdir(parents=True, exist_ok=True)
            trainable = {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad}
            torch.save(trainable, state_path.with_suffix(".pt.tmp"))  # a kill mid-write must not tear the last good state
            os.replace(state_path.with_suffix(".pt.tmp"), state_path)
            phases.write({"key": str(phase), "phase": phase, "policy_steps": steps, "generator_steps": ev.generator_steps})
        run.train_seconds = time.perf_counter() - t0
        run.steps = cfg.train.max_steps
        self.merged = merge_phase_metrics(cfg, out, n_phases)

    def save_model(self, run: Run) -> Path:
        """The shared model as the last phase left it (no trainer outlives its phase)."""
        folder = run.out / "model"
        run.model.save_pretrained(str(folder))
        run.processing.save_pretrained(str(folder))
        return folder

    def is_main_process(self, run: Run) -> bool:
        return builder.is_main_process()

    def final_weights(self, run: Run) -> Any:
        return contextlib.nullcontext()

    def final_evaluation(self, run: Run) -> dict[str, Any]:
        return {}

    def close(self, run: Run) -> None:
        for writer in self.writers:
            writer.close()

    def metrics(self, run: Run) -> list[dict[str, Any]]:
        """The merged phases' entries, Policy and Generator alike (two share a step: no deduplication)."""
        return self.merged

    def summary(self, run: Run) -> dict[str, Any]:
        policy = sum(r["role"] == "policy" for r in self.merged)
        per_step = round(self.policy_seconds / policy, 2) if policy else None
        return {"method": "evolm", "phases": self.phases, "seconds_per_policy_step": per_step,
                "records": str(records_path(run.out)), "images": self.images.summary() if self.images else None}


def merge_phase_metrics(cfg: MocoConfig, out: Path, n_phases: int) -> list[dict[str, Any]]:
    """One ``out/metrics.jsonl`` from the phases' own: Policy steps numbered across phases, Generator metrics
    under ``generator/`` at the step of the Policy phase they follow. Returns the merged entries."""
    from captionrl.records import RecordWriter
    from captionrl.train.run.curves import load_metrics

    merged = []
    for phase in range(1, n_phases + 1):
        offset = (phase - 1) * cfg.evolm.policy_steps
        for rec in load_metrics(out / "evolm" / f"phase{phase}-policy" / "metrics.jsonl"):
            merged.append({**rec, "step": offset + int(rec["step"]), "phase": phase, "role": "policy"})
        for rec in load_metrics(out / "evolm" / f"phase{phase}-generator" / "metrics.jsonl"):
            merged.append({"step": offset + steps_in(phase, cfg), "phase": phase, "role": "generator",
                           **{f"generator/{k}": v for k, v in rec.items() if k != "step"}})
    with RecordWriter(out / "metrics.jsonl") as w:
        w.write_many([{"key": f"{r['role']}|{r['phase']}|{r['step']}|{i}", **r} for i, r in enumerate(merged)])
    return merged


def steps_in(phase: int, cfg: MocoConfig) -> int:
    """Policy steps of ``phase`` (the last phase may be shorter)."""
    return min(cfg.evolm.policy_steps, cfg.train.max_steps - (phase - 1) * cfg.evolm.policy_steps)


# ---------------------------------------------------------------------- command
CONFIG = MocoConfig


def run_command(cfg: MocoConfig) -> int:
    """``captionrl train moco``: check (data only) or train, then print where everything went."""
    if cfg.check:
        loaded = load_items(cfg)
        rows = build_rows(cfg, loaded)
        print(json.dumps({"method": cfg.method, "train_items": len(rows), "reward_interval": cfg.reward_interval(),
                          "images": loaded.summary()}))
        return 0
    result = run(cfg)
    print(run_summary(result, ["model", "curves", "records", "metrics"]))
    step_s = result.get("seconds_per_step") or result.get("seconds_per_policy_step")
    print(f"steps: {result.get('steps')} ({step_s} s/step)")
    return 0
