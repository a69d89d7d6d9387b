"""``train lineup``'s configuration: a LineupRL run is fully described by its YAML plus overrides.

The ``reward`` section is the reward's one spelling (``rewards.spec.RewardSpec``), shared with the reward
service and the engine adapters; the other sections are the policy, the verifier, the lineups (``data``),
TRL's trainer settings (``train``) and the held-out evaluation at the end (``eval``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from captionrl.backends import BackendConfig
from captionrl.config import help_field
from captionrl.domains.lineup_data import LineupDataConfig
from captionrl.errors import ConfigError
from captionrl.rewards.spec import SERIES_FAMILIES, RewardSpec, SeriesPrint
from captionrl.train.run.sections import PolicyConfig, TrainConfig, backend_config
from captionrl.train.warm_start import WarmStartConfig


@dataclass
class LineupEvalConfig:
    """The held-out evaluation run at the end of training."""

    enabled: bool = help_field(True, "evaluate the trained captioner on the held-out test items")
    directions: list[str] = help_field(["c2s"], "identification directions: c2s and/or s2c")
    modes: list[str] | None = help_field(None, "verifier modes (null = the training reward's mode)")
    compare_initial: bool = help_field(True, "also caption the test items with the untrained policy, as a baseline row")
    controls: bool = help_field(True, "also score the empty-caption and shuffled-caption controls under every verifier (they must sit at chance; false saves their verifier calls, two thirds of the held-out identification's with compare_initial, and changes no final check)")
    verifiers: dict[str, Any] = help_field({}, "name -> evaluation verifier that took no part in training: claims:rules (code-checked claims, offline, no model), a backend spec (openai:URL#MODEL) or a backend config mapping; the training verifier is scored too (train_verifier), in its own column and never in the mean")
    train_verifier: bool = help_field(True, "also score the test items under the training verifier, in its own column (c2s[train]) and never in the mean; false skips its forward passes (most of the final identification's time with a model verifier) when that column carries no information, as in the main job, where the initial model already scores near 1.0")
    final_checks: bool = help_field(True, "checks the captioner was not trained on: span audit, what the captions describe (direction, extrema, key facts, degenerate share), transcription, full stops, clipped ratio, identification apart from the training verifier, and the one-line verdict against the model RL started from (the warm start, else the initial model), the initial model as a second reference")
    bottleneck: bool = help_field(False, "also the caption-only reconstruction bottleneck against the reference models and controls (loads a text encoder)")

    def __post_init__(self) -> None:
        for d in self.directions:
            if d not in ("c2s", "s2c"):
                raise ConfigError("eval.directions", d, "unknown direction", "use c2s and/or s2c")
        for name, value in self.verifiers.items():  # validated now, before any model loads
            eval_verifier(value, f"eval.verifiers.{name}")
        if self.enabled and not self.train_verifier and not self.verifiers:
            raise ConfigError("eval.train_verifier", False, "no verifier would score the test items",
                              "name one in eval.verifiers (e.g. claims: claims:rules) or set eval.train_verifier=true")


@dataclass
class LineupConfig:
    """A LineupRL run: fully described by its YAML plus overrides, saved as out_dir/config.yaml."""

    seed: int = help_field(0, "one seed for everything: item sampling, distractors, shuffling, sampling of captions")
    seeds: list[int] | str | int = help_field([], "train once per seed (e.g. seeds=0,1,2 or seeds=3) into train.out_dir/seed-N and report the spread over seeds (seeds.md); empty: one run with `seed`")
    check: bool = help_field(False, "validate the config and the data, then stop (loads no model)")
    policy: PolicyConfig = field(default_factory=PolicyConfig, metadata={"help": "the captioner being trained"})
    verifier: BackendConfig = field(default_factory=BackendConfig, metadata={"help": "the frozen verifier behind the reward"})
    data: LineupDataConfig = field(default_factory=LineupDataConfig, metadata={"help": "series, windows, candidate sets"})
    reward: RewardSpec = field(default_factory=RewardSpec, metadata={"help": "the reward (the same section as the reward service's and the engine adapters'): family, identification scoring, shaping, the lost-reward bound"})
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig, metadata={"help": "supervised fine-tuning on the describer's captions of the training windows before RL (off by default, as the paper)"})
    train: TrainConfig = field(default_factory=TrainConfig, metadata={"help": "TRL trainer settings"})
    eval: LineupEvalConfig = field(default_factory=LineupEvalConfig, metadata={"help": "held-out evaluation at the end"})

    def __post_init__(self) -> None:
        from captionrl.train.run.seeds import parse_seeds

        self.seeds = parse_seeds(self.seeds)
        if self.train.seed is None:
            self.train.seed = self.seed
        if self.reward.family not in SERIES_FAMILIES:
            raise ConfigError("reward.family", self.reward.family, "train lineup captions series; this family judges "
                              "images (captionrl train rubicap trains it)", f"use one of {', '.join(SERIES_FAMILIES)}")
        if self.warm_start.enabled and self.policy.lora:
            raise ConfigError("warm_start.epochs", self.warm_start.epochs, "the warm start fine-tunes every weight and "
                              "policy.lora trains adapters", "set policy.lora: false, or warm_start.epochs: 0")
        if self.warm_start.enabled and self.policy.input == "chart":
            raise ConfigError("warm_start.epochs", self.warm_start.epochs, "the warm start teaches a captioner that "
                              "reads numbers, and policy.input is chart", "set warm_start.epochs: 0, or policy.input: numbers")

    def series_print(self) -> SeriesPrint:
        """How the verifier prints the candidates: as the policy's prompt prints its series (``data``)."""
        return SeriesPrint(precision=self.data.precision, normalise=self.data.normalise)

    def instruction(self) -> str:
        """The captioning instruction the policy reads (``data.instruction``, or the default one)."""
        from captionrl.domains.captioning import CAPTION_INSTRUCTION

        return self.data.instruction or CAPTION_INSTRUCTION

    def identify_config(self) -> Any:
        """The training reward's identification settings (its scoring; series printed as the data says)."""
        return self.reward.identify_config(self.data.precision, self.data.normalise)


def eval_verifier(value: Any, field: str) -> Any:
    """One ``eval.verifiers`` entry: a ``ClaimsVerifier`` for ``claims:...``, else a ``BackendConfig`` (from a
    spec string such as ``openai:URL#MODEL`` or a mapping)."""
    from captionrl.judges.claims_verifier import is_claims_spec, parse_claims_spec

    if is_claims_spec(value):
        return parse_claims_spec(value, field)
    if isinstance(value, str):
        from captionrl.backends import parse_backend_spec

        try:
            return parse_backend_spec(value)
        except ConfigError as exc:
            raise ConfigError(field, value, f"is not a verifier spec ({exc.problem})",
                              "write claims:rules, openai:http://HOST:PORT/v1#MODEL or a backend mapping") from exc
    return backend_config(value, field)


def eval_backends(cfg: LineupConfig) -> list[tuple[BackendConfig, str]]:
    """The evaluation verifiers that are model backends (servers to probe before anything loads)."""
    out = []
    for name, value in cfg.eval.verifiers.items():
        v = eval_verifier(value, f"eval.verifiers.{name}")
        if isinstance(v, BackendConfig):
            out.append((v, f"eval.verifiers.{name}"))
    return out
