"""The launch scripts (``scripts/launch/*.sh``): one per recipe and scale, each planning the
training's GPU memory (``captionrl plan``), starting every server its config names, waiting until each answers,
training, and stopping the servers however it ends.

Every script's ``--dry-run`` is checked against the run's own config: the servers the recipe probes (read here
from the recipe, not from the script's helper) are the servers the script starts, on their ports, under their
served names, on GPUs the training does not use; TRL's vLLM server exactly when the run is in server mode; and
the memory plan it runs first is the plan of the training it launches (its GPUs, accelerate config, overrides
and the engines served on its GPUs at their shares), the plan docs/gpu.md gives for that script, with its
figure. A plan that does not fit stops a script before any server starts. One script runs for real at tiny scale
(``lineup-1gpu.sh``: a CPU stand-in for ``vllm serve`` serves the embedded SmolLM2 over HTTP as the verifier,
a tiny Qwen2.5-VL trains 2 steps under DeepSpeed ZeRO-2 on one CPU process with gradient checkpointing on);
the failure paths (a server that cannot start, SIGTERM during training, a server that dies during training)
leave no process behind.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from captionrl.config import load_config
from deepspeed_launch import free_port as free_rendezvous_port
from deepspeed_launch import requires_deepspeed
from servers import free_port, requires_llama_cpp

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = ROOT / "scripts" / "launch"
SCRIPTS = ("lineup-1gpu", "lineup-node", "rubicap-1gpu", "rubicap-node", "moco-1gpu", "moco-node")
TRAIN = " -m captionrl.cli train "
PLAN = " -m captionrl.cli plan "

TINY_LINEUP = ["policy.model=tiny-qwen2.5-vl", "policy.dtype=float32", "data.prepared=null", "data.window=8",
               "data.series=[nile,sunspots]", "data.n_train=4", "data.n_val=1", "data.n_test=1", "reward.k=2",
               "train.num_generations=2", "train.per_device_train_batch_size=2", "train.max_completion_length=8",
               "train.max_steps=2", "train.save_steps=1", "train.report_to=[]", "train.threads=1",
               "train.use_cpu=true", "train.bf16=false", "train.use_vllm=false",  # a CPU: no bf16, no vLLM rollouts
               "train.preflight_items=0"]  # the preflight's own tests: test_preflight.py
"""``configs/lineup-paper.yaml`` at tiny scale on a CPU; gradient checkpointing stays on, as in the preset."""


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "CAPTIONRL_PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           "CAPTIONRL_GPU_MEMORY": "141"}  # the plan's card: an H200 here, whatever nvidia-smi says
    for key in ("GEMINI_API_KEY", "OPENAI_API_KEY", "RUBRIC_STORE"):
        env.pop(key, None)
    return {**env, **extra}


def _dry_run(script: str, *args: str, **env: str) -> tuple[int, str]:
    proc = subprocess.run(["bash", str(LAUNCH / f"{script}.sh"), "--dry-run", *args], cwd=ROOT, env=_env(**env),
                          capture_output=True, text=True, timeout=900)
    return proc.returncode, proc.stdout + proc.stderr


def _servers(lines: list[str]) -> list[dict]:
    """The server lines of a dry run (``vllm serve`` and TRL's ``trl vllm-serve``): GPUs, weights, served
    name, port, flags, and TRL's max_model_len."""
    out = []
    for line in lines:
        if not line.endswith(" &"):
            continue
        words = shlex.split(line[: line.index(" > ")])
        assert words[:1] == ["env"] and words[1].startswith("CUDA_VISIBLE_DEVICES="), line
        gpus = set(words[1].split("=", 1)[1].split(","))
        if words[2:4] == ["trl", "vllm-serve"]:  # TRL's server: --model, underscore flags (TRL's parser)
            flags = words[4:]
            get = {flags[i]: flags[i + 1] for i in range(len(flags) - 1) if flags[i].startswith("--")}
            out.append({"kind": "trl", "gpus": gpus, "model": get["--model"], "served": get["--model"],
                        "port": int(get["--port"]), "max_len": int(get["--max_model_len"]), "flags": flags})
            continue
        assert words[2:4] == ["vllm", "serve"], line
        flags = words[5:]
        get = {flags[i]: flags[i + 1] for i in range(len(flags) - 1) if flags[i].startswith("--")}
        out.append({"kind": "vllm", "gpus": gpus, "model": words[4], "served": get["--served-model-name"],
                    "port": int(get["--port"]), "flags": flags})
    return out


def _flag(flags: list[str], *names: str, default: str = "1") -> str:
    return next((flags[i + 1] for i, f in enumerate(flags[:-1]) if f in names), default)


def _trains(lines: list[str]) -> list[list[str]]:
    return [shlex.split(line) for line in lines if TRAIN in line]


def _plan(lines: list[str]) -> dict:
    """The one ``captionrl plan`` line of a dry run (at its index), its flags, and the total the plan printed."""
    (index,) = [i for i, line in enumerate(lines) if PLAN in line and " --config " in line and not line.startswith("#")]
    words = shlex.split(lines[index])
    words = words[words.index("plan") + 1:]
    flags: dict[str, list[str]] = {}
    for i in range(0, len(words), 2):
        flags.setdefault(words[i], []).append(words[i + 1])
    total = next(re.search(r"\*\*total\*\* \| \*\*([\d.]+)\*\* \| of ([\d.]+) GiB \((fits|does NOT fit)[;)]", line)
                 for line in lines if "**total**" in line)
    return {"index": index, "config": flags["--config"][0], "accelerate": flags["--accelerate"][0],
            "gpus": int(flags["--gpus"][0]), "gpu_memory": float(flags["--gpu-memory"][0]),
            "set": flags.get("--set", []), "served": flags.get("--served", []),
            "total": float(total.group(1)), "fits": total.group(3) == "fits"}


def _server_plans(lines: list[str]) -> list[tuple[int, list[str], list[str]]]:
    """Each ``captionrl plan --server ...`` of a dry run: its line index, its --server specs and the verdicts it
    printed (one ``**server NAME**`` row each)."""
    out = []
    for i, line in enumerate(lines):
        if PLAN in line and " --server " in line and not line.startswith("#"):
            words = shlex.split(line)
            specs = [words[k + 1] for k, w in enumerate(words) if w == "--server"]
            verdicts = []
            for later in lines[i + 1:]:
                if not later.startswith("#"):
                    break
                if "| **server " in later:
                    verdicts.append(later)
            out.append((i, specs, verdicts))
    return out


def _documented_plans() -> dict[str, tuple[dict, float]]:
    """docs/gpu.md's table of the plan each launch script runs first: script -> (flags, GiB per GPU)."""
    text = (ROOT / "docs" / "gpu.md").read_text()
    out = {}
    for m in re.finditer(r"^\| `(\w+-\w+)\.sh` \| `captionrl plan ([^`]+)` \| ([\d.]+) of 141 \|", text, re.M):
        words = shlex.split(m.group(2))
        flags: dict[str, list[str]] = {}
        for i in range(0, len(words), 2):
            flags.setdefault(words[i], []).append(words[i + 1])
        out[m.group(1)] = (flags, float(m.group(3)))
    return out


def _needed(recipe: str, config: str, overrides: list[str]) -> set[tuple[int, str]]:
    """(port, model) of every local server ``captionrl train RECIPE`` probes with these overrides, from the recipe."""
    from urllib.parse import urlparse

    from captionrl.cli import COMMANDS

    module = __import__(COMMANDS[("train", recipe)][0], fromlist=["CONFIG"])
    cfg = load_config(module.CONFIG, ROOT / config, overrides)
    if recipe == "rubicap":
        pairs = module.build_servers(cfg) if cfg.build_rubrics else module.servers(cfg)
    else:
        recipe_cls = {"lineup": "LineupRecipe", "moco": "MocoRecipe"}[recipe]
        pairs = getattr(module, recipe_cls)(cfg).servers()
    return {(urlparse(b.base_url).port, b.model) for b, _ in pairs
            if b.kind == "openai" and urlparse(b.base_url).hostname in ("127.0.0.1", "localhost")}


def _needed_trl(recipe: str, config: str, overrides: list[str]) -> set[tuple[int, int, str]]:
    """(port, max_model_len, policy) of TRL's vLLM server when the run sends its rollouts to one (server mode)."""
    from captionrl.cli import COMMANDS

    module = __import__(COMMANDS[("train", recipe)][0], fromlist=["CONFIG"])
    t = (cfg := load_config(module.CONFIG, ROOT / config, overrides)).train
    if not (t.use_vllm and t.vllm_mode == "server"):
        return set()
    return {(t.vllm_server_port, t.vllm_max_model_length, cfg.policy.model)}


def _overrides(train: list[str]) -> list[str]:
    return [w for w in train[train.index("--config") + 2:] if "=" in w]


def _gpus(train: list[str]) -> set[str]:
    return set(train[1].split("=", 1)[1].split(",")) - {""}


@pytest.mark.parametrize("script", SCRIPTS)
def test_dry_run_starts_every_server_the_config_needs_and_nothing(script, tmp_path):
    logs = tmp_path / "logs"
    rc, out = _dry_run(script, CAPTIONRL_LAUNCH_LOGS=str(logs))
    assert rc == 0, out
    lines = out.splitlines()
    assert lines[0].startswith("# ") and "dry run, nothing is started" in lines[0]
    assert not logs.exists()  # nothing ran: not even the log folder
    recipe, scale = script.split("-")
    config = f"configs/{recipe}-paper.yaml"
    trains = _trains(lines)
    # each phase: the servers started before a captionrl command are the ones that command probes
    phases = out.split("\n# stop ")
    assert len(trains) == (2 if recipe == "rubicap" else 1) == len([p for p in phases if TRAIN in p])
    served_on_trainers: list[str] = []
    for phase, train in zip([p for p in phases if TRAIN in p], trains, strict=True):
        plines = phase.splitlines()
        servers = _servers(plines)
        assert train[train.index("--config") + 1] == config
        overrides = _overrides(train) + (["build_rubrics=true"] if "--build-rubrics" in train else [])
        openai = [s for s in servers if s["kind"] == "vllm"]
        assert {(s["port"], s["served"]) for s in openai} == _needed(recipe, config, overrides), phase
        assert {(s["port"], s["max_len"], s["model"]) for s in servers if s["kind"] == "trl"} == _needed_trl(
            recipe, config, overrides), phase  # TRL's server exactly when the run is in server mode, as configured
        assert all(s["model"].count("/") == 1 for s in servers)  # hub ids (the served names are the config's)
        assert all("--max-model-len" in s["flags"] for s in openai), openai  # the KV cache sized to what is sent
        if servers:
            assert any(line.startswith("# wait until every server") for line in plines)
        gpus = _gpus(train)
        if scale == "node":  # one node: each server has GPUs of its own
            assert sum(len(s["gpus"]) for s in servers) == len(set().union(*[s["gpus"] for s in servers])), servers
        for s in servers:
            assert not s["gpus"] & gpus or scale == "1gpu", (s, train)  # a node's servers and trainers: disjoint GPUs
            tp = _flag(s["flags"], "--tensor-parallel-size", "--tensor_parallel_size")
            dp = _flag(s["flags"], "--data-parallel-size", "--data_parallel_size")
            assert int(tp) * int(dp) == len(s["gpus"]), s  # every GPU a server is given, it uses
            if s["gpus"] & gpus and "--build-rubrics" not in train:  # served beside the training: the plan's --served
                served_on_trainers.append(f"{s['model']}@{_flag(s['flags'], '--gpu-memory-utilization', default='0.9')}")
        if "accelerate.commands.launch" in train:
            assert int(train[train.index("--num_processes") + 1]) == len(gpus), train
    # every server is planned (weights + vLLM's own memory + KV at its context) before any of its phase starts
    servers = _servers(lines)
    planned = _server_plans(lines)
    specs = [spec.split("|") for _, ss, _ in planned for spec in ss]
    assert sorted((s["model"], ",".join(sorted(s["gpus"]))) for s in servers) == sorted(
        (model, ",".join(sorted(gpus.split(",")))) for _, model, gpus, _ in specs), (servers, specs)
    for i, ss, verdicts in planned:
        assert len(verdicts) == len(ss) and all("(fits)" in v for v in verdicts), verdicts
        assert i < min(k for k, line in enumerate(lines) if k > i and line.endswith(" &"))
    assert all("--max-model-len" in flags.split() for *_, flags in specs), specs
    # the memory plan, before anything starts, is the plan of the training the script launches
    plan = _plan(lines)
    assert plan["index"] < min(i for i, line in enumerate(lines) if line.endswith(" &") or TRAIN in line)
    train = trains[-1]
    assert plan["config"] == config and plan["fits"] and plan["gpu_memory"] == 141
    if "accelerate.commands.launch" in train:
        assert plan["accelerate"] == train[train.index("--config_file") + 1]
        assert plan["gpus"] == int(train[train.index("--num_processes") + 1]) == len(_gpus(train))
    else:  # one plain process
        assert (plan["accelerate"], plan["gpus"]) == ("none", 1)
    assert set(_overrides(train)) - set(plan["set"]) <= {"rubrics.source=store", f"rubrics.store={STORE}"}, plan
    assert sorted(plan["served"]) == sorted(served_on_trainers), (plan, served_on_trainers)
    documented, gib = _documented_plans()[script]  # docs/gpu.md's command for this script, and its figure
    assert (documented["--config"], documented["--accelerate"], documented["--gpus"]) == (
        [config], [plan["accelerate"]], [str(plan["gpus"])])
    assert sorted(documented.get("--set", [])) == sorted(plan["set"]) and documented.get("--served", []) == plan["served"]
    assert plan["total"] == gib, (plan["total"], gib)
    if recipe == "rubicap":  # training reads the store the build wrote: no committee server is probed
        build, train = trains
        assert "--build-rubrics" in build and _gpus(build) == set()  # the build loads no model on a GPU
        store = next(w for w in train if w.startswith("rubrics.store=")).split("=", 1)[1]
        assert "rubrics.source=store" in train and store == STORE
        assert "WARNING: rubrics.writer" in out and "GEMINI_API_KEY" in out  # an API role without its key is named
    if script == "rubicap-1gpu":  # one GPU: the committee members that are APIs, and it says so
        committee = json.loads(next(w for w in trains[0] if w.startswith("rubrics.committee=")).split("=", 1)[1])
        assert [c["model"] for c in committee] == ["gemini-2.5-pro", "gpt-5"] and "not the paper" in out
    if script == "lineup-node":
        assert "configs/accelerate/multi-gpu-zero2.yaml" in trains[0] and "eval.enabled=false" not in trains[0]
    if script == "rubicap-node":
        assert "configs/accelerate/multi-gpu-zero3.yaml" in trains[1]
    if recipe == "moco":
        assert "policy.model=runs/moco-sft/model" in out  # the note: MoCo starts from the shared SFT checkpoint
    # the shares and topology of docs/gpu.md's memory plan
    if script == "lineup-1gpu":
        assert plan["served"] == ["Qwen/Qwen2.5-14B-Instruct@0.25"]
        assert "train.vllm_gpu_memory_utilization=0.1" in trains[0] and "eval.enabled=false" in trains[0]
    if script == "rubicap-1gpu":
        assert plan["served"] == ["Qwen/Qwen2.5-7B-Instruct@0.25"]
        assert {"train.vllm_gpu_memory_utilization=0.2", "policy.lora=true"} <= set(trains[1])
    if script == "moco-1gpu":
        assert {"policy.lora=true", "train.vllm_mode=colocate"} <= set(trains[0]) and _gpus(trains[0]) == {"0"}
    if script == "moco-node":  # full-parameter, TRL's server on GPU 0, ZeRO-2 on GPUs 1-7
        (trl,) = _servers(lines)
        assert trl["gpus"] == {"0"} and (trl["port"], trl["max_len"]) == (8010, 18432), trl
        assert trl["model"] == "Qwen/Qwen3-VL-8B-Instruct"  # the policy's weights: the preset's until policy.model is given
        assert _gpus(trains[0]) == {"1", "2", "3", "4", "5", "6", "7"}
        assert "configs/accelerate/multi-gpu-zero2.yaml" in trains[0] and not [w for w in trains[0] if "lora" in w]
        assert "GET http://127.0.0.1:8010/health" in out


STORE = "runs/rubicap-paper/rubrics/rubrics.jsonl"


def _script_commands(path: Path) -> list[str]:
    """The commands of a shell script, comments dropped and continued lines joined."""
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    return [line.split(" # ", 1)[0].strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_every_served_model_has_a_context_limit():
    """vLLM sizes its KV cache for one sequence of max_model_len, the model's whole context when unset
    (Qwen3-VL-30B-A3B: 262,144 tokens, 24 GiB): every ``serve`` (the scripts' ``vllm serve``) and every literal
    ``vllm serve`` line of every launch script gives ``--max-model-len``; TRL's server takes the config's."""
    checked = 0
    for path in sorted(set(LAUNCH.glob("*.sh")) - {LAUNCH / "common.sh"}):  # common.sh: the helper itself
        for line in _script_commands(path):
            words = line.split()
            if words[0] == "serve" or "vllm serve" in line:
                assert "--max-model-len" in words or "--max_model_len" in words, f"{path.name}: {line}"
                checked += 1
    assert checked >= 9  # lineup 1 + 3, rubicap 2 + 5
    common = (LAUNCH / "common.sh").read_text()
    assert 'cmd+=(--max_model_len "$max_len")' in common  # serve_trl: train.vllm_max_model_length


def test_glm_verifier_loads_natively():
    """GLM-4-9B's original repository needs --trust-remote-code and its custom code has broken on past
    transformers releases; THUDM/glm-4-9b-chat-hf loads natively (transformers' Glm model class)."""
    for path in [*LAUNCH.glob("*.sh"), ROOT / "configs" / "lineup-paper.yaml"]:
        text = path.read_text()
        assert "--trust-remote-code" not in text and "--trust_remote_code" not in text, path
        assert not re.search(r"THUDM/glm-4-9b-chat(?!-hf)", text), path
    (glm,) = [line for line in _script_commands(LAUNCH / "lineup-node.sh") if line.startswith("serve glm ")]
    assert glm.split()[4] == "THUDM/glm-4-9b-chat-hf", glm


def _probe_checkout(tmp_path: Path, *envs: str, ready: bool = True) -> Path:
    """A checkout with only common.sh, a script that reports the Python and server command it picked, and
    the named environments (stand-in ``bin/python`` and ``bin/vllm`` files: only their paths are read)."""
    root = tmp_path / "checkout"
    (root / "scripts" / "launch").mkdir(parents=True)
    (root / "scripts" / "launch" / "common.sh").write_text((LAUNCH / "common.sh").read_text())
    (root / "scripts" / "launch" / "probe.sh").write_text(
        'source "$(dirname "$0")/common.sh"\nlaunch_init probe "$@"\n'
        'echo "PY=$PY"\necho "VLLM=$(command -v "${SERVE_CMD[0]}" || true)"\n')
    for env in envs:
        (root / env / "bin").mkdir(parents=True)
        for tool in ("python", "vllm"):
            (root / env / "bin" / tool).write_text("#!/bin/sh\nexit 0\n")
            (root / env / "bin" / tool).chmod(0o755)
        if env == ".venv-gpu" and ready:
            (root / env / "captionrl-gpu-ready").write_text("torch 2.13.0 cuda\n")
    return root


def _probe(root: Path, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("CAPTIONRL_PYTHON", "CAPTIONRL_SERVE_CMD")}
    return subprocess.run(["bash", str(root / "scripts" / "launch" / "probe.sh"), "--dry-run"], cwd=root,
                          env={**base, **env}, capture_output=True, text=True, timeout=60)


def test_launch_picks_the_gpu_environment_over_the_cpu_one(tmp_path):
    """scripts/setup.sh --gpu builds .venv-gpu beside the CPU install's .venv: the launch trains and serves
    with .venv-gpu (its vllm first on PATH), CAPTIONRL_PYTHON still wins, a GPU environment whose setup did not
    finish is refused, and with only .venv the launch says that it trains without the GPU environment."""
    root = _probe_checkout(tmp_path, ".venv", ".venv-gpu")
    out = _probe(root)
    assert out.returncode == 0, out.stderr
    assert "PY=.venv-gpu/bin/python" in out.stdout and f"VLLM={root}/.venv-gpu/bin/vllm" in out.stdout, out.stdout
    assert "WARNING" not in out.stdout
    mine = _probe(root, CAPTIONRL_PYTHON=str(root / ".venv" / "bin" / "python"))
    assert f"PY={root}/.venv/bin/python" in mine.stdout, mine.stdout

    half = _probe_checkout(tmp_path / "half", ".venv", ".venv-gpu", ready=False)
    out = _probe(half)
    assert out.returncode == 2 and "scripts/setup.sh --gpu did not finish" in out.stderr and "Fix:" in out.stderr, out

    cpu = _probe_checkout(tmp_path / "cpu", ".venv")
    out = _probe(cpu)
    assert out.returncode == 0 and "PY=.venv/bin/python" in out.stdout, out
    assert "# WARNING: no GPU environment (.venv-gpu)" in out.stdout and "setup.sh --gpu" in out.stdout


def test_a_plan_that_does_not_fit_stops_the_dry_run_before_any_server():
    """lineup-1gpu.sh's layout on an 80 GB card: the verifier's 0.3 share cannot hold its 14B weights and the
    whole does not fit; the dry run prints the plan command and its refusal, and nothing after it."""
    rc, out = _dry_run("lineup-1gpu", CAPTIONRL_GPU_MEMORY="80")
    assert rc == 2, out
    assert "captionrl.cli plan --config configs/lineup-paper.yaml" in out and "--gpu-memory 80" in out
    assert "does NOT fit" in out and "the memory plan refuses this launch" in out and "Fix:" in out
    assert not [line for line in out.splitlines() if line.endswith(" &") or TRAIN in line or "# wait" in line]


def test_memory_plan_warn_goes_on_and_says_so():
    rc, out = _dry_run("lineup-1gpu", "train.memory_plan=warn", CAPTIONRL_GPU_MEMORY="80")
    assert rc == 0, out
    assert "does NOT fit" in out and "going on (train.memory_plan=warn)" in out
    (train,) = _trains(out.splitlines())
    assert "train.memory_plan=warn" in train  # the training's own check follows the same setting


def test_moco_node_refuses_a_run_that_does_not_use_its_trl_server():
    """Without vLLM rollouts (or colocated) nothing connects to TRL's server: the script refuses to start it."""
    rc, out = _dry_run("moco-node", "train.use_vllm=false")
    assert rc == 2, out
    assert "starts TRL's vLLM server (train.vllm_server) but the run does not use one" in out and "Fix:" in out
    assert not [line for line in out.splitlines() if line.endswith(" &") or TRAIN in line]


def test_a_server_the_config_needs_and_the_script_does_not_start_is_refused():
    """lineup-1gpu.sh trains with eval.enabled=false; turning the evaluation on needs GLM-4-9B and Phi-4, which it
    does not serve: refused before anything starts, naming the field and the fix."""
    rc, out = _dry_run("lineup-1gpu", "eval.enabled=true")
    assert rc == 2, out
    assert "eval.verifiers.GLM-4-9B" in out and "starts no server there" in out and "Fix:" in out
    assert TRAIN not in out


def test_rubicap_one_gpu_trains_on_a_given_store_without_building():
    rc, out = _dry_run("rubicap-1gpu", RUBRIC_STORE="store/rubrics.jsonl")
    assert rc == 0, out
    (train,) = _trains(out.splitlines())
    assert "rubrics.store=store/rubrics.jsonl" in train and "policy.lora=true" in train and "API teachers only" not in out


# ---------------------------------------------------------------------- for real, at tiny scale on a CPU
def _standin_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    from captionrl.embedded import embedded_gguf_path

    env = {"CAPTIONRL_SERVE_CMD": f"{sys.executable} -m captionrl.testing.vllm_standin",
           "CAPTIONRL_SERVE_MODEL": str(embedded_gguf_path()),
           "CAPTIONRL_ACCELERATE_CONFIG": "configs/accelerate/cpu-zero2.yaml", "CAPTIONRL_NUM_PROCESSES": "1",
           "CAPTIONRL_MAIN_PROCESS_PORT": str(free_rendezvous_port()), "CAPTIONRL_LAUNCH_LOGS": str(tmp_path / "logs"),
           "CAPTIONRL_READY_TIMEOUT": "600", "CAPTIONRL_STOP_GRACE": "10"}
    return _env(**{**env, **extra})


def _left(*tags: str) -> list[str]:
    """Command lines of the processes that hold any of ``tags`` (this test's server port, its run folder)."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [line.strip() for line in out.splitlines() if any(t in line for t in tags) and " ps -eo " not in line]


def _start(launches: list, tmp_path: Path, port: int, run: Path, *extra: str, **env: str) -> subprocess.Popen:
    args = [f"verifier.base_url=http://127.0.0.1:{port}/v1", *TINY_LINEUP, f"train.out_dir={run}", *extra]
    proc = subprocess.Popen(["bash", str(LAUNCH / "lineup-1gpu.sh"), *args], cwd=ROOT, env=_standin_env(tmp_path, **env),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    launches.append(proc)
    return proc


def _finish(proc: subprocess.Popen, timeout: float) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(proc)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # a process the script left behind still holds its output
            out = "(no output: a process the script started still holds it open)"
        pytest.fail(f"the launch script ran past {timeout} s:\n{out[-4000:]}")
    return out


def _stop(proc: subprocess.Popen) -> None:
    """Stop a launch a test left running: SIGTERM lets the script stop its servers and training (each in a
    session of its own, out of reach of the script's process group), then SIGKILL whatever is left."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture
def launches():
    """Launch scripts started by a test; any still running at teardown (a failed assertion) is stopped."""
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        _stop(proc)


@pytest.mark.slow
@pytest.mark.server
@requires_llama_cpp
@requires_deepspeed
@pytest.mark.timeout(900)
def test_lineup_one_gpu_script_runs_end_to_end_with_a_served_verifier(tmp_path, launches):
    from captionrl.tiny_models import tiny_qwen_vl_dir

    tiny_qwen_vl_dir("qwen2.5-vl")  # built here, once
    port, run = free_port(), tmp_path / "run"
    t0 = time.perf_counter()
    proc = _start(launches, tmp_path, port, run)
    out = _finish(proc, 800)
    print(f"lineup-1gpu.sh at tiny scale: {time.perf_counter() - t0:.0f} s wall")
    assert proc.returncode == 0, out[-6000:]
    assert re.search(r"launch: verifier ready at http://127\.0\.0\.1:\d+/v1 \(Qwen2\.5-14B-Instruct\)", out), out[-3000:]
    result = json.loads((run / "result.json").read_text())
    assert result["steps"] == 2 and set(result["selection"]["scores"]) == {"checkpoint-1", "checkpoint-2"}
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "loss" in m] == [1, 2]
    assert all(m["identification/unscored_frac"] == 0.0 for m in metrics if "loss" in m)  # the served verifier scored
    config = (run / "config.yaml").read_text()
    assert "gradient_checkpointing: true" in config and "eval:\n  enabled: false" in config  # the preset's setting
    log = (tmp_path / "logs" / "verifier.log").read_text()
    assert "POST /v1/chat/completions" in log and "ignoring GPU-only flags ['--gpu-memory-utilization']" in log
    assert "launch: stopping verifier" in out and not _left(f"--port {port}", str(run))


@pytest.mark.server
@pytest.mark.timeout(1200)  # 20 s here alone; a starved machine gives a nice'd launch a few % of a core
def test_a_server_that_cannot_start_stops_the_launch_before_training(tmp_path, launches):
    port, run = free_port(), tmp_path / "run"
    proc = _start(launches, tmp_path, port, run, CAPTIONRL_SERVE_MODEL=str(tmp_path / "weights.bin"))
    out = _finish(proc, 900)
    assert proc.returncode == 2, out
    assert "verifier (Qwen2.5-14B-Instruct at" in out and "stopped before it answered" in out
    assert "serves GGUF files only" in out  # the server's own log tail, printed by the launch
    assert "launch: running" not in out and not run.exists()
    assert not _left(f"--port {port}")


@requires_llama_cpp
@pytest.mark.server
@pytest.mark.timeout(1200)
def test_a_training_that_fails_stops_the_servers_and_passes_its_status_on(tmp_path, launches):
    """vLLM rollouts asked for on a CPU: the memory plan passes (it plans the share), the server starts and
    answers, then the training refuses before any model loads; the script exits with the training's status
    (accelerate's) and stops the server. (A missing policy folder no longer gets this far: the plan refuses it.)"""
    port, run = free_port(), tmp_path / "run"
    proc = _start(launches, tmp_path, port, run, "train.use_vllm=true")
    out = _finish(proc, 900)
    assert "ready at" in out and "launch: running" in out and "vLLM rollouts need a CUDA GPU" in out, out[-3000:]
    assert proc.returncode != 0 and f"exited with status {proc.returncode}" in out, out[-3000:]
    assert "launch: stopping verifier" in out, out[-3000:]
    assert not _left(f"--port {port}", str(run))


@requires_llama_cpp
@pytest.mark.server
def test_sigterm_during_training_stops_training_and_servers(tmp_path, launches):
    port, run = free_port(), tmp_path / "run"
    proc = _start(launches, tmp_path, port, run)
    lines = []
    for line in proc.stdout:  # until the training has been started
        lines.append(line)
        if line.startswith("launch: running:"):
            break
    assert any("ready at" in x for x in lines), "".join(lines)
    time.sleep(3)
    assert [x for x in _left(str(run)) if "accelerate.commands.launch" in x] and _left(f"--port {port}")  # both up
    proc.send_signal(signal.SIGTERM)
    out = "".join(lines) + _finish(proc, 300)
    assert proc.returncode == 143, out[-3000:]
    assert "terminated: stopping training and servers" in out
    assert not _left(f"--port {port}", str(run)), _left(f"--port {port}", str(run))


@requires_llama_cpp
@pytest.mark.server
def test_a_worker_in_a_session_of_its_own_is_stopped_too(tmp_path, launches):
    """torch's elastic launcher starts each worker in a session of its own: with no grace the launcher is killed
    before it can pass SIGTERM on, and the stop still finds the worker (by the tag in its environment)."""
    port, run = free_port(), tmp_path / "run"
    proc = _start(launches, tmp_path, port, run, CAPTIONRL_STOP_GRACE="0")
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("launch: running:"):
            break
    deadline = time.monotonic() + 120
    while not (workers := [x for x in _left(str(run)) if "captionrl.cli train" in x and "accelerate" not in x]):
        assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out = "".join(lines) + _finish(proc, 300)
    assert proc.returncode == 143, out[-3000:]
    assert not _left(f"--port {port}", str(run)), (workers, _left(f"--port {port}", str(run)), out[-3000:])


@pytest.mark.long
@requires_llama_cpp
@pytest.mark.server
def test_a_server_that_dies_during_training_stops_the_launch(tmp_path, launches):
    port, run = free_port(), tmp_path / "run"
    proc = _start(launches, tmp_path, port, run)
    for line in proc.stdout:
        if line.startswith("launch: running:"):
            break
    server = [int(x.split()[0]) for x in _left(f"--port {port}")]
    assert server
    os.kill(server[0], signal.SIGKILL)
    out = _finish(proc, 300)
    assert proc.returncode == 1 and "server verifier stopped while captionrl was running" in out, out[-3000:]
    assert not _left(f"--port {port}", str(run))


# ---------------------------------------------------------------------- the memory plan and TRL's server, for real
def test_a_plan_that_does_not_fit_stops_the_launch_before_any_server_starts(tmp_path, launches):
    """Not a dry run: the plan refuses (an 80 GB card), so no server starts and no training runs."""
    port, run = free_port(), tmp_path / "run"
    proc = subprocess.Popen(["bash", str(LAUNCH / "lineup-1gpu.sh"), f"verifier.base_url=http://127.0.0.1:{port}/v1",
                             f"train.out_dir={run}"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_standin_env(tmp_path, CAPTIONRL_GPU_MEMORY="80"), start_new_session=True)
    launches.append(proc)
    out = _finish(proc, 600)
    assert proc.returncode == 2, out[-3000:]
    assert "launch: memory plan: " in out and "does NOT fit" in out and "nothing was started" in out
    assert "launch: starting" not in out and "launch: running" not in out and not run.exists()
    assert not _left(f"--port {port}")


def _trl_standin(tmp_path: Path, port: int, *flags: str) -> tuple[subprocess.Popen, Path]:
    log = tmp_path / f"trl-{port}.log"
    with log.open("w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "captionrl.testing.trl_standin", "--model", "Qwen/Qwen3-VL-8B-Instruct",
                                 "--host", "127.0.0.1", "--port", str(port), *flags], stdout=fh, stderr=subprocess.STDOUT,
                                env=_env(), start_new_session=True)
    return proc, log


def _wait(tmp_path: Path, port: int, proc: subprocess.Popen, log: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    spec = f"trl=train.vllm_server=http://127.0.0.1:{port}=Qwen/Qwen3-VL-8B-Instruct={proc.pid}={log}"
    return subprocess.run([sys.executable, str(LAUNCH / "servers.py"), "wait", "--timeout", str(timeout), spec],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)


@pytest.mark.server
def test_trl_server_readiness_is_what_trls_client_checks(tmp_path):
    """``servers.py wait`` for TRL's server: it waits while the port is closed (vLLM loading), passes on /health,
    /v1/models with the policy and /server_info; a server without the development endpoints (a plain vllm serve)
    and one whose process ends are refused at once, with the log."""
    started = []
    try:
        port = free_port()
        proc, log = _trl_standin(tmp_path, port, "--standin-delay", "2")
        started.append(proc)
        done = _wait(tmp_path, port, proc, log)
        assert done.returncode == 0, done.stderr
        assert f"train.vllm_server ready at http://127.0.0.1:{port}" in done.stdout
        assert "GET /health" in log.read_text() and "GET /server_info" in log.read_text()

        port = free_port()
        proc, log = _trl_standin(tmp_path, port, "--standin-no-dev-mode")
        started.append(proc)
        done = _wait(tmp_path, port, proc, log)
        assert done.returncode == 2 and "no development endpoints" in done.stderr and "VLLM_SERVER_DEV_MODE" in done.stderr

        port = free_port()
        proc, log = _trl_standin(tmp_path, port, "--standin-delay", "1", "--standin-fail")
        started.append(proc)
        t0 = time.monotonic()
        done = _wait(tmp_path, port, proc, log, timeout=600)
        assert done.returncode == 2 and "stopped before it answered" in done.stderr, done.stderr
        assert "failing as asked" in done.stderr and time.monotonic() - t0 < 120  # the log tail; not the deadline
    finally:
        for proc in started:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@requires_deepspeed
@pytest.mark.server
@pytest.mark.timeout(1200)
def test_moco_node_starts_waits_for_and_stops_trls_server(tmp_path, launches):
    """moco-node.sh for real with a stand-in for ``trl vllm-serve`` (a CPU cannot run vLLM): the plan passes, the
    server starts on the config's port with the policy's weights and max_model_len, the script waits until it is
    ready, starts the training (which a CPU refuses: vLLM rollouts need a GPU), passes its status on and stops
    the server."""
    from captionrl.tiny_models import tiny_qwen_vl_dir

    policy = tiny_qwen_vl_dir("qwen3-vl")  # built here, once
    port, run = free_port(), tmp_path / "run"
    env = _standin_env(tmp_path, CAPTIONRL_TRL_SERVE_CMD=f"{sys.executable} -m captionrl.testing.trl_standin",
                       ROLLOUT_ARGS="--standin-delay 2")
    proc = subprocess.Popen(["bash", str(LAUNCH / "moco-node.sh"), f"policy.model={policy}", f"train.vllm_server_port={port}",
                             f"train.out_dir={run}", "train.report_to=[]"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    launches.append(proc)
    out = _finish(proc, 900)
    assert "launch: memory plan: " in out and "(fits)" in out, out[-3000:]
    assert f"launch: train.vllm_server ready at http://127.0.0.1:{port} ({policy})" in out, out[-3000:]
    assert out.index("ready at") < out.index("launch: running") and "vLLM rollouts need a CUDA GPU" in out, out[-3000:]
    # the training's refusal (status 2) reaches the script through accelerate, which exits 1 for a failed rank
    assert proc.returncode == 1 and "exited with status 1" in out and "launch: stopping rollout" in out, out[-3000:]
    log = (tmp_path / "logs" / "rollout.log").read_text()
    assert "ignoring GPU-only flags ['--tensor_parallel_size', '1']" in log  # the rest of TRL's line it took
    assert "GET /health" in log and "GET /v1/models" in log and "GET /server_info" in log  # TRL's client's checks
    assert not _left(f"--port {port}")
