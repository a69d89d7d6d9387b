"""MoCo ablations on real tensors: distance to the initial weights (Figure 4) and separate initialisation of
the momentum model (Table 3), for the full copy and the LoRA adapter momentum, with checkpoints."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from captionrl.errors import ConfigError
from captionrl.momentum import FullCopyMomentum, LoraAdapterMomentum, MomentumSettings

KEYS = ("momentum/policy_to_initial", "momentum/policy_to_initial_l2", "momentum/momentum_to_initial",
        "momentum/momentum_to_initial_l2")


def _mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def _sgd_step(model: nn.Module, lr: float = 0.05) -> None:
    """One real optimizer step on a real loss (the Policy's update)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x = torch.linspace(-1, 1, 12).reshape(3, 4)
    loss = (model(x) - torch.ones(3, 2)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()


def _norm(tensors) -> float:
    return math.sqrt(sum(float(t.double().pow(2).sum()) for t in tensors))


@pytest.mark.parametrize("variant", ["joint", "generator_only", "frozen"])
def test_distance_to_initial_is_zero_at_start_and_grows_by_the_ema_rule(variant: str) -> None:
    policy = _mlp(0)
    theta0 = [p.detach().clone() for p in policy.parameters()]
    mom = FullCopyMomentum(policy, MomentumSettings(m=0.75, interval=1, variant=variant))
    diag = mom.diagnostics()
    assert diag["momentum/policy_to_initial"] == 0.0 and diag["momentum/policy_to_initial_l2"] == 0.0
    assert ("momentum/momentum_to_initial" in diag) == (variant != "frozen")  # a frozen momentum never moves
    _sgd_step(policy)
    mom.maybe_update(1)
    diag = mom.diagnostics()
    delta = [p.detach() - p0 for p, p0 in zip(policy.parameters(), theta0, strict=True)]
    assert diag["momentum/policy_to_initial_l2"] == pytest.approx(_norm(delta), rel=1e-6) and _norm(delta) > 0
    assert diag["momentum/policy_to_initial"] == pytest.approx(_norm(delta) / _norm(theta0), rel=1e-6)
    if variant != "frozen":  # phi_1 = m*theta_0 + (1-m)*theta_1: a quarter of the Policy's way
        assert diag["momentum/momentum_to_initial_l2"] == pytest.approx(0.25 * _norm(delta), rel=1e-6)
    _sgd_step(policy)
    mom.maybe_update(2)
    assert mom.diagnostics()["momentum/policy_to_initial"] > diag["momentum/policy_to_initial"]


def test_separate_init_starts_the_momentum_from_another_checkpoint_and_survives_resume() -> None:
    policy, other = _mlp(0), _mlp(1)
    theta0 = {n: p.detach().clone() for n, p in policy.named_parameters()}
    shared = FullCopyMomentum(_mlp(0), MomentumSettings(m=0.5, variant="generator_only"))
    assert shared.distance("ema") == 0.0 and shared.init == "shared"

    mom = FullCopyMomentum(policy, MomentumSettings(m=0.5, variant="generator_only"))
    n = mom.load_initial(dict(other.named_parameters()))
    assert n == 2 * len(theta0) and mom.init == "separate"
    for slot in ("ema", "frozen"):  # both rubric-role copies start from the other checkpoint, not the Policy
        for (name, p), q in zip(mom.copies[slot].named_parameters(), other.parameters(), strict=True):
            torch.testing.assert_close(p, q)
            assert not torch.equal(p, theta0[name])
    for name, p in policy.named_parameters():
        torch.testing.assert_close(p, theta0[name])  # the Policy itself is untouched
    diag = mom.diagnostics()
    assert diag["momentum/distance"] > 0.1  # separate roles: far from the Policy from step 0
    assert diag["momentum/policy_to_initial"] == 0.0 and diag["momentum/momentum_to_initial"] == 0.0

    _sgd_step(policy)
    mom.maybe_update(1)
    # EMA pulls the separately initialised momentum toward the Policy: phi_1 - phi_0 = (1-m)(theta_1 - phi_0)
    gap = [p.detach() - q.detach() for p, q in zip(policy.parameters(), other.parameters(), strict=True)]
    assert mom.diagnostics()["momentum/momentum_to_initial_l2"] == pytest.approx(0.5 * _norm(gap), rel=1e-6)

    # a checkpoint keeps the initialisation and the initial weights; resuming it as 'shared' is refused
    state = mom.state_dict()
    assert state["init"] == "separate"
    again = FullCopyMomentum(_mlp(0), MomentumSettings(m=0.5, variant="generator_only"))
    with pytest.raises(ConfigError, match="separate"):
        again.load_state_dict(state)
    again = FullCopyMomentum(_mlp(0), MomentumSettings(m=0.5, variant="generator_only"))
    again.load_initial(dict(_mlp(1).named_parameters()))
    again.load_state_dict(state)
    with torch.no_grad():
        for p, q in zip(again.policy.parameters(), policy.parameters(), strict=True):
            p.copy_(q)
    assert again.diagnostics() == pytest.approx(mom.diagnostics())


def test_separate_init_refuses_a_checkpoint_of_another_architecture() -> None:
    mom = FullCopyMomentum(_mlp(0), MomentumSettings())
    with pytest.raises(ConfigError, match="does not match") as err:
        mom.load_initial({"0.weight": torch.zeros(3, 3), "0.bias": torch.zeros(8), "2.weight": torch.zeros(2, 8),
                          "2.bias": torch.zeros(2)})
    assert err.value.field == "momentum.init_from"
    with pytest.raises(ConfigError, match="no weights for 2"):
        mom.load_initial({"0.weight": torch.zeros(8, 4), "0.bias": torch.zeros(8)})
    assert mom.init == "shared"


def test_lora_momentum_separate_init_from_a_saved_adapter(tmp_path) -> None:
    from peft import LoraConfig, get_peft_model, load_peft_weights
    from transformers import LlamaConfig, LlamaForCausalLM

    def policy(seed: int):
        torch.manual_seed(0)  # the same base weights
        base = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
        torch.manual_seed(seed)  # different adapters
        return get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))

    role_sft = policy(seed=7)
    role_sft.save_pretrained(tmp_path / "adapter")
    model = policy(seed=1)
    mom = LoraAdapterMomentum(model, MomentumSettings(m=0.9))
    assert mom.distance() == 0.0
    mom.load_initial(load_peft_weights(str(tmp_path / "adapter"), device="cpu"))
    saved = {n.replace(".default.", ".momentum."): p for n, p in role_sft.named_parameters() if ".default." in n}
    got = {n: p for n, p in model.named_parameters() if ".momentum." in n}
    assert saved.keys() == got.keys() and got
    for n, p in got.items():
        torch.testing.assert_close(p, saved[n])
    assert mom.distance() > 0.1 and mom.diagnostics()["momentum/momentum_to_initial"] == 0.0


def test_full_copy_of_a_lora_policy_takes_a_whole_separate_model() -> None:
    """momentum.implementation full_copy + a full model folder: the copy's base weights become the other
    model's (PEFT names mapped to plain ones), its fresh LoRA factors are kept, the Policy is untouched."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    policy = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]))
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    torch.manual_seed(5)
    other = LlamaForCausalLM(cfg)
    mom = FullCopyMomentum(policy, MomentumSettings(m=0.9))
    mom.load_initial(dict(other.named_parameters()))
    copy = dict(mom.copies["ema"].named_parameters())
    q = "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"
    torch.testing.assert_close(copy[q], dict(other.named_parameters())["model.layers.0.self_attn.q_proj.weight"])
    lora = [n for n in copy if "lora_" in n]
    assert lora and all(torch.equal(copy[n], before[n]) for n in lora)
    assert all(torch.equal(p, before[n]) for n, p in policy.named_parameters())
    assert mom.distance() > 0.1
