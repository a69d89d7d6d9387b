"""The momentum model: the EMA rule by hand for every variant and both implementations, Proposition 1's
tracking bound, sharded parameters, checkpoints, and the Trainer callback."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from torch import nn

from captionrl.errors import BackendError, ConfigError
from captionrl.momentum import (
    VARIANTS,
    FullCopyMomentum,
    LoraAdapterMomentum,
    MomentumSettings,
    build_momentum,
    reward_interval_steps,
    tracking_bound,
)

# Policy trajectory used by the hand computations: theta_t = theta_0 + C[t] (elementwise offset).
C = [0.0, 2.0, 4.0, 6.0, 8.0]
# m = 0.25, H = 2: updates at steps 2 and 4 (m != 1-m, so a swapped formula fails).
#   step 2: phi = 0.25*0 + 0.75*4 = 3;  step 4: phi = 0.25*3 + 0.75*8 = 6.75   (offsets from theta_0)
#   full_sync copies theta: 4 then 8; frozen (and the frozen side of one-sided variants) stays at 0.
EMA_AT = {2: 3.0, 4: 6.75}
SYNC_AT = {2: 4.0, 4: 8.0}


def expected_offsets(variant: str, step: int) -> dict[str, float]:
    ema = {"joint": EMA_AT, "full_sync": SYNC_AT}.get(variant, EMA_AT)
    last = max((s for s in ema if s <= step), default=None)
    moved = ema[last] if last is not None else 0.0
    gen_slot, judge_slot = VARIANTS[variant]
    return {role: (moved if slot == "ema" else 0.0) for role, slot in (("generator", gen_slot), ("judge", judge_slot))}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_full_copy_ema_by_hand(variant: str) -> None:
    policy = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        policy.weight.copy_(torch.tensor([[1.0, -2.0]]))
    theta0 = policy.weight.detach().clone()
    mom = FullCopyMomentum(policy, MomentumSettings(m=0.25, interval=2, variant=variant))
    for step in range(1, 5):
        with torch.no_grad():
            policy.weight.copy_(theta0 + C[step])
        updated = mom.maybe_update(step)
        assert updated == (step % 2 == 0 and variant != "frozen")
        for role, offset in expected_offsets(variant, step).items():
            got = mom.model_for(role).weight
            torch.testing.assert_close(got, theta0 + offset, msg=f"{variant} {role} step {step}")
            assert not got.requires_grad
    assert policy.weight.requires_grad
    # the same step twice (e.g. a callback called again) does not apply the EMA twice
    assert not mom.maybe_update(4)


def test_joint_shares_one_copy_and_one_sided_variants_hold_two() -> None:
    policy = nn.Linear(3, 3)
    joint = FullCopyMomentum(policy, MomentumSettings(variant="joint"))
    assert joint.model_for("generator") is joint.model_for("judge") is joint.copies["ema"]
    assert list(joint.copies) == ["ema"]
    one_sided = FullCopyMomentum(policy, MomentumSettings(variant="judge_only"))
    assert set(one_sided.copies) == {"ema", "frozen"}
    assert one_sided.num_momentum_parameters() == 2 * sum(p.numel() for p in policy.parameters())


def tiny_lora_policy(seed: int = 0):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    base = LlamaForCausalLM(cfg)
    # init_lora_weights=False: B is random too, so every adapter changes the output
    return get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                           init_lora_weights=False))


def lora_params(model, adapter: str) -> dict[str, torch.Tensor]:
    return {n.replace(f".{adapter}.", ".X."): p for n, p in model.named_parameters() if f".{adapter}." in n}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_lora_adapter_ema_by_hand(variant: str) -> None:
    model = tiny_lora_policy()
    theta = lora_params(model, "default")
    theta0 = {n: p.detach().clone() for n, p in theta.items()}
    base_before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    mom = LoraAdapterMomentum(model, MomentumSettings(m=0.25, interval=2, variant=variant))
    assert model.active_adapter == "default"
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".default." in n for n in trainable), "only the Policy adapter trains"
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    for step in range(1, 5):
        with torch.no_grad():
            for n, p in theta.items():
                p.copy_(theta0[n] + C[step])
        mom.maybe_update(step)
        for role, offset in expected_offsets(variant, step).items():
            adapter = mom.adapter_for(role)
            for n, p in lora_params(model, adapter).items():
                torch.testing.assert_close(p, theta0[n] + offset, msg=f"{variant} {role} {n} step {step}")
                assert not p.requires_grad
    # serving a role runs the model with that role's weights: same logits as the Policy given them
    policy_logits = model(ids).logits
    for role in ("generator", "judge"):
        with mom.serving(role) as served:
            assert served.active_adapter == mom.adapter_for(role)
            served_logits = served(ids).logits
        with torch.no_grad():
            saved = {n: p.detach().clone() for n, p in theta.items()}
            for n, p in lora_params(model, mom.adapter_for(role)).items():
                theta[n].copy_(p)
            expected = model(ids).logits
            for n, p in theta.items():
                p.copy_(saved[n])
        torch.testing.assert_close(served_logits, expected)
        assert not torch.allclose(served_logits, policy_logits) or expected_offsets(variant, 4)[role] == 8.0
    assert model.active_adapter == "default"
    assert {n for n, p in model.named_parameters() if p.requires_grad} == trainable
    for n, p in model.named_parameters():
        if n in base_before:
            torch.testing.assert_close(p, base_before[n])  # the base weights are shared and untouched


def test_only_policy_receives_gradients_in_a_real_step() -> None:
    model = tiny_lora_policy(seed=1)
    mom = build_momentum(model, MomentumSettings(m=0.9, interval=1))
    assert isinstance(mom, LoraAdapterMomentum)
    phi_before = {n: p.detach().clone() for n, p in lora_params(model, "momentum").items()}
    theta_before = {n: p.detach().clone() for n, p in lora_params(model, "default").items()}
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    ids = torch.tensor([[1, 5, 9, 3, 7, 2]])
    with mom.serving("judge"):
        pass  # serving must not leave the momentum adapter trainable or active
    model(ids, labels=ids).loss.backward()
    assert all(p.grad is None for p in lora_params(model, "momentum").values())
    opt.step()
    theta_after = lora_params(model, "default")
    assert all(not torch.equal(theta_after[n], theta_before[n]) for n in theta_before)
    assert all(torch.equal(p, phi_before[n]) for n, p in lora_params(model, "momentum").items())
    d0 = mom.distance()
    assert d0 > 0
    mom.maybe_update(1)
    for n, p in lora_params(model, "momentum").items():
        torch.testing.assert_close(p, 0.9 * phi_before[n] + 0.1 * theta_after[n])
    assert mom.distance() == pytest.approx(0.9 * d0, rel=1e-6)  # d_s = m * (theta_s - phi_{s-1})


def test_settings_validation() -> None:
    with pytest.raises(ConfigError, match="multiple of the reward interval") as exc:
        MomentumSettings(interval=3, reward_interval=2)
    assert "momentum.interval=4" in exc.value.fix or "momentum.interval=2" in exc.value.fix
    MomentumSettings(interval=4, reward_interval=2)
    with pytest.raises(ConfigError, match="unknown variant"):
        MomentumSettings(variant="jont")
    with pytest.raises(ConfigError):
        MomentumSettings(m=1.0)
    with pytest.raises(ConfigError):
        MomentumSettings(interval=0)
    assert reward_interval_steps(4, 1, 4) == 1
    assert reward_interval_steps(4, 2, 4) == 2
    assert reward_interval_steps(8, 1, 2) == 4
    assert reward_interval_steps(2, 1, 4) == 1  # two generations per optimizer step
    assert reward_interval_steps(3, 1, 2) == 3  # boundaries align every lcm(3, 2)=6 micro-steps
    with pytest.raises(ConfigError):
        reward_interval_steps(0)


def _run_trajectory(m: float, H: int, delta: float, steps: int, step_fn) -> list[float]:
    policy = nn.Linear(8, 1, bias=False, dtype=torch.float64)  # float64: the bound is checked to 1e-9
    mom = FullCopyMomentum(policy, MomentumSettings(m=m, interval=H))
    gaps = []
    for t in range(1, steps + 1):
        with torch.no_grad():
            u = step_fn(t)
            assert float(u.norm()) <= delta * (1 + 1e-9)
            policy.weight.add_(u)
        if mom.maybe_update(t):
            gaps.append(float((policy.weight - mom.copies["ema"].weight).detach().norm()))
    return gaps


@pytest.mark.parametrize(("m", "H"), [(0.9, 1), (0.9, 3), (0.5, 5), (0.99, 2)])
def test_proposition_1_tracking_bound(m: float, H: int) -> None:
    delta = 0.01
    bound = tracking_bound(m, H, delta)
    assert bound == pytest.approx(m * H * delta / (1 - m))
    gen = torch.Generator().manual_seed(7)

    def random_step(t: int) -> torch.Tensor:
        u = torch.randn(1, 8, generator=gen, dtype=torch.float64)
        return u / u.norm() * delta * float(torch.rand(1, generator=gen))

    gaps = _run_trajectory(m, H, delta, 1500, random_step)
    assert max(gaps) <= bound * (1 + 1e-9)
    # worst case: constant drift at the maximal speed; the gap converges to the bound from below
    drift = torch.zeros(1, 8, dtype=torch.float64)
    drift[0, 0] = delta
    gaps = _run_trajectory(m, H, delta, 1500 if m < 0.99 else 3000, lambda t: drift)
    assert max(gaps) <= bound * (1 + 1e-9)
    assert gaps[-1] >= 0.99 * bound, (gaps[-1], bound)
    # random steps stay well inside it: the bound is not loose only in the constant-drift case
    assert max(_run_trajectory(m, H, delta, 300, random_step)) < 0.9 * bound


class FakeShards:
    """Emulates ZeRO-3: each parameter keeps an empty local shard (``ds_numel`` set) and its full value
    in ``self.full``; ``gather`` materialises it for a block and writes changes back."""

    def __init__(self) -> None:
        self.full: dict[int, torch.Tensor] = {}
        self.gathers = 0

    def shard(self, module: nn.Module) -> nn.Module:
        for p in module.parameters():
            self.full[id(p)] = p.data.clone()
            p.ds_numel = p.numel()
            p.ds_shape = p.shape
            p.data = torch.empty(0)
        return module

    @contextlib.contextmanager
    def gather(self, params):
        self.gathers += 1
        for p in params:
            p.data = self.full[id(p)].clone()
        try:
            yield
        finally:
            for p in params:
                self.full[id(p)] = p.data.clone()
                p.data = torch.empty(0)


def test_sharded_parameters_are_gathered_never_skipped(monkeypatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "deepspeed", None)  # as on a machine without deepspeed: no gather to fall back on
    torch.manual_seed(0)
    shards = FakeShards()
    policy = shards.shard(nn.Linear(3, 2))
    copy = shards.shard(nn.Linear(3, 2))  # built "under the same sharding", different values
    with pytest.raises(BackendError, match="sharded"):
        FullCopyMomentum(policy, MomentumSettings())  # a deep copy of shards is not allowed
    with pytest.raises(BackendError, match="no way to gather"):
        FullCopyMomentum(policy, MomentumSettings(), copies={"ema": copy})  # deepspeed is not installed
    mom = FullCopyMomentum(policy, MomentumSettings(m=0.75, interval=1), copies={"ema": copy}, gather=shards.gather)
    for p_theta, p_phi in zip(policy.parameters(), copy.parameters(), strict=True):
        torch.testing.assert_close(shards.full[id(p_phi)], shards.full[id(p_theta)])  # shared init
        assert p_phi.numel() == 0
    theta0 = {id(p): shards.full[id(p)].clone() for p in policy.parameters()}
    for p in policy.parameters():
        shards.full[id(p)] += 1.0
    assert mom.distance() > 0
    mom.maybe_update(1)
    for p_theta, p_phi in zip(policy.parameters(), copy.parameters(), strict=True):
        torch.testing.assert_close(shards.full[id(p_phi)], theta0[id(p_theta)] + 0.25)
        assert p_phi.numel() == 0 and p_theta.numel() == 0  # re-sharded after the update
    assert mom.num_momentum_parameters() == 3 * 2 + 2
    assert shards.gathers >= 4


def test_state_dict_round_trip() -> None:
    policy = nn.Linear(4, 2)
    mom = FullCopyMomentum(policy, MomentumSettings(m=0.5, variant="generator_only"))
    with torch.no_grad():
        policy.weight.add_(1.0)
    mom.maybe_update(1)
    state = mom.state_dict()
    other = FullCopyMomentum(nn.Linear(4, 2), MomentumSettings(m=0.5, variant="generator_only"))
    other.load_state_dict(state)
    for slot in ("ema", "frozen"):
        torch.testing.assert_close(other.copies[slot].weight, mom.copies[slot].weight)
    assert other.updates == 1 and other.last_update_step == 1
    with pytest.raises(ConfigError, match="slot"):
        FullCopyMomentum(nn.Linear(4, 2), MomentumSettings(variant="judge_only")).load_state_dict(
            {"slots": {"ema": state["slots"]["ema"]}}
        )


def test_callback_updates_logs_and_restores(tmp_path) -> None:
    """Drive MomentumCallback through real Trainer events (a tiny Trainer on a tiny regression)."""
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    from captionrl.train.run.callbacks import MOMENTUM_STATE, MomentumCallback

    class Reg(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 1)

        def forward(self, x, y):
            return {"loss": ((self.lin(x).squeeze(-1) - y) ** 2).mean()}

    torch.manual_seed(0)
    data = Dataset.from_dict({"x": [[1.0, 2.0], [0.5, -1.0]] * 4, "y": [3.0, -1.0] * 4})
    def make_args() -> TrainingArguments:
        return TrainingArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=2,
                                 learning_rate=0.1, logging_steps=1, save_steps=2, report_to=[], use_cpu=True,
                                 seed=0, disable_tqdm=True)

    args = make_args()
    model = Reg()
    mom = FullCopyMomentum(model, MomentumSettings(m=0.5, interval=2))
    seen: list[torch.Tensor] = []

    class Spy(MomentumCallback):
        def on_step_end(self, args, state, control, **kw):
            super().on_step_end(args, state, control, **kw)
            seen.append((state.global_step, model.lin.weight.detach().clone(), mom.copies["ema"].lin.weight.clone()))

    trainer = Trainer(model=model, args=args, train_dataset=data)
    Spy(mom).attach(trainer)
    trainer.train()
    assert mom.updates == 2
    phi = seen[0][2]
    for step, theta, got in seen:
        if step % 2 == 0:
            phi = 0.5 * phi + 0.5 * theta
        torch.testing.assert_close(got, phi)
    dist = [r["momentum/distance"] for r in trainer.state.log_history if "momentum/distance" in r]
    assert len(dist) == 4 and all(d > 0 for d in dist)
    assert (tmp_path / "momentum.jsonl").exists()
    assert (tmp_path / "checkpoint-2" / MOMENTUM_STATE).exists()

    # resume from step 2: the momentum copy comes back from the checkpoint, not from the Policy
    args2 = make_args()
    model2 = Reg()
    mom2 = FullCopyMomentum(model2, MomentumSettings(m=0.5, interval=2))
    trainer2 = Trainer(model=model2, args=args2, train_dataset=data)
    MomentumCallback(mom2).attach(trainer2)
    trainer2.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    torch.testing.assert_close(mom2.copies["ema"].lin.weight, mom.copies["ema"].lin.weight)
    assert math.isclose(mom2.distance(), mom.distance(), rel_tol=1e-5)

    # a momentum built on another module than the one being trained is refused, not silently idle
    trainer3 = Trainer(model=Reg(), args=make_args(), train_dataset=data)
    MomentumCallback(FullCopyMomentum(Reg(), MomentumSettings())).attach(trainer3)
    with pytest.raises(ConfigError, match="different module"):
        trainer3.train()


def test_plot_curves(tmp_path) -> None:
    from captionrl.errors import DataError
    from captionrl.train.run.curves import plot_curves

    rows = [{"step": s, "reward": 0.5 + 0.01 * s, "frac_reward_zero_std": 0.1, "momentum/distance": 0.01 * s}
            for s in range(1, 21)]
    out = tmp_path / "curves.png"
    counts = plot_curves(rows, path=out)
    assert counts == {"reward": 20, "frac_reward_zero_std": 20, "momentum/distance": 20}
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    jl = tmp_path / "log.jsonl"
    jl.write_text("\n".join(__import__("json").dumps(r) for r in rows) + "\n")
    assert plot_curves(jl, keys=["reward"], path=tmp_path / "r.png") == {"reward": 20}
    with pytest.raises(DataError, match="none of them"):
        plot_curves(rows, keys=["loss"], path=tmp_path / "x.png")


@pytest.mark.long  # LoRA momentum inside TRL's GRPO: test_rehearsal_moco.py and the moco-zero3 rehearsal in the default tier
def test_lora_momentum_inside_trl_grpo(tmp_path) -> None:
    """The whole loop in TRL: GRPO trains a LoRA Policy, the reward serves the Judge from the momentum
    adapter, the callback applies the EMA after each optimizer step and logs the distance."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from captionrl.embedded import embedded_model_dir
    from captionrl.train.run.callbacks import MomentumCallback

    tok = AutoTokenizer.from_pretrained(embedded_model_dir())
    tok.pad_token = tok.pad_token or tok.eos_token
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id))
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Describe item {i}."}]} for i in range(8)])
    box: dict = {}
    served: list = []

    def judge_reward(prompts, completions, **kw):
        with box["mom"].serving("judge") as m:
            served.append((m.active_adapter, m.training))
        return [float(len(c[-1]["content"]) % 7) for c in completions]

    args = GRPOConfig(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=8, use_cpu=True, bf16=False, gradient_checkpointing=False,
                      report_to="none", logging_steps=1, save_strategy="no", learning_rate=1e-2, beta=0.0,
                      seed=0, disable_tqdm=True)
    trainer = GRPOTrainer(model=model, reward_funcs=[judge_reward], args=args, train_dataset=data,
                          processing_class=tok,
                          peft_config=LoraConfig(r=2, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    interval = reward_interval_steps(args.steps_per_generation, args.num_iterations, args.gradient_accumulation_steps)
    mom = build_momentum(trainer.model, MomentumSettings(m=0.5, interval=interval, reward_interval=interval))
    box["mom"] = mom
    snaps: list = []

    class Spy(TrainerCallback):  # runs after MomentumCallback (attach puts that one first)
        def on_train_begin(self, args, state, control, **kw):
            snaps.append({n: p.detach().clone() for n, p in lora_params(trainer.model, "default").items()})

        def on_step_end(self, args, state, control, **kw):
            snaps.append({n: p.detach().clone() for n, p in lora_params(trainer.model, "default").items()})

    MomentumCallback(mom).attach(trainer)
    trainer.add_callback(Spy())
    trainer.train()
    assert served == [("momentum", False)] * 3 and trainer.model.active_adapter == "default"
    assert mom.updates == 3
    expected = dict(snaps[0])
    for theta in snaps[1:]:
        expected = {n: 0.5 * expected[n] + 0.5 * theta[n] for n in theta}
    assert any(not torch.equal(snaps[0][n], snaps[-1][n]) for n in expected), "the Policy adapter trained"
    for n, p in lora_params(trainer.model, "momentum").items():
        torch.testing.assert_close(p, expected[n])
    logged = [r for r in trainer.state.log_history if "momentum/distance" in r]
    assert len(logged) == 3 and all("reward" in r for r in logged)
