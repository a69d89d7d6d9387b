"""``scripts/gpu_smoke.sh``, the GPU check (issues 22 and 33): on a CPU it refuses at once, in one line; its GPU
plan runs what the presets run (gradient checkpointing, bf16 and vLLM colocated left on, ZeRO-3 with vLLM, the
LineupRL launch script with a served verifier, two ranks over NCCL when two GPUs are there); its CPU
rehearsal changes only what a CPU lacks. The rehearsal's whole run (NOT the GPU check) is in the long tier of
``tests/test_gpu_pins.py``, under the versions a GPU install resolves."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from captionrl.config import load_config
from deepspeed_launch import smoke_script

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["device", "nccl", "lineup-served", "rubicap-zero3", "moco", "gpu-verifier"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_a_joint_past_its_timeout_fails_with_stacks_and_leaves_no_process(tmp_path):
    """The timeout stops the joint's whole process group (a child as well as the joint's first process) and
    the report keeps where each one was: ``accelerate launch``'s ranks used to outlive it."""
    smoke = smoke_script()
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import time\nprint('up', flush=True)\n\ndef waiting_here():\n    time.sleep(600)\n\n"
                       "waiting_here()\n")
    tag = f"smoke-timeout-{os.getpid()}"
    cmd = ["bash", "-c", f"(exec -a {tag} {sys.executable} {sleeper}) & exec -a {tag} {sys.executable} {sleeper}"]
    joint = smoke.run_joint("sleepy", cmd, tmp_path, timeout=10)
    assert not joint.passed and joint.tail.startswith("timed out after 10 s")
    assert joint.tail.count("waiting_here") >= 2, joint.tail  # both processes' stacks
    left = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True).stdout.split()
    assert not left, left


@pytest.mark.skipif("_cuda()", reason="this machine has a CUDA device: the refusal is for machines without one")
def test_without_cuda_the_gpu_check_refuses_in_one_line(tmp_path):
    out = tmp_path / "smoke"
    for cmd in ([sys.executable, str(ROOT / "scripts" / "gpu_smoke.py"), "--out", str(out)],
                ["bash", str(ROOT / "scripts" / "gpu_smoke.sh"), "--no-install", "--out", str(out)]):
        proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
        lines = (proc.stdout + proc.stderr).strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, (cmd, proc.stdout, proc.stderr)
        assert lines[0].startswith("gpu_smoke: no ") and "GPU check" in lines[0] and "--cpu-rehearsal" in lines[0]
        assert not out.exists()  # it ran nothing
    if subprocess.run(["bash", "-c", "command -v nvidia-smi"], capture_output=True).returncode != 0:
        proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_smoke.sh")], cwd=ROOT, env=_env(),
                              capture_output=True, text=True, timeout=60)  # before any install
        assert proc.returncode == 2 and "nothing was installed" in proc.stderr, proc.stderr


def _effective(recipe: str, argv: list[str]):
    """The config a joint's ``captionrl train RECIPE`` command would run with."""
    from captionrl.cli import COMMANDS

    module = __import__(COMMANDS[("train", recipe)][0], fromlist=["CONFIG"])
    words = argv[argv.index("--config") + 2:]
    return load_config(module.CONFIG, argv[argv.index("--config") + 1], [w for w in words if "=" in w])


@pytest.mark.parametrize("gpus", [1, 2])
def test_the_gpu_plan_runs_what_the_presets_run(gpus, tmp_path, monkeypatch):
    """The GPU joints (built here without running them): the presets' trainer settings untouched, ZeRO-3 with
    vLLM colocated, the served verifier through the launch script, NCCL between two ranks when two GPUs exist."""
    from transformers import LlamaConfig

    smoke = smoke_script()
    hf = tmp_path / "smollm2-hf"  # the launch script's memory plan reads the served verifier's config.json
    LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                num_key_value_heads=3, tie_word_embeddings=True).save_pretrained(hf)  # SmolLM2-135M's shape
    monkeypatch.setattr("captionrl.embedded.embedded_model_dir", lambda: hf)
    plan = {name: (cmd, env) for name, cmd, env in smoke.joints(False, tmp_path, gpus)}
    assert list(plan) == NAMES
    nccl = plan["nccl"][0]
    if gpus == 1:
        assert nccl == "one GPU: two ranks need two"
    else:
        assert nccl[1:5] == ["-m", "torch.distributed.run", "--nproc_per_node", "2"]
        assert 'init_process_group("nccl")' in Path(nccl[-1]).read_text()
    for name, recipe, stage in (("rubicap-zero3", "rubicap", "zero3"), ("moco", "moco", "zero2")):
        cmd = plan[name][0]
        assert cmd[cmd.index("--config_file") + 1].endswith(f"configs/accelerate/multi-gpu-{stage}.yaml")
        assert cmd[cmd.index("--num_processes") + 1] == str(min(gpus, 2))
        assert cmd[cmd.index("--config") + 1].endswith(f"configs/{recipe}-paper.yaml")
        cfg = _effective(recipe, cmd)
        t = cfg.train
        assert (t.gradient_checkpointing, t.bf16, t.use_vllm, t.vllm_mode) == (True, True, True, "colocate") and not t.use_cpu
        topology = smoke.TOPOLOGY.get(recipe, [])
        assert not [w for w in cmd if w.split("=")[0] in ("train.gradient_checkpointing", "train.bf16", "train.use_vllm",
                                                           "train.vllm_mode", "train.use_cpu", "train.beta")
                    and w not in topology]
    # MoCo's topology is the one its one-GPU launch script runs (the preset's own needs a GPU for TRL's server)
    script = (ROOT / "scripts" / "launch" / "moco-1gpu.sh").read_text()
    assert f"TRAIN_ARGS=({' '.join(smoke.TOPOLOGY['moco'])})" in script
    assert _effective("moco", plan["moco"][0]).policy.lora
    cmd, env = plan["lineup-served"]
    assert cmd[:2] == ["bash", str(ROOT / "scripts" / "launch" / "lineup-1gpu.sh")]
    assert env["VERIFIER_MODEL"] == str(hf) and env["CAPTIONRL_SERVE_CMD"].endswith("vllm serve")
    # what the launch script would run with these arguments: its own dry run
    proc = subprocess.run([*cmd, "--dry-run"], cwd=ROOT, env={**_env(), **env}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    serve = next(line for line in lines if line.endswith(" &"))
    assert f"vllm serve {hf} --served-model-name Qwen2.5-14B-Instruct" in serve
    planned = next(line for line in lines if " -m captionrl.cli plan " in line)  # the memory plan comes first
    assert f"--served {hf}@0.25" in planned and lines.index(planned) < lines.index(serve)
    train = shlex.split(next(line for line in lines if " -m captionrl.cli train " in line))
    assert "configs/accelerate/multi-gpu-zero2.yaml" in train
    t = _effective("lineup", train).train
    assert (t.gradient_checkpointing, t.bf16, t.use_vllm, t.vllm_mode) == (True, True, True, "colocate")
    assert plan["gpu-verifier"][0][-2:] != ["--device", "cpu"] and "--tiny" not in plan["gpu-verifier"][0]


def test_the_cpu_rehearsal_changes_only_what_a_cpu_lacks(tmp_path):
    smoke = smoke_script()
    plan = {name: cmd for name, cmd, _ in smoke.joints(True, tmp_path, 0)}
    assert list(plan) == NAMES and plan["nccl"] == "a CPU has no NCCL"
    for name, recipe in (("rubicap-zero3", "rubicap"), ("moco", "moco")):
        t = _effective(recipe, plan[name]).train
        assert (t.gradient_checkpointing, t.bf16, t.use_vllm, t.use_cpu) == (True, False, False, True)
        assert "configs/accelerate/cpu-" in plan[name][plan[name].index("--config_file") + 1]
