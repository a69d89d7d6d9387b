"""``train.freeze_layers``: RL that leaves the embeddings and the bottom blocks exactly as they were."""

from __future__ import annotations

from pathlib import Path

import pytest

from captionrl.config import load_config
from captionrl.errors import ConfigError
from captionrl.train.lineup import LineupConfig

ROOT = Path(__file__).resolve().parents[1]


def test_freeze_layers_is_validated_and_refused_with_lora(tmp_path):
    from captionrl.train.run.freezing import check_freeze_settings

    with pytest.raises(ConfigError) as err:
        load_config(LineupConfig, None, ["train.freeze_layers=-1"])
    assert err.value.field == "train.freeze_layers"
    cfg = load_config(LineupConfig, None, ["train.freeze_layers=2", "policy.lora=true"])
    with pytest.raises(ConfigError, match="LoRA adapters train already"):
        check_freeze_settings(cfg)
    check_freeze_settings(load_config(LineupConfig, None, ["train.freeze_layers=2"]))  # full fine-tuning: fine


@pytest.mark.slow
def test_rl_with_the_bottom_frozen_moves_only_the_top(tmp_path, embedded_backend, tiny_llama):
    """Two real RLOO steps of the tiny policy with ``train.freeze_layers=1``: the saved model's embeddings and
    bottom block equal the initial weights bit for bit, and its top block moved (so the test can fail both ways)."""
    import torch
    from transformers import AutoModelForCausalLM

    from captionrl.train import lineup
    from captionrl.train.run.freezing import transformer_blocks
    from test_train_lineup import TINY

    out = tmp_path / "run"
    cfg = load_config(LineupConfig, ROOT / "configs" / "lineup-cpu.yaml", [*TINY, f"policy.model={tiny_llama}", f"train.out_dir={out}",
                                           "train.freeze_layers=1", "train.learning_rate=1.0e-3", "eval.enabled=false"])
    result = lineup.run(cfg, verifier=embedded_backend)
    before = AutoModelForCausalLM.from_pretrained(tiny_llama)
    after = AutoModelForCausalLM.from_pretrained(result["model"])
    assert torch.equal(before.get_input_embeddings().weight, after.get_input_embeddings().weight)
    b0, a0 = transformer_blocks(before)[0].state_dict(), transformer_blocks(after)[0].state_dict()
    assert all(torch.equal(b0[k], a0[k]) for k in b0)
    b1, a1 = transformer_blocks(before)[-1].state_dict(), transformer_blocks(after)[-1].state_dict()
    assert any(not torch.equal(b1[k], a1[k]) for k in b1)


def test_evolm_refuses_freeze_layers_before_anything_loads():
    """EvoLM's phases build their own trainers, so the skeleton's freezing would silently not run: refused."""
    from captionrl.train.moco import EvolmRecipe, MocoConfig

    cfg = load_config(MocoConfig, ROOT / "configs" / "moco-cpu.yaml", ["method=evolm", "train.freeze_layers=2"])
    with pytest.raises(ConfigError) as err:
        EvolmRecipe(cfg)
    assert err.value.field == "train.freeze_layers"
