"""The MoCo Rubric momentum model: an EMA of the Policy that serves the rubric Generator and Judge.

Only the Policy ``theta`` receives gradients. Every ``H`` optimizer steps the momentum parameters follow
it, ``phi <- m * phi + (1 - m) * theta`` (paper §3.3), so both rubric roles track the Policy with a lag
and without RL updates of their own. With shared initialisation and Policy updates bounded by ``delta``
the gap at synchronisation boundaries stays below ``m * H * delta / (1 - m)`` (Proposition 1,
:func:`tracking_bound`).

One switch, ``variant``, reproduces the paper's ablations (Table 4): which role reads which parameters.

=================  ====================  ====================
variant            Generator             Judge
=================  ====================  ====================
``joint``          EMA                   EMA (the same copy)
``generator_only`` EMA                   frozen initial
``judge_only``     frozen initial        EMA
``full_sync``      copy of theta (m=0)   copy of theta (m=0)
``frozen``         frozen initial        frozen initial
=================  ====================  ====================

Initialisation (Table 3): ``shared`` (the paper's method) starts the momentum from the Policy itself (the
shared multi-role SFT checkpoint); ``separate`` starts every momentum slot from another checkpoint of the
same architecture (:meth:`Momentum.load_initial`: separately trained role models, e.g. a caption-only SFT
Policy and a rubric/judgment SFT Generator-Judge). The paper reports that EMA helps the shared
initialisation and hurts the separate one (the EMA pulls the separately trained roles toward a Policy
they were never aligned with).

Distance to the initial weights (Figure 4) is logged by every run: ``momentum/policy_to_initial``
``||theta - theta_0|| / ||theta_0||`` and ``momentum/momentum_to_initial`` ``||phi - phi_0|| / ||phi_0||``
(with ``_l2`` twins holding the absolute L2 norms), next to the Policy-momentum distance. ``theta_0``
and ``phi_0`` are read from the frozen slot when the variant keeps one (no extra memory); otherwise they
are snapshots of the paired parameters taken at construction (one more copy of what the EMA covers: the
adapter for :class:`LoraAdapterMomentum`) and travel with the momentum checkpoint.

Two implementations hold the extra parameters:

* :class:`FullCopyMomentum`: a deep copy of the whole Policy per slot (any model; doubles memory).
* :class:`LoraAdapterMomentum`: for a PEFT LoRA Policy, a second adapter ``"momentum"`` on the *same*
  frozen base weights; the EMA runs over the LoRA weights only and serving the momentum model means
  switching the active adapter (``with momentum.serving("judge") as model: ...``). The extra memory is
  the size of one adapter. Note that the EMA of the factors A and B is not the EMA of the product BA;
  for ``m`` close to 1 and small steps the difference is second order.

Under parameter sharding (DeepSpeed ZeRO-3) a rank holds empty shards; updating or measuring them
as they are would silently skip parameters, so each pair is gathered one at a time
(``deepspeed.zero.GatheredParameters``) and a sharded parameter with no way to gather it is an error.
FSDP2 DTensors need no gather: the EMA is elementwise and both sides are sharded alike.

Precision: the EMA always runs in float32. DeepSpeed casts the whole module (Policy, momentum adapter or
copy) to bf16 when bf16 is on, and at m=0.99 and lr 1e-6 ``(1-m) * (theta - phi)`` is below half a bf16
ulp: an EMA kept in the parameters' dtype would round to no change, step after step. So every EMA
parameter that is not float32 gets a float32 master copy (``_master``); the update runs on the master and
the served parameter is the master rounded to its dtype. The master travels with the momentum checkpoint
(resume continues the same float32 EMA). Memory: one float32 copy of what the EMA covers (the adapter for
:class:`LoraAdapterMomentum`); under ZeRO-3 each rank keeps the gathered full tensor.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from captionrl.config import help_field
from captionrl.errors import BackendError, ConfigError

ROLES = ("generator", "judge")
EMA, FROZEN = "ema", "frozen"
VARIANTS: dict[str, tuple[str, str]] = {
    # variant -> (slot serving the Generator, slot serving the Judge)
    "joint": (EMA, EMA),
    "generator_only": (EMA, FROZEN),
    "judge_only": (FROZEN, EMA),
    "full_sync": (EMA, EMA),
    "frozen": (FROZEN, FROZEN),
}
MOMENTUM_ADAPTER = "momentum"
INITIAL_ADAPTER = "initial"
_ADAPTER_OF_SLOT = {EMA: MOMENTUM_ADAPTER, FROZEN: INITIAL_ADAPTER}

GatherFn = Callable[[Sequence[torch.Tensor]], contextlib.AbstractContextManager[Any]]


@dataclass
class MomentumSettings:
    """How the momentum model follows the Policy (paper §3.3, Tables 4-5)."""

    m: float = help_field(0.99, "EMA coefficient: phi <- m*phi + (1-m)*theta; 0 copies theta (ignored by full_sync, which uses 0)")
    interval: int = help_field(1, "H: apply the EMA every H optimizer steps (the paper's best: H=1 with m=0.99)")
    variant: str = help_field("joint", "joint | generator_only | judge_only | full_sync | frozen (which role reads the EMA)")
    reward_interval: int | None = help_field(
        None,
        "optimizer steps per generation batch (see reward_interval_steps); when set, interval must be a multiple",
    )

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            from captionrl.registry import suggest

            raise ConfigError("momentum.variant", self.variant, "unknown variant", suggest(self.variant, list(VARIANTS)))
        if not (isinstance(self.m, (int, float)) and 0.0 <= float(self.m) < 1.0):
            raise ConfigError("momentum.m", self.m, "must be in [0, 1)", "use e.g. 0.99; variant=frozen never updates")
        if not isinstance(self.interval, int) or self.interval < 1:
            raise ConfigError("momentum.interval", self.interval, "must be an integer >= 1", "use e.g. 1 or 5")
        if self.reward_interval is not None:
            if self.reward_interval < 1:
                raise ConfigError("momentum.reward_interval", self.reward_interval, "must be >= 1", "leave it unset or give >= 1")
            if self.interval % self.reward_interval:
                ok = self.reward_interval * max(1, round(self.interval / self.reward_interval))
                raise ConfigError(
                    "momentum.interval",
                    self.interval,
                    f"is not a multiple of the reward interval ({self.reward_interval} optimizer steps per "
                    "generation batch), so the momentum model would change inside a batch whose rewards "
                    "were already computed",
                    f"set momentum.interval={ok} (a multiple of {self.reward_interval}), or change "
                    "steps_per_generation / num_iterations",
                )

    @property
    def effective_m(self) -> float:
        return 0.0 if self.variant == "full_sync" else float(self.m)

    @property
    def slots(self) -> tuple[str, ...]:
        """The parameter copies this variant needs (``ema`` and/or ``frozen``)."""
        return tuple(s for s in (EMA, FROZEN) if s in VARIANTS[self.variant])

    def slot_for(self, role: str) -> str:
        if role not in ROLES:
            raise ConfigError("role", role, "unknown role", f"use one of {', '.join(ROLES)}")
        return VARIANTS[self.variant][ROLES.index(role)]


def reward_interval_steps(steps_per_generation: int, num_iterations: int = 1, gradient_accumulation_steps: int = 1) -> int:
    """Optimizer steps between reward computations in TRL's GRPO.

    TRL generates (and scores) every ``steps_per_generation * num_iterations`` micro-steps and steps the
    optimizer every ``gradient_accumulation_steps`` micro-steps; the two align every
    ``lcm(...) / gradient_accumulation_steps`` optimizer steps. With TRL's default
    ``steps_per_generation == gradient_accumulation_steps`` this is ``num_iterations``.
    """
    for name, v in (("steps_per_generation", steps_per_generation), ("num_iterations", num_iterations),
                    ("gradient_accumulation_steps", gradient_accumulation_steps)):
        if not isinstance(v, int) or v < 1:
            raise ConfigError(name, v, "must be an integer >= 1", "check the GRPO config")
    micro = steps_per_generation * num_iterations
    return math.lcm(micro, gradient_accumulation_steps) // gradient_accumulation_steps


def tracking_bound(m: float, interval: int, delta: float) -> float:
    """Proposition 1: ``|theta_s - phi_s| <= m*H*delta / (1-m)`` at synchronisation boundaries."""
    return m * interval * delta / (1.0 - m)


# ---------------------------------------------------------------------------------------------------
# Sharded parameters


def is_sharded(p: torch.Tensor) -> bool:
    """True for a ZeRO-3 partitioned parameter (``ds_numel``) or any empty shard of a non-empty tensor."""
    return hasattr(p, "ds_numel") or hasattr(p, "ds_id") or p.numel() == 0


def deepspeed_gather() -> GatherFn | None:
    """``deepspeed.zero.GatheredParameters`` (writes rank 0's result back to the shards), if installed."""
    try:
        import deepspeed  # type: ignore[import-not-found]
    except ImportError:
        return None

    def gather(params: Sequence[torch.Tensor]) -> contextlib.AbstractContextManager[Any]:
        return deepspeed.zero.GatheredParameters(list(params), modifier_rank=0)

    return gather


@contextlib.contextmanager
def gathered(params: Sequence[torch.Tensor], gather: GatherFn | None = None) -> Iterator[None]:
    """Materialise sharded parameters for the duration of the block (a no-op when none is sharded)."""
    sharded = [p for p in params if is_sharded(p)]
    if not sharded:
        yield
        return
    fn = gather or deepspeed_gather()
    if fn is None:
        shapes = [tuple(getattr(p, "ds_shape", p.shape)) for p in sharded]
        raise BackendError(
            f"{len(sharded)} parameter(s) are sharded (empty local shards, shapes {shapes[:3]}) and there is "
            "no way to gather them, so the momentum update would silently skip them. Fix: install deepspeed "
            "(ZeRO-3 GatheredParameters), use FSDP2 (DTensor parameters need no gather), or pass gather=..."
        )
    with fn(sharded):
        yield


def _full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's global value (for norms); plain tensors unchanged."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


# ---------------------------------------------------------------------------------------------------
# Implementations


class Momentum:
    """Common logic: slots of parameter tensors paired with the Policy's, EMA, distance, checkpoints.

    Subclasses supply ``_pairs(slot)`` (name, theta, phi) and ``serving(role)``.
    """

    def __init__(self, settings: MomentumSettings | None = None, gather: GatherFn | None = None) -> None:
        self.settings = settings or MomentumSettings()
        self.gather = gather
        self.updates = 0
        self.last_update_step: int | None = None
        self.init = "shared"
        self._theta0: dict[str, torch.Tensor] = {}  # the Policy's initial weights (Figure 4)
        self._phi0: dict[str, torch.Tensor] = {}  # the momentum's initial weights (theta_0 when shared)
        self._snapshots: set[str] = set()  # which of the two are our own copies (saved with the checkpoint)
        self._master: dict[str, torch.Tensor] = {}  # float32 EMA of each non-float32 momentum parameter

    # -- to implement
    def _pairs(self, slot: str) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
        raise NotImplementedError

    def serving(self, role: str) -> contextlib.AbstractContextManager[nn.Module]:
        raise NotImplementedError

    @property
    def policy_module(self) -> nn.Module:
        """The module whose parameters are theta (what the trainer must be training)."""
        raise NotImplementedError

    # -- shared
    @property
    def momentum_slot(self) -> str | None:
        """The slot the EMA updates (``None`` for the frozen variant)."""
        return EMA if EMA in self.settings.slots else None

    def should_update(self, step: int) -> bool:
        return self.momentum_slot is not None and step > 0 and step % self.settings.interval == 0

    def maybe_update(self, step: int) -> bool:
        """Apply the EMA if ``step`` (optimizer steps done) is a synchronisation boundary."""
        if not self.should_update(step) or self.last_update_step == step:
            return False
        self.update()
        self.last_update_step = step
        return True

    @torch.no_grad()
    def update(self) -> None:
        """``phi <- m*phi + (1-m)*theta`` over every paired parameter, one (gathered) pair at a time."""
        slot = self.momentum_slot
        if slot is None:
            return
        m = self.settings.effective_m
        for name, theta, phi in self._pairs(slot):
            with gathered([theta, phi], self.gather):
                if m == 0.0:  # a copy: nothing to accumulate, no master needed
                    phi.copy_(theta)
                    self._master.pop(name, None)
                elif phi.dtype.itemsize >= 4:  # float32/float64: the parameter is its own master
                    phi.mul_(m).add_(theta.to(phi.dtype), alpha=1.0 - m)
                else:  # bf16/fp16: the EMA runs on a float32 master, the parameter is its rounding
                    master = self._master.get(name)
                    if master is None or master.shape != phi.shape:
                        master = self._master[name] = phi.detach().float().clone()
                    master.mul_(m).add_(theta.float(), alpha=1.0 - m)
                    phi.copy_(master)
        self.updates += 1

    def master_of(self, name: str) -> torch.Tensor | None:
        """The float32 master of a momentum parameter (``None`` while the parameter is its own master)."""
        return self._master.get(name)

    @torch.no_grad()
    def distance(self, slot: str | None = None) -> float:
        """Relative L2 distance ``||theta - phi|| / ||theta||`` over the paired parameters (Figure 4)."""
        slot = slot or self.momentum_slot or FROZEN
        diff2 = ref2 = 0.0
        for _name, theta, phi in self._pairs(slot):
            with gathered([theta, phi], self.gather):
                t = _full(theta).double()
                diff2 += float((t - _full(phi).double()).pow(2).sum())
                ref2 += float(t.pow(2).sum())
        return math.sqrt(diff2) / math.sqrt(ref2) if ref2 > 0 else math.sqrt(diff2)

    # -- initial weights: distance to them (Figure 4) and separate initialisation (Table 3)
    @torch.no_grad()
    def snapshot_initial(self) -> None:
        """Record ``theta_0`` and ``phi_0`` from the current parameters (subclasses call it once built).

        With shared initialisation a frozen slot already holds ``theta_0 = phi_0``; a separately
        initialised momentum keeps the frozen slot as ``phi_0`` and snapshots ``theta_0``.
        """
        slot = self.settings.slots[0]
        frozen = {n: phi for n, _t, phi in self._pairs(FROZEN)} if FROZEN in self.settings.slots else None
        self._snapshots = set()
        if frozen is not None and self.init == "shared":
            self._theta0 = frozen
        else:
            self._theta0 = self._clone((n, theta) for n, theta, _p in self._pairs(slot))
            self._snapshots.add("theta0")
        if self.init == "shared":
            self._phi0 = self._theta0
        elif frozen is not None:
            self._phi0 = frozen
        else:
            self._phi0 = self._clone((n, phi) for n, _t, phi in self._pairs(slot))
            self._snapshots.add("phi0")

    def _clone(self, named: Any) -> dict[str, torch.Tensor]:
        out = {}
        for name, t in named:
            with gathered([t], self.gather):
                out[name] = _full(t).detach().clone()
        return out

    def _state_keys(self, name: str) -> list[str]:
        """Names a pair's parameter may have in an outside checkpoint (PEFT wrapping stripped)."""
        plain = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
        return list(dict.fromkeys([name, plain]))

    @torch.no_grad()
    def load_initial(self, state: Mapping[str, torch.Tensor], source: str = "momentum.init_from") -> int:
        """Separate initialisation: every momentum slot starts from ``state`` (another checkpoint of the
        Policy's architecture) instead of the Policy. Parameters absent from ``state`` are allowed only
        for LoRA factors (fresh adapters on a separately trained base); returns how many were loaded."""
        loaded, missing = 0, []
        for slot in self.settings.slots:
            for name, _theta, phi in self._pairs(slot):
                key = next((k for k in self._state_keys(name) if k in state), None)
                if key is None:
                    missing.append(name)
                    continue
                value = state[key]
                with gathered([phi], self.gather):
                    target = _full(phi)
                    if tuple(value.shape) != tuple(target.shape):
                        raise ConfigError(source, f"{key}: {tuple(value.shape)}",
                                          f"does not match the Policy's {tuple(target.shape)}",
                                          "give a checkpoint of the Policy's architecture (same model family and size)")
                    phi.copy_(value.to(phi.device, phi.dtype))
                loaded += 1
        bad = [n for n in missing if "lora_" not in n]
        if not loaded or bad:
            raise ConfigError(source, (bad or missing)[:3], f"has no weights for {len(bad or missing)} parameter(s) of the momentum",
                              "give a checkpoint of the Policy's architecture: a model folder, or a LoRA adapter folder "
                              "of the same LoRA configuration for a LoRA momentum")
        self.init = "separate"
        self._master.clear()  # the momentum restarts from the loaded weights
        self.snapshot_initial()
        return loaded

    @torch.no_grad()
    def _distance_to(self, current: Sequence[tuple[str, torch.Tensor]], initial: Mapping[str, torch.Tensor]) -> tuple[float, float]:
        """(``||x - x_0||``, ``||x - x_0|| / ||x_0||``) over the named tensors."""
        diff2 = ref2 = 0.0
        for name, x in current:
            x0 = initial[name]
            with gathered([x, x0], self.gather):
                a, b = _full(x).double(), _full(x0).to(x.device).double()
                diff2 += float((a - b).pow(2).sum())
                ref2 += float(b.pow(2).sum())
        l2 = math.sqrt(diff2)
        return l2, (l2 / math.sqrt(ref2) if ref2 > 0 else l2)

    def initial_distances(self) -> dict[str, float]:
        """Distance of the Policy (and of the moving momentum) to their initial weights (Figure 4)."""
        if not self._theta0:
            return {}
        pairs = self._pairs(self.settings.slots[0])
        out: dict[str, float] = {}
        out["momentum/policy_to_initial_l2"], out["momentum/policy_to_initial"] = self._distance_to(
            [(n, t) for n, t, _p in pairs], self._theta0)
        if self.momentum_slot is not None:
            ema = [(n, phi) for n, _t, phi in self._pairs(self.momentum_slot)]
            out["momentum/momentum_to_initial_l2"], out["momentum/momentum_to_initial"] = self._distance_to(ema, self._phi0)
        return out

    def diagnostics(self) -> dict[str, float]:
        """Values to log: distance to each slot, to the initial weights, number of EMA updates."""
        out: dict[str, float] = {"momentum/updates": float(self.updates)}
        for slot in self.settings.slots:
            key = "momentum/distance" if slot == (self.momentum_slot or FROZEN) else f"momentum/distance_{slot}"
            out[key] = self.distance(slot)
        out.update(self.initial_distances())
        return out

    def num_momentum_parameters(self) -> int:
        """Elements held by the extra copies (what the momentum costs in memory)."""
        n = 0
        for slot in self.settings.slots:
            for _name, _theta, phi in self._pairs(slot):
                n += int(getattr(phi, "ds_numel", phi.numel()))
        return n

    @torch.no_grad()
    def state_dict(self) -> dict[str, Any]:
        slots: dict[str, dict[str, torch.Tensor]] = {}
        for slot in self.settings.slots:
            slots[slot] = {}
            for name, theta, phi in self._pairs(slot):
                with gathered([theta, phi], self.gather):
                    value = self._master.get(name) if slot == self.momentum_slot else None  # float32 EMA
                    slots[slot][name] = (value if value is not None else _full(phi)).detach().to("cpu", copy=True)
        initial = {k: {n: t.detach().to("cpu", copy=True) for n, t in getattr(self, f"_{k}").items()}
                   for k in sorted(self._snapshots)}
        return {"settings": asdict(self.settings), "updates": self.updates,
                "last_update_step": self.last_update_step, "slots": slots, "init": self.init, "initial": initial}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore slots saved by :meth:`state_dict` (resume); names and shapes must match."""
        slots = state.get("slots", {})
        for slot in self.settings.slots:
            if slot not in slots:
                raise ConfigError("momentum checkpoint", sorted(slots), f"has no {slot!r} slot",
                                  "resume with the same momentum.variant the run was started with")
            saved = slots[slot]
            for name, theta, phi in self._pairs(slot):
                if name not in saved:
                    raise ConfigError("momentum checkpoint", name, "parameter missing",
                                      "resume with the same model and adapter configuration")
                with gathered([theta, phi], self.gather):
                    phi.copy_(saved[name].to(phi.device, phi.dtype))
                    if slot == self.momentum_slot and phi.dtype.itemsize < 4:
                        self._master[name] = saved[name].to(phi.device, torch.float32, copy=True)
        self.updates = int(state.get("updates", 0))
        self.last_update_step = state.get("last_update_step")
        saved_init = state.get("init", "shared")
        if saved_init != self.init:
            raise ConfigError("momentum.init", self.init, f"the checkpoint's momentum was initialised {saved_init!r}",
                              f"resume with momentum.init: {saved_init} (the run's own setting)")
        for k, tensors in (state.get("initial") or {}).items():  # the initial weights of the original run
            mine = getattr(self, f"_{k}", {}) if k in self._snapshots else {}
            for n, t in tensors.items():
                if n in mine:
                    mine[n].copy_(t.to(mine[n].device, mine[n].dtype))


def _freeze(module: nn.Module) -> nn.Module:
    for p in module.parameters():
        p.requires_grad_(False)
    return module.eval()


class FullCopyMomentum(Momentum):
    """One deep copy of the Policy per slot; ``serving(role)`` yields the copy serving that role.

    Under ZeRO-3 a deep copy of a partitioned module is not a valid partitioned module: build the copies
    under the same sharding (e.g. ``deepspeed.zero.Init``) and pass them as ``copies={"ema": model}``.
    """

    def __init__(
        self,
        policy: nn.Module,
        settings: MomentumSettings | None = None,
        *,
        copies: dict[str, nn.Module] | None = None,
        gather: GatherFn | None = None,
    ) -> None:
        super().__init__(settings, gather)
        self.policy = policy
        self.copies: dict[str, nn.Module] = {}
        for slot in self.settings.slots:
            if copies and slot in copies:
                model = copies[slot]
                self._pairs_of(model)  # validates the structure
                with torch.no_grad():
                    for _n, theta, phi in self._pairs_of(model):
                        with gathered([theta, phi], self.gather):
                            phi.copy_(theta)
            else:
                if any(is_sharded(p) for p in policy.parameters()):
                    raise BackendError(
                        "the Policy's parameters are sharded; a deep copy would not be. Fix: build the "
                        f"momentum copy under the same sharding and pass copies={{{slot!r}: model}}, or use "
                        "LoraAdapterMomentum"
                    )
                model = copy.deepcopy(policy)
            self.copies[slot] = _freeze(model)
        self.snapshot_initial()

    def _pairs_of(self, model: nn.Module) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
        theta = dict(self.policy.named_parameters())
        phi = dict(model.named_parameters())
        if theta.keys() != phi.keys():
            missing = sorted(set(theta) ^ set(phi))[:5]
            raise ConfigError("momentum copy", missing, "parameter names differ from the Policy's",
                              "pass a copy of the same architecture")
        return [(n, theta[n], phi[n]) for n in theta]

    def _pairs(self, slot: str) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
        return self._pairs_of(self.copies[slot])

    @property
    def policy_module(self) -> nn.Module:
        return self.policy

    def model_for(self, role: str) -> nn.Module:
        return self.copies[self.settings.slot_for(role)]

    @contextlib.contextmanager
    def serving(self, role: str) -> Iterator[nn.Module]:
        yield self.model_for(role)


class LoraAdapterMomentum(Momentum):
    """The momentum as extra LoRA adapters (``"momentum"``, and ``"initial"`` for the one-sided and
    frozen variants) on the Policy's own base weights.

    Args:
        model: a ``peft.PeftModel`` whose active adapter is the Policy.
        policy_adapter: the Policy's adapter name (default: the active one).
    """

    def __init__(
        self,
        model: nn.Module,
        settings: MomentumSettings | None = None,
        *,
        policy_adapter: str | None = None,
        gather: GatherFn | None = None,
    ) -> None:
        super().__init__(settings, gather)
        if not hasattr(model, "peft_config") or not hasattr(model, "add_adapter"):
            raise ConfigError("policy", type(model).__name__, "is not a PEFT model",
                              "wrap the Policy with peft.get_peft_model(model, LoraConfig(...)) or use FullCopyMomentum")
        self.model = model
        self.policy_adapter = policy_adapter or _active(model)
        if self.policy_adapter not in model.peft_config:
            raise ConfigError("policy_adapter", self.policy_adapter, "no such adapter", f"known: {sorted(model.peft_config)}")
        trainable = {n: p.requires_grad for n, p in model.named_parameters()}
        cfg = model.peft_config[self.policy_adapter]
        for slot in self.settings.slots:
            name = _ADAPTER_OF_SLOT[slot]
            if name in model.peft_config:
                raise ConfigError("policy", name, "already has an adapter with this name", "remove it or rename it")
            model.add_adapter(name, copy.deepcopy(cfg))
        if _active(model) != self.policy_adapter:
            model.set_adapter(self.policy_adapter)
        # Restore exactly which parameters train (adding/switching adapters toggles requires_grad).
        for n, p in model.named_parameters():
            p.requires_grad_(trainable.get(n, False))
        with torch.no_grad():
            for slot in self.settings.slots:
                pairs = self._pairs(slot)
                if not pairs:
                    raise ConfigError("policy", self.policy_adapter, "adapter has no parameters", "check the LoraConfig")
                for _n, theta, phi in pairs:
                    with gathered([theta, phi], self.gather):
                        phi.copy_(theta)
        self.snapshot_initial()

    def _pairs(self, slot: str) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
        target = _ADAPTER_OF_SLOT[slot]
        params = dict(self.model.named_parameters())
        pairs = []
        for name, theta in params.items():
            parts = name.split(".")
            if self.policy_adapter not in parts:
                continue
            other = ".".join(target if x == self.policy_adapter else x for x in parts)
            if other not in params:
                raise ConfigError("momentum adapter", other, f"has no counterpart of {name}",
                                  "add the momentum before wrapping or modifying the adapters")
            pairs.append((name, theta, params[other]))
        return pairs

    @property
    def policy_module(self) -> nn.Module:
        return self.model

    def _state_keys(self, name: str) -> list[str]:
        """A saved PEFT adapter (``load_peft_weights``) names its factors without the adapter name."""
        return list(dict.fromkeys([name, ".".join(x for x in name.split(".") if x != self.policy_adapter)]))

    def adapter_for(self, role: str) -> str:
        return _ADAPTER_OF_SLOT[self.settings.slot_for(role)]

    @contextlib.contextmanager
    def serving(self, role: str) -> Iterator[nn.Module]:
        """Activate the role's adapter (eval mode, no grads); restore adapter, mode and grads after."""
        model = self.model
        previous = _active(model)
        training = model.training
        grads = {n: p.requires_grad for n, p in model.named_parameters()}
        model.set_adapter(self.adapter_for(role))
        model.eval()
        try:
            with torch.no_grad():
                yield model
        finally:
            model.set_adapter(previous)
            model.train(training)
            for n, p in model.named_parameters():
                p.requires_grad_(grads.get(n, False))


def _active(model: Any) -> str:
    active = model.active_adapter
    return active[0] if isinstance(active, (list, tuple)) else active


def build_momentum(policy: nn.Module, settings: MomentumSettings | None = None, implementation: str = "auto",
                   **kw: Any) -> Momentum:
    """``auto`` picks the LoRA adapter for a PEFT Policy, the full copy otherwise."""
    if implementation == "auto":
        implementation = "lora_adapter" if hasattr(policy, "peft_config") else "full_copy"
    if implementation == "lora_adapter":
        return LoraAdapterMomentum(policy, settings, **kw)
    if implementation == "full_copy":
        return FullCopyMomentum(policy, settings, **kw)
    raise ConfigError("momentum.implementation", implementation, "unknown implementation", "use auto, lora_adapter or full_copy")
