"""The momentum EMA keeps float32 precision whatever the training dtype.

DeepSpeed casts the module to bf16 when bf16 is on. At m=0.99 a Policy step of the size lr 1e-6 training
produces moves the EMA by (1-m)*(theta-phi), below half a bf16 ulp: an EMA kept in bf16 rounds to no change
forever. The momentum keeps a float32 master of each bf16 parameter: it must move by exactly the float32
EMA, and the served bf16 parameter must be that master rounded.
"""

from __future__ import annotations

import torch
from torch import nn

from captionrl.momentum import FullCopyMomentum, MomentumSettings

M = 0.99
STEP = 0.0625  # the Policy's offset from the momentum (exact in bf16); (1-m)*STEP is ~1/12 of a bf16 ulp at 1.0


def _bf16_policy() -> nn.Module:
    model = nn.Linear(4, 4, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        model.weight.fill_(1.0)
    return model


def _float32_ema(phi0: float, theta: float, n: int) -> float:
    """n EMA updates toward a fixed theta, in float32 (the reference the momentum must match)."""
    phi = torch.tensor(phi0, dtype=torch.float32)
    for _ in range(n):
        phi = phi * M + torch.tensor(theta, dtype=torch.float32) * (1 - M)
    return float(phi)


def test_a_bf16_ema_rounds_to_no_change_the_trap_this_guards_against() -> None:
    phi = torch.ones(4, dtype=torch.bfloat16)
    theta = phi + STEP
    for _ in range(50):
        phi = phi.mul(M).add(theta, alpha=1 - M)  # the EMA in the parameters' own dtype
    assert torch.equal(phi, torch.ones(4, dtype=torch.bfloat16))  # 50 updates, not one bit moved


def test_bf16_momentum_moves_by_the_float32_ema() -> None:
    policy = _bf16_policy()
    momentum = FullCopyMomentum(policy, MomentumSettings(m=M, interval=1, variant="joint"))
    phi = momentum.model_for("judge").weight
    assert phi.dtype == torch.bfloat16
    with torch.no_grad():
        policy.weight.add_(STEP)  # theta = 1.0625 exactly
    for n in range(1, 51):
        momentum.update()
        master = momentum.master_of("weight")
        assert master is not None and master.dtype == torch.float32
        expected = _float32_ema(1.0, 1.0 + STEP, n)
        assert torch.allclose(master, torch.full_like(master, expected), rtol=0, atol=1e-6), (n, master, expected)
        assert torch.equal(phi, master.to(torch.bfloat16))  # what the roles read: the master, rounded
    assert float(phi[0, 0]) > 1.0  # it moved (a bf16 EMA would still read exactly 1.0)
    assert momentum.distance() < STEP / (1 + STEP)  # closer to the Policy than at the start


def test_resume_continues_the_same_float32_ema() -> None:
    def run(n_before: int, n_after: int, resume: bool) -> torch.Tensor:
        policy = _bf16_policy()
        momentum = FullCopyMomentum(policy, MomentumSettings(m=M, interval=1))
        with torch.no_grad():
            policy.weight.add_(STEP)
        for _ in range(n_before):
            momentum.update()
        if resume:  # a fresh process restores the checkpoint (bf16 weights + float32 master)
            state = momentum.state_dict()
            assert state["slots"]["ema"]["weight"].dtype == torch.float32
            policy = _bf16_policy()
            with torch.no_grad():
                policy.weight.add_(STEP)
            momentum = FullCopyMomentum(policy, MomentumSettings(m=M, interval=1))
            momentum.load_state_dict(state)
        for _ in range(n_after):
            momentum.update()
        return momentum.master_of("weight").clone()

    assert torch.equal(run(7, 8, resume=True), run(7, 8, resume=False))


def test_float32_parameters_need_no_master() -> None:
    policy = nn.Linear(4, 4, bias=False)
    momentum = FullCopyMomentum(policy, MomentumSettings(m=M, interval=1))
    momentum.update()
    assert momentum.master_of("weight") is None  # a float32 parameter is its own master: no extra memory
