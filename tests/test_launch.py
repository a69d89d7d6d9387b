"""The launch scripts (``scripts/launch/*.sh``, issue 33): one per recipe and scale, each starting every server
its config names, waiting until each answers, training, and stopping the servers however it ends.

Every script's ``--dry-run`` is checked against the run's own config: the servers the recipe probes (read here
from the recipe, not from the script's helper) are the servers the script starts, on their ports, under their
served names, on GPUs the training does not use. One script runs for real at tiny scale
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

TINY_LINEUP = ["policy.model=tiny-qwen2.5-vl", "policy.dtype=float32", "data.prepared=null", "data.window=8",
               "data.series=[nile,sunspots]", "data.n_train=4", "data.n_val=1", "data.n_test=1", "reward.k=2",
               "train.num_generations=2", "train.per_device_train_batch_size=2", "train.max_completion_length=8",
               "train.max_steps=2", "train.save_steps=1", "train.report_to=[]", "train.threads=1",
               "train.use_cpu=true", "train.bf16=false", "train.use_vllm=false",  # a CPU: no bf16, no vLLM rollouts
               "train.preflight_items=0"]  # the preflight's own tests: test_preflight.py
"""``configs/lineup-paper.yaml`` at tiny scale on a CPU; gradient checkpointing stays on, as in the preset."""


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "CAPTIONRL_PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    for key in ("GEMINI_API_KEY", "OPENAI_API_KEY", "RUBRIC_STORE"):
        env.pop(key, None)
    return {**env, **extra}


def _dry_run(script: str, *args: str, **env: str) -> tuple[int, str]:
    proc = subprocess.run(["bash", str(LAUNCH / f"{script}.sh"), "--dry-run", *args], cwd=ROOT, env=_env(**env),
                          capture_output=True, text=True, timeout=900)
    return proc.returncode, proc.stdout + proc.stderr


def _servers(lines: list[str]) -> list[dict]:
    """The ``vllm serve`` lines of a dry run: GPUs, weights, served name, port, flags."""
    out = []
    for line in lines:
        if not line.endswith(" &"):
            continue
        words = shlex.split(line[: line.index(" > ")])
        assert words[:1] == ["env"] and words[1].startswith("CUDA_VISIBLE_DEVICES=") and words[2:4] == ["vllm", "serve"], line
        flags = words[5:]
        get = {flags[i]: flags[i + 1] for i in range(len(flags) - 1) if flags[i].startswith("--")}
        out.append({"gpus": set(words[1].split("=", 1)[1].split(",")), "model": words[4],
                    "served": get["--served-model-name"], "port": int(get["--port"]), "flags": flags})
    return out


def _trains(lines: list[str]) -> list[list[str]]:
    return [shlex.split(line) for line in lines if " -m captionrl.cli " in line]


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
    assert len(trains) == (2 if recipe == "rubicap" else 1) == len([p for p in phases if " -m captionrl.cli " in p])
    for phase, train in zip([p for p in phases if " -m captionrl.cli " in p], trains, strict=True):
        plines = phase.splitlines()
        servers = _servers(plines)
        assert train[train.index("--config") + 1] == config
        overrides = _overrides(train) + (["build_rubrics=true"] if "--build-rubrics" in train else [])
        assert {(s["port"], s["served"]) for s in servers} == _needed(recipe, config, overrides), phase
        assert all(s["model"].count("/") == 1 for s in servers)  # hub ids (the served names are the config's)
        if servers:
            assert any(line.startswith("# wait until every server") for line in plines)
        gpus = _gpus(train)
        if scale == "node":  # one node: each server has GPUs of its own
            assert sum(len(s["gpus"]) for s in servers) == len(set().union(*[s["gpus"] for s in servers])), servers
        for s in servers:
            assert not s["gpus"] & gpus or scale == "1gpu", (s, train)  # a node's servers and trainers: disjoint GPUs
            tp = s["flags"][s["flags"].index("--tensor-parallel-size") + 1] if "--tensor-parallel-size" in s["flags"] else "1"
            dp = s["flags"][s["flags"].index("--data-parallel-size") + 1] if "--data-parallel-size" in s["flags"] else "1"
            assert int(tp) * int(dp) == len(s["gpus"]), s  # every GPU a server is given, it uses
        if "accelerate.commands.launch" in train:
            assert int(train[train.index("--num_processes") + 1]) == len(gpus), train
    if recipe == "rubicap":  # training reads the store the build wrote: no committee server is probed
        build, train = trains
        assert "--build-rubrics" in build and _gpus(build) == set()  # the build loads no model on a GPU
        store = next(w for w in train if w.startswith("rubrics.store=")).split("=", 1)[1]
        assert "rubrics.source=store" in train and store == "runs/rubicap-paper/rubrics/rubrics.jsonl"
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


def test_a_server_the_config_needs_and_the_script_does_not_start_is_refused():
    """lineup-1gpu.sh trains with eval.enabled=false; turning the evaluation on needs GLM-4-9B and Phi-4, which it
    does not serve: refused before anything starts, naming the field and the fix."""
    rc, out = _dry_run("lineup-1gpu", "eval.enabled=true")
    assert rc == 2, out
    assert "eval.verifiers.GLM-4-9B" in out and "starts no server there" in out and "Fix:" in out
    assert " -m captionrl.cli " not in out


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
        out, _ = proc.communicate()
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
    """The policy folder does not exist: the config loads (the plan passes, the server starts and answers),
    then the training stops before any model loads; the script exits with its status and stops the server."""
    port, run = free_port(), tmp_path / "run"
    proc = _start(launches, tmp_path, port, run, f"policy.model={tmp_path / 'no-such-model'}")
    out = _finish(proc, 900)
    assert "ready at" in out and "launch: running" in out, out[-3000:]
    assert proc.returncode != 0 and "exited with status" in out and "launch: stopping verifier" in out, out[-3000:]
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
