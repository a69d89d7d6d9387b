"""The ``train`` section of the RL recipes, built from TRL's own config dataclasses.

Every field of ``trl.RLOOConfig`` and ``trl.GRPOConfig`` is a ``train.<field>`` setting, with TRL's type,
default and help text, so nothing TRL declares is copied here and a TRL release cannot leave a stale
default behind. This module declares only what is captionrl's:

- ``OVERRIDES``: the defaults we choose deliberately where TRL's do not fit (each with the reason, shown
  in ``--help``); a user's YAML still wins over them;
- ``ALGORITHM_DEFAULTS``: the knobs on which RLOO and GRPO disagree, resolved to an explicit value so the
  saved config says what ran;
- ``FORCED``: values a run cannot work without (the reward functions read the dataset's other columns);
- ``SET_BY_CAPTIONRL``: TRL fields the recipe fills itself (the checkpoint folder, the reward weights).

A field that exists in only one of the two TRL classes (``loss_type`` is GRPO's, ``normalize_advantages``
RLOO's) defaults to null and resolves to that class's default when its algorithm runs; setting it under the
other algorithm is an error that names it. TRL itself validates the values when ``trainer_args`` builds its
config.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from collections.abc import Mapping
from typing import Any

from captionrl.errors import ConfigError

ALGORITHMS = ("rloo", "grpo")
TRL_CLASS_NAMES = {"rloo": "RLOOConfig", "grpo": "GRPOConfig"}

# captionrl's defaults where TRL's do not fit this project (name -> (value, why)); the user's YAML wins.
OVERRIDES: dict[str, tuple[Any, str]] = {
    "num_generations": (4, "G = 4 captions per series: RLOO's 2 gives a one-sample baseline, GRPO's 8 is slow on CPU"),
    "num_train_epochs": (1.0, "one pass over the training items unless max_steps says otherwise"),
    "lr_scheduler_type": ("constant", "a short RL run with a constant rate, as the papers train"),
    "max_completion_length": (64, "a caption is short; TRL's default is sized for reasoning traces"),
    "save_steps": (50, "checkpoint often: resume restarts from the last one and selection reads them all"),
    "logging_steps": (1, "every step's reward is in metrics.jsonl and the curves"),
    "report_to": (["tensorboard"], "TensorBoard files in the run folder; [] for none"),
    "disable_dropout": (True, "RL log-prob ratios must not be noised by dropout"),
}

# The knobs on which TRL's RLOO and GRPO disagree, set explicitly so a TRL upgrade cannot move them.
ALGORITHM_DEFAULTS: dict[str, dict[str, Any]] = {
    # RLOO as in the LineupRL paper (and Ahmadian et al.): leave-one-out baseline, KL in the reward.
    "rloo": {"beta": 0.05, "normalize_advantages": False},
    # GRPO as TRL 1.16 ships it: no KL term, DAPO token-level loss, rewards scaled by the group std.
    "grpo": {"beta": 0.0, "loss_type": "dapo", "scale_rewards": "group"},
}

FORCED: dict[str, tuple[Any, str]] = {
    "remove_unused_columns": (False, "reward functions read the dataset's other columns (series, candidates, ...)"),
}

SET_BY_CAPTIONRL = {"output_dir": "train.out_dir (checkpoints/ inside it)",
                    "reward_weights": "the recipe (one weight per reward function)"}


def trl_classes() -> dict[str, type]:
    """``{"rloo": RLOOConfig, "grpo": GRPOConfig}`` (imports TRL)."""
    import trl

    return {algo: getattr(trl, name) for algo, name in TRL_CLASS_NAMES.items()}


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # an unresolvable annotation: keep the raw one (values pass unchanged)
        return {f.name: f.type for f in dataclasses.fields(cls)}


def _plain(value: Any) -> Any:
    """A default as the saved YAML can hold it (TRL's enum defaults become their string values)."""
    return value.value if isinstance(value, enum.Enum) else value


def default_of(f: dataclasses.Field[Any]) -> Any:
    """The default a TRL field takes when it is not given."""
    if f.default is not dataclasses.MISSING:
        return _plain(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return _plain(f.default_factory())
    return dataclasses.MISSING


def _optional(tp: Any) -> Any:
    return tp if type(None) in typing.get_args(tp) else tp | None


def trl_fields(classes: Mapping[str, type], skip: set[str]) -> tuple[list[tuple[str, Any, Any]], dict[str, dict[str, Any]]]:
    """The ``make_dataclass`` field specs of every TRL setting of ``classes``, and per algorithm the defaults
    left to resolve (fields whose default is not the same in every class: they start as null here)."""
    per_class = {algo: {f.name: f for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")}
                 for algo, cls in classes.items()}
    hints = {algo: _hints(cls) for algo, cls in classes.items()}
    names: list[str] = []
    for fs in per_class.values():
        names.extend(n for n in fs if n not in names)
    specs: list[tuple[str, Any, Any]] = []
    pending: dict[str, dict[str, Any]] = {algo: {} for algo in classes}
    for name in names:
        if name in skip or name in SET_BY_CAPTIONRL:
            continue
        owners = [a for a in classes if name in per_class[a]]
        first = per_class[owners[0]][name]
        tp = hints[owners[0]].get(name, first.type)
        help_text = str(first.metadata.get("help", "")).strip()
        defaults = {a: default_of(per_class[a][name]) for a in owners}
        algo_set = {a for a in owners if name in ALGORITHM_DEFAULTS[a]}
        if name in FORCED:
            value, why = FORCED[name]
            meta = {"help": f"{help_text} [captionrl: always {value!r}: {why}]"}
            specs.append((name, tp, dataclasses.field(default=value, metadata=meta)))
        elif name in OVERRIDES:
            value, why = OVERRIDES[name]
            meta = {"help": f"{help_text} [captionrl default {value!r}: {why}]"}
            specs.append((name, tp, _field(value, meta)))
        elif len(owners) == len(classes) and not algo_set and len({repr(d) for d in defaults.values()}) == 1:
            specs.append((name, tp, _field(defaults[owners[0]], {"help": help_text})))
        else:
            for a in owners:
                pending[a][name] = ALGORITHM_DEFAULTS[a].get(name, defaults[a])
            only = "" if len(owners) == len(classes) else f"{'/'.join(owners)} only; "
            shown = ", ".join(f"{a} {v!r}" for a, v in ((a, pending[a][name]) for a in owners))
            meta = {"help": f"{help_text} [{only}null = the algorithm's default: {shown}]"}
            specs.append((name, _optional(tp), dataclasses.field(default=None, metadata=meta)))
    return specs, pending


def _field(value: Any, meta: dict[str, Any]) -> Any:
    if isinstance(value, (list, dict, set)):
        import copy

        return dataclasses.field(default_factory=lambda: copy.deepcopy(value), metadata=meta)
    return dataclasses.field(default=value, metadata=meta)


def resolve(cfg: Any, algorithm: str, pending: Mapping[str, Mapping[str, Any]], prefix: str = "train") -> None:
    """Fill the null algorithm-dependent fields of ``cfg`` with ``algorithm``'s defaults; a setting of the
    other algorithm's TRL class (not null) is refused, naming it."""
    own = pending[algorithm]
    for other, names in pending.items():
        if other == algorithm:
            continue
        for name in names:
            if name not in own and getattr(cfg, name) is not None:
                raise ConfigError(f"{prefix}.{name}", getattr(cfg, name),
                                  f"is a {TRL_CLASS_NAMES[other]} setting; {TRL_CLASS_NAMES[algorithm]} has no {name}",
                                  f"remove it, or set {prefix}.algorithm: {other}")
    for name, value in own.items():
        if getattr(cfg, name) is None:
            setattr(cfg, name, value)
    for name, (value, why) in FORCED.items():
        if getattr(cfg, name, value) != value:
            raise ConfigError(f"{prefix}.{name}", getattr(cfg, name), f"must stay {value!r}: {why}", f"remove {prefix}.{name}")
