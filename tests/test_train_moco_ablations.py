"""``train moco`` ablations: the momentum's initialisation (``momentum.init``, Table 3) is checked before any
model loads, and one-step CPU runs log the distance to the initial weights (Figure 4) with either
initialisation; the separate one really starts the Generator-Judge from another checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from captionrl.config import load_config
from captionrl.errors import ConfigError
from captionrl.records import read_jsonl
from captionrl.train.moco import MocoConfig, run

ROOT = Path(__file__).resolve().parents[1]
CPU = ROOT / "configs" / "moco-cpu.yaml"
ONE_STEP = ["data.n_train=1", "train.max_completion_length=8", "rubric.max_new_tokens=8", "rubric.max_attempts=1",
            "train.threads=1", "train.max_steps=1", "train.save_steps=100", "train.preflight_items=0",
            # the distances' mechanics, not a model: the 2-layer random Qwen2.5-VL (the tiny VLM's language model
            # is the whole 135M), at a rate whose one step moves its small adapter far above the metrics' 1e-6
            # rounding, so the 1% EMA check below holds to 1e-3
            "policy.model=tiny-qwen2.5-vl", "train.learning_rate=5.0e-3"]
KEYS = ("momentum/policy_to_initial", "momentum/policy_to_initial_l2", "momentum/momentum_to_initial",
        "momentum/momentum_to_initial_l2")


@pytest.mark.parametrize(("overrides", "field", "says"), [
    (["momentum.init=split"], "momentum.init", "choices: shared, separate"),
    (["momentum.init=separate"], "momentum.init_from", "needs"),
    (["momentum.init_from=/tmp"], "momentum.init_from", "only read"),
    (["momentum.init=separate", "momentum.init_from=/no/such/folder"], "momentum.init_from", "not found"),
])
def test_bad_init_names_the_field(overrides, field, says, monkeypatch):
    monkeypatch.setenv("CAPTIONRL_FORBID_MODEL_CALLS", "1")
    with pytest.raises(ConfigError) as err:
        load_config(MocoConfig, CPU, overrides)
    assert err.value.field == field and says in str(err.value)


def test_init_from_must_fit_the_momentum_implementation(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPTIONRL_FORBID_MODEL_CALLS", "1")
    full, adapter = tmp_path / "full", tmp_path / "adapter"
    full.mkdir()
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"momentum\.implementation: full_copy"):  # LoRA Policy, full model
        load_config(MocoConfig, CPU, ["momentum.init=separate", f"momentum.init_from={full}"])
    with pytest.raises(ConfigError, match="is a LoRA adapter"):
        load_config(MocoConfig, CPU, ["policy.lora=false", "momentum.init=separate", f"momentum.init_from={adapter}"])
    ok = load_config(MocoConfig, CPU, ["momentum.init=separate", f"momentum.init_from={full}", "momentum.implementation=full_copy"])
    assert ok.momentum.init == "separate"


def _role_adapter(cfg: MocoConfig, folder: Path) -> Path:
    """A LoRA adapter of the Policy's own configuration with non-zero factors: a stand-in for a
    Generator-Judge SFT trained apart from the Policy."""
    import torch
    from peft import get_peft_model

    from captionrl.train.run import loading, sections

    base, _processing, _vlm = loading.load_policy(sections.PolicyConfig(model=cfg.policy.model))
    torch.manual_seed(3)
    model = get_peft_model(base, loading.lora_config(cfg.policy))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)
    model.save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_every_moco_run_logs_distance_to_initial_and_separate_init_starts_elsewhere(tmp_path):
    runs = {}
    for init in ("shared", "separate"):
        extra = []
        if init == "separate":
            cfg = load_config(MocoConfig, CPU, ONE_STEP)
            extra = ["momentum.init=separate", f"momentum.init_from={_role_adapter(cfg, tmp_path / 'role-sft')}"]
        out = tmp_path / init
        res = run(load_config(MocoConfig, CPU, [*ONE_STEP, f"train.out_dir={out}", *extra]))
        metrics = [r for r in read_jsonl(out / "metrics.jsonl") if "reward" in r]
        assert [r["step"] for r in metrics] == [1] and all(k in metrics[0] for k in KEYS)
        logged = list(read_jsonl(out / "checkpoints" / "momentum.jsonl"))
        assert all(k in logged[-1] for k in KEYS)
        assert res["curve_points"]["momentum/policy_to_initial"] == 1  # drawn into curves.png
        assert res["momentum"]["init"] == init
        runs[init] = metrics[0]
        print(f"\n{init}: " + json.dumps({k: v for k, v in metrics[0].items() if k.startswith("momentum/")}))
    shared, separate = runs["shared"], runs["separate"]
    # shared: one real update moved the Policy, and the EMA (m = 0.99) followed 1% of the way
    assert shared["momentum/policy_to_initial"] > 0
    assert shared["momentum/momentum_to_initial_l2"] == pytest.approx(0.01 * shared["momentum/policy_to_initial_l2"], rel=1e-3)
    # separate: the Generator-Judge started from the other adapter, far from the Policy ...
    assert separate["momentum/distance"] > 10 * shared["momentum/distance"]
    # ... and the EMA pulled it 1% toward the Policy: ||phi_1 - phi_0|| = 0.01/0.99 * ||theta - phi_1||
    theta_norm = shared["momentum/policy_to_initial_l2"] / shared["momentum/policy_to_initial"]  # same seeded adapter
    assert separate["momentum/momentum_to_initial_l2"] == pytest.approx(
        0.01 / 0.99 * separate["momentum/distance"] * theta_norm, rel=2e-2)
