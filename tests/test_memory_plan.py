"""The GPU memory plan (``captionrl plan``, ``captionrl.memory_plan``): its formulas against their sources,
the papers' models against their published sizes, every paper preset at the scale docs/gpu.md gives it,
and the plans that must be refused, each naming its fix."""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path

import pytest

from captionrl.cli import main
from captionrl.commands.plan import PlanConfig, make_plan
from captionrl.errors import ConfigError
from captionrl.memory_plan import (
    KNOWN_MODELS,
    ModelShape,
    Parallel,
    PlanInputs,
    model_shape,
    plan,
    read_accelerate_config,
)

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


def _preset(name: str) -> str:
    return str(CONFIGS / name)


# ---------------------------------------------------------------------- formulas and shapes
def test_zero_stages_reproduce_the_zero_papers_figure_1():
    """Rajbhandari et al. (SC 2020), Figure 1: Psi = 7.5B, N = 64, K = 12 -> 120, 31.4, 16.6 and 1.9 GB per
    device for the baseline, P_os, P_os+g and P_os+g+p."""
    shape = ModelShape("7.5B", "ZeRO paper", int(7.5e9), layers=1, hidden=1, kv_heads=1, head_dim=1, max_context=1)
    got = []
    for stage in (0, 1, 2, 3):
        p = plan(PlanInputs("zero", shape, Parallel(64, True, stage), gpu_gib=1e6), suggest=False)
        states = sum(r.gib for r in p.rows if r.name in ("weights (7.50B parameters)", "gradients", "optimizer states"))
        got.append(round(states * 2**30 / 1e9, 1))
    assert got == [120.0, 31.4, 16.6, 1.9]


@pytest.mark.parametrize("hub", list(KNOWN_MODELS))
def test_the_papers_models_have_their_published_sizes(hub):
    """The stored config.json fields build the architecture whose parameter count the hub page shows."""
    shape = model_shape(hub)
    published = KNOWN_MODELS[hub]["published"]
    digits = len(published.removesuffix("B").split(".")[1])
    assert f"{round(shape.params / 1e9, digits):.{digits}f}B" == published, (shape.params, published)


def test_kv_cache_and_image_tokens_of_the_papers_policies():
    q3 = model_shape("Qwen/Qwen3-VL-8B-Instruct")
    assert (q3.kv_bytes_per_token(), q3.max_context) == (2 * 36 * 8 * 128 * 2, 262144)
    assert q3.max_context * q3.kv_bytes_per_token() / 2**30 == pytest.approx(36.0)  # the 36 GiB
    assert q3.image_tokens(1024, 1024) == 1024 and q3.max_image_tokens() == 16384
    q25 = model_shape("Qwen/Qwen2.5-VL-3B-Instruct")
    assert q25.image_tokens(600, 300) == 11 * 21  # 308x588 after smart_resize, 28-pixel tokens
    assert q25.max_image_tokens() == 16384


def test_lora_count_is_peft_s(tmp_path):
    """r x (in + out) over the linear layers PEFT targets, for all-linear and for a name list."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    shape = model_shape(str(tmp_path))
    for targets in ("all-linear", ["q_proj", "v_proj"]):
        model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=4, target_modules=targets))
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
        assert shape.lora_params(4, targets) == trained, targets


def test_accelerate_configs_give_stage_offload_and_processes():
    z3 = read_accelerate_config(CONFIGS / "accelerate" / "multi-gpu-zero3.yaml")
    assert (z3.deepspeed, z3.zero_stage, z3.processes, z3.offload_optimizer) == (True, 3, 8, False)
    assert read_accelerate_config(CONFIGS / "accelerate" / "multi-gpu-zero2.yaml", processes=4).processes == 4
    ddp = read_accelerate_config(CONFIGS / "accelerate" / "multi-gpu-ddp.yaml")
    assert (ddp.deepspeed, ddp.processes) == (False, 8)


# ---------------------------------------------------------------------- every preset at its documented scale
SCALES = {
    # docs/gpu.md, "Memory plan": the preset, the plan's settings, the card
    "lineup node H200": ("lineup-paper.yaml", {"gpus": 4}, 141),
    "lineup node H100": ("lineup-paper.yaml", {"gpus": 4}, 80),
    "lineup one H200": ("lineup-paper.yaml", {"gpus": 1, "overrides": ["train.vllm_gpu_memory_utilization=0.1"],
                                              "served": ["Qwen/Qwen2.5-14B-Instruct@0.25"]}, 141),
    "rubicap node H200": ("rubicap-paper.yaml", {"gpus": 4}, 141),
    "rubicap one H200": ("rubicap-paper.yaml", {"accelerate": "none", "overrides": [
        "policy.lora=true", "train.vllm_gpu_memory_utilization=0.2"], "served": ["Qwen/Qwen2.5-7B-Instruct@0.25"]}, 141),
    "moco node H200": ("moco-paper.yaml", {"gpus": 7}, 141),
    "moco one H200": ("moco-paper.yaml", {"accelerate": "none", "overrides": ["policy.lora=true", "train.vllm_mode=colocate"]}, 141),
    "moco one H100": ("moco-paper.yaml", {"accelerate": "none", "overrides": ["policy.lora=true", "train.vllm_mode=colocate"]}, 80),
    "moco-sft node H200": ("moco-sft-paper.yaml", {"gpus": 8}, 141),
}


@pytest.mark.parametrize("scale", list(SCALES))
def test_every_paper_preset_fits_its_documented_scale(scale):
    preset, kw, gib = SCALES[scale]
    result = make_plan(PlanConfig(preset=_preset(preset), gpu_memory=gib, **kw))
    assert result.fits, result.table()
    assert result.total <= 0.9 * gib  # at least 10% of the card free: the estimates' margin
    if result.inputs.vllm is not None and result.inputs.vllm.mode == "colocate":  # vLLM can start: one sequence fits
        assert result.inputs.vllm.max_model_len is not None


NO_LONGER_FIT = {
    # docs/gpu.md says each of these does not fit, and what to do instead
    "rubicap node H100": ("rubicap-paper.yaml", {"gpus": 4}, 80),
    "rubicap one H100": ("rubicap-paper.yaml", {"accelerate": "none", "overrides": [
        "policy.lora=true", "train.vllm_gpu_memory_utilization=0.2"], "served": ["Qwen/Qwen2.5-7B-Instruct@0.25"]}, 80),
    "moco node H100": ("moco-paper.yaml", {"gpus": 7}, 80),
    "moco-sft node H100": ("moco-sft-paper.yaml", {"gpus": 8}, 80),
    "lineup one H200 at the old shares": ("lineup-paper.yaml", {"gpus": 1, "overrides": [
        "train.vllm_gpu_memory_utilization=0.15"], "served": ["Qwen/Qwen2.5-14B-Instruct@0.3"]}, 141),
}


@pytest.mark.parametrize("scale", list(NO_LONGER_FIT))
def test_presets_that_leave_less_than_a_tenth_free_are_refused(scale):
    preset, kw, gib = NO_LONGER_FIT[scale]
    result = make_plan(PlanConfig(preset=_preset(preset), gpu_memory=gib, **kw))
    assert not result.fits and result.problems, result.table()


def test_the_terms_an_h100_fills_with():
    """Qwen's gated MLP (I = 5.3 h) stores (17·h + 8·I)·s·b per layer, not 34·s·b·h; DeepSpeed's step holds the
    gradient partition in float32 (4 Psi / N) while the activations are gone, so the total takes the larger of the
    two phases; fragmentation is an allowance on the training's tensors; vLLM's profiling peak and CUDA graphs come
    out of its share; a natural-image preset says what an image at the processor's maximum would add."""
    result = make_plan(PlanConfig(preset=_preset("rubicap-paper.yaml"), gpus=4, gpu_memory=141))
    rows = {r.name: r for r in result.rows}
    pol = result.inputs.policy
    assert pol.intermediate == 18944 and pol.hidden == 3584
    act = rows["activations (loss pass)"]
    assert act.phase == "loss" and "(17·h + 8·I)·s·b" in act.how
    step = rows["float32 gradient partition"]
    assert step.phase == "step" and step.gib == pytest.approx(pol.params * 4 / 4 / 2**30)
    held = sum(r.gib for r in result.rows if r.summed and not r.phase)
    assert result.total == pytest.approx(held + max(act.gib, step.gib))
    assert rows["allocator fragmentation"].kind == "allowance" and rows["allocator fragmentation"].gib > 0
    assert rows["  of which profiling peak, CUDA graphs"].gib > 1.0  # 1 GiB of graphs and a forward's peak
    assert any("the processor allows 16,384" in w for w in result.warnings)


def test_every_served_engine_is_planned_at_its_context():
    """Qwen3-VL-30B-A3B on one 80 GB card: 58 GiB of weights, and without --max-model-len vLLM sizes the KV cache
    for one 262,144-token sequence (24 GiB) that its 0.9 share cannot hold: refused, naming the flag; at the
    launch scripts' 18,432 tokens it fits. Servers that share a GPU add up."""
    from captionrl.memory_plan import ServerSpec, plan_server, plan_servers

    bare = plan_server(ServerSpec.parse("qwen3|Qwen/Qwen3-VL-30B-A3B-Instruct|5|"), 80)
    assert not bare.fits and "262,144" in bare.problems[0][1] and "24.0 GiB" in bare.problems[0][1]
    assert "--max-model-len" in bare.problems[0][2]
    sized = plan_server(ServerSpec.parse("qwen3|Qwen/Qwen3-VL-30B-A3B-Instruct|5|--max-model-len 18432"), 80)
    assert sized.fits, sized.table()
    judge = plan_server(ServerSpec.parse("judge|Qwen/Qwen2.5-72B-Instruct|0,1,2,3|--tensor_parallel_size 4 --max_model_len 8192"), 80)
    assert judge.fits and judge.spec.tensor_parallel == 4
    assert not plan_server(ServerSpec.parse("judge|Qwen/Qwen2.5-72B-Instruct|0,1|--tensor-parallel-size 4 --max-model-len 8192"), 80).fits
    _, shared = plan_servers([ServerSpec.parse("a|microsoft/phi-4|0|--max-model-len 16384 --gpu-memory-utilization 0.5"),
                              ServerSpec.parse("b|THUDM/glm-4-9b-chat-hf|0|--max-model-len 16384 --gpu-memory-utilization 0.5")], 141)
    assert shared and "GPU 0" in shared[0][1]


def test_the_presets_as_they_were_are_refused_naming_the_fix():
    """Issue 33's evidence: MoCo under colocate with no vllm_max_model_length asks for Qwen3-VL-8B's 262,144
    tokens (36 GiB of KV) in a 0.3 share that holds 16 GiB of weights: vLLM would refuse at start."""
    with pytest.raises(ConfigError) as err:
        make_plan(PlanConfig(preset=_preset("moco-paper.yaml"), gpus=8, overrides=[
            "policy.lora=true", "train.vllm_mode=colocate", "train.vllm_max_model_length=null"])).check()
    assert err.value.field == "train.vllm_max_model_length"
    assert "262,144" in err.value.problem and "36.0 GiB" in err.value.problem
    assert "train.vllm_max_model_length=" in err.value.fix


def test_moco_sft_float32_in_one_process_is_refused_naming_the_fix(capsys):
    """8.77B parameters trained in float32 by one process: 16 bytes each plus autocast's bf16 copy. The
    command prints the plan, exits non-zero, and names fixes that were re-planned to fit."""
    code = main(["plan", "--config", _preset("moco-sft-paper.yaml"), "--accelerate", "none",
                 "--set", "policy.dtype=float32", "--gpu-memory", "141"])
    out, err = capsys.readouterr()
    assert code == 2 and "does NOT fit" in out
    assert "error: ConfigError: gpu_memory=" in err and "more than the card's 141 GiB" in err
    assert "policy.lora=true" in err and "DeepSpeed ZeRO-2" in err
    assert "| autocast bf16 weight cache | 16.3 |" in out  # 8.77B x 2 B
    assert "| optimizer states | 65.3 |" in out  # 2 moments x 4 B x 8.77B: torch AdamW in float32


def test_a_context_shorter_than_the_longest_prompt_is_refused():
    """An image recipe's prompt can carry the processor's largest image (16,384 tokens): vLLM would reject it."""
    with pytest.raises(ConfigError) as err:
        make_plan(PlanConfig(preset=_preset("rubicap-paper.yaml"), gpus=4, overrides=["train.vllm_max_model_length=4096"])).check()
    assert err.value.field == "train.vllm_max_model_length" and "=18432" in err.value.fix


def test_a_colocated_share_that_cannot_hold_the_weights_is_refused():
    with pytest.raises(ConfigError) as err:
        make_plan(PlanConfig(preset=_preset("lineup-paper.yaml"), gpus=4, gpu_memory=80,
                             overrides=["train.vllm_gpu_memory_utilization=0.05"])).check()
    assert err.value.field == "train.vllm_gpu_memory_utilization" and "raise" in err.value.fix


def test_half_precision_full_fine_tune_without_deepspeed_is_refused_as_the_run_would():
    """The plan agrees with the run's master-weights check (train/run/gpu_checks.py): bf16 weights, AdamW, no
    DeepSpeed is refused whatever the memory says."""
    result = make_plan(PlanConfig(preset=_preset("lineup-paper.yaml"), accelerate="none"))
    assert [f for f, _p, _x in result.problems] == ["policy.dtype"] and "DeepSpeed" in result.problems[0][2]


def test_full_copy_momentum_under_zero3_is_refused():
    with pytest.raises(ConfigError, match="FullCopyMomentum"):
        make_plan(PlanConfig(preset=_preset("moco-paper.yaml"), gpus=8,
                             accelerate=str(CONFIGS / "accelerate" / "multi-gpu-zero3.yaml"))).check()


def test_plan_command_prints_json_and_reads_the_named_launch(capsys):
    import json

    assert main(["plan", "--config", _preset("lineup-paper.yaml"), "--gpus", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fits"] and out["gpu_gib"] == 141.0
    names = [r["name"] for r in out["rows"]]
    assert "ZeRO buckets" in names and "reference model (KL)" not in names  # ZeRO-2 from the launch line; KL 0


# ---------------------------------------------------------------------- the check at the start of a run
def test_run_start_check_refuses_on_cuda_and_stays_off_on_cpu(monkeypatch):
    """On CUDA (CUDA's answers faked: there is no GPU here) a run that does not fit stops before anything
    loads, ``train.memory_plan: warn`` goes on; a CPU run is never planned."""
    import torch

    from captionrl.config import load_config
    from captionrl.train.moco_sft import MocoSFTConfig
    from captionrl.train.run.memory_check import check_run_memory

    cfg = load_config(MocoSFTConfig, CONFIGS / "moco-sft-paper.yaml", ["policy.dtype=float32"])
    args = types.SimpleNamespace(use_cpu=False, deepspeed_plugin=None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (140 * 2**30, 141 * 2**30))
    with pytest.raises(ConfigError, match="more than the card"):
        check_run_memory(cfg, args)
    warned = check_run_memory(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, memory_plan="warn")), args)
    assert warned is not None and not warned.fits
    assert any(r.name == "already in use on the GPU" and r.gib == pytest.approx(1.0) for r in warned.rows)
    assert check_run_memory(cfg, types.SimpleNamespace(use_cpu=True, deepspeed_plugin=None)) is None


def test_train_memory_plan_mode_is_validated():
    from captionrl.config import load_config
    from captionrl.train.lineup import LineupConfig

    with pytest.raises(ConfigError) as err:
        load_config(LineupConfig, CONFIGS / "lineup-cpu.yaml", ["train.memory_plan=maybe"])
    assert err.value.field == "train.memory_plan"


def test_json_plan_of_servers_is_one_json_object(capsys):
    """`captionrl plan --json --server ...` prints one JSON object (a script reads it), with or without a preset."""
    import json

    from captionrl.commands.plan import run_command

    server = "verifier|microsoft/phi-4|0|--max-model-len 16384 --gpu-memory-utilization 0.5"
    assert run_command(PlanConfig(servers=[server], gpu_memory=141, json=True)) == 0
    alone = json.loads(capsys.readouterr().out)
    assert alone["servers"][0]["server"] == "verifier" and alone["servers"][0]["fits"] is True
    assert run_command(PlanConfig(preset=_preset("lineup-paper.yaml"), servers=[server], gpu_memory=141, json=True)) == 0
    both = json.loads(capsys.readouterr().out)
    assert both["fits"] is True and both["servers"][0]["model"] == "microsoft/phi-4"
