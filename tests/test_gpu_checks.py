"""GPU-only mistakes are refused before any model loads, with the setting to change: bf16 weights
trained without master weights, vLLM rollouts without vLLM (or without a GPU), and a vLLM server on a
verifier's port. The arguments checked are the real TRL configs the run would build."""

from __future__ import annotations

import importlib.util

import pytest

from captionrl.backends import BackendConfig
from captionrl.errors import ConfigError
from captionrl.train.run.builder import trainer_args
from captionrl.train.run.gpu_checks import check_master_weights, check_vllm, check_vllm_port
from captionrl.train.run.sections import PolicyConfig, TrainConfig
from presets import ON_CPU

CPU = {"use_cpu": True, "bf16": False, "gradient_checkpointing": False, "report_to": []}
VERIFIER = (BackendConfig(kind="openai", model="v", base_url="http://127.0.0.1:8000/v1"), "verifier")
JUDGE = (BackendConfig(kind="openai", model="j", base_url="http://localhost:8001/v1"), "judge")


def _args(tmp_path, **train):
    return trainer_args(TrainConfig(out_dir=str(tmp_path), **{**CPU, **train}), seed=0)


def test_bf16_full_fine_tune_without_master_weights_is_refused(tmp_path):
    args = _args(tmp_path)
    with pytest.raises(ConfigError) as exc:
        check_master_weights(args, PolicyConfig(dtype="bfloat16", lora=False))
    msg = str(exc.value)
    assert "policy.dtype" in msg and "bfloat16" in msg and "round" in msg
    assert "multi-gpu-zero2.yaml" in msg and "policy.dtype: float32" in msg and "policy.lora: true" in msg
    with pytest.raises(ConfigError, match="float16"):
        check_master_weights(args, PolicyConfig(dtype="float16"))


@pytest.mark.parametrize("policy", [PolicyConfig(dtype="float32"), PolicyConfig(dtype="auto"),
                                    PolicyConfig(dtype="bfloat16", lora=True)],
                         ids=["float32", "auto", "bf16-lora"])
def test_weights_with_a_float32_master_pass(tmp_path, policy):
    check_master_weights(_args(tmp_path), policy)  # float32 weights, or float32 LoRA adapters


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs deepspeed (the dev extra)")
def test_bf16_full_fine_tune_under_deepspeed_passes(tmp_path, monkeypatch):
    # what `accelerate launch --config_file configs/accelerate/multi-gpu-zero2.yaml` sets for the trainer
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
    args = _args(tmp_path)
    assert args.deepspeed_plugin is not None
    check_master_weights(args, PolicyConfig(dtype="bfloat16", lora=False))  # ZeRO keeps float32 masters


def test_attention_implementation_is_checked_before_weights_load(monkeypatch):
    """flash_attention_2 without its package is refused with both ways out; an unknown name on load."""
    from captionrl.train.run.loading import attn_kw, check_attn_implementation

    with pytest.raises(ConfigError) as err:
        PolicyConfig(attn_implementation="flash")
    assert err.value.field == "policy.attn_implementation"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flash_attn" else object())
    with pytest.raises(ConfigError, match="flash-attn") as err:
        check_attn_implementation("flash_attention_2")
    assert "sdpa" in err.value.fix
    check_attn_implementation("sdpa")
    assert attn_kw(PolicyConfig(attn_implementation="sdpa")) == {"attn_implementation": "sdpa"} and attn_kw(PolicyConfig()) == {}


def test_vllm_rollouts_name_the_extra_or_the_cpu(tmp_path, monkeypatch):
    monkeypatch.setattr("captionrl.train.run.gpu_checks.vllm_installed", lambda: False)
    with pytest.raises(ConfigError) as exc:
        check_vllm(_args(tmp_path, use_vllm=True, use_cpu=False))
    assert "train.use_vllm" in str(exc.value) and ".[gpu]" in str(exc.value) and "setup.sh --gpu" in str(exc.value)
    with pytest.raises(ConfigError, match="CUDA GPU"):
        check_vllm(_args(tmp_path, use_vllm=True))  # use_cpu: a CPU run cannot host vLLM
    check_vllm(_args(tmp_path, use_vllm=False))


def test_vllm_server_port_must_not_be_a_verifier_port(tmp_path):
    clash = _args(tmp_path, use_vllm=True, vllm_mode="server", use_cpu=False)  # TRL's default port: 8000
    with pytest.raises(ConfigError) as exc:
        check_vllm_port(clash, [JUDGE, VERIFIER])
    msg = str(exc.value)
    assert "train.vllm_server_port" in msg and "8000" in msg and "verifier" in msg and "vllm_server_port" in msg
    with pytest.raises(ConfigError, match="judge"):  # localhost and 127.0.0.1 are one host
        check_vllm_port(_args(tmp_path, use_vllm=True, vllm_mode="server", vllm_server_port=8001),
                        [VERIFIER, JUDGE])
    with pytest.raises(ConfigError, match="verifier"):  # a base URL counts the same as host + port
        check_vllm_port(_args(tmp_path, use_vllm=True, vllm_mode="server",
                              vllm_server_base_url="http://localhost:8000"), [VERIFIER])
    check_vllm_port(_args(tmp_path, use_vllm=True, vllm_mode="server", vllm_server_port=8010),
                    [VERIFIER, JUDGE])
    check_vllm_port(_args(tmp_path, use_vllm=True, vllm_mode="colocate"), [VERIFIER])  # colocate opens no port
    remote = (BackendConfig(kind="openai", model="r", base_url="https://api.example.com:8000/v1"), "committee[0]")
    check_vllm_port(clash, [remote])  # another host's 8000 is not ours


def test_the_run_stops_before_any_model_loads(tmp_path, monkeypatch, capsys):
    """Through the command: the paper preset on one plain process, bf16 full fine-tune, refused first."""
    from pathlib import Path

    from captionrl.cli import main

    monkeypatch.setenv("CAPTIONRL_FORBID_MODEL_CALLS", "1")  # a model load would fail the test differently
    root = Path(__file__).resolve().parents[1]
    code = main(["train", "lineup", "--config", str(root / "configs" / "lineup-paper.yaml"), *ON_CPU,
                 "train.gradient_checkpointing=false", f"train.out_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 2 and "policy.dtype" in err and "master weights" in err, err  # not the verifier probe's error


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs deepspeed (the dev extra)")
def test_models_a_process_loads_for_itself_are_never_zero3_partitioned(tmp_path, monkeypatch):
    """A ZeRO-3 run's trainer arguments register zero.Init with transformers; an in-process verifier or a
    checkpoint rank 0 evaluates must load plain inside ``no_zero3_init`` (the ZeRO-3 rehearsal runs both)."""
    from transformers.integrations import is_deepspeed_zero3_enabled

    from captionrl.devices import no_zero3_init

    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    args = trainer_args(TrainConfig(out_dir=str(tmp_path), **CPU), seed=0)
    assert args.deepspeed_plugin is not None
    if not is_deepspeed_zero3_enabled():
        pytest.skip("accelerate registered no ZeRO-3 config with transformers here")
    with no_zero3_init():
        assert not is_deepspeed_zero3_enabled()
    assert is_deepspeed_zero3_enabled()  # restored for the policy and the trainer
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()  # leave no ZeRO-3 registration to the next test
