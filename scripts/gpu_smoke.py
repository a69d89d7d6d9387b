"""The GPU check behind ``scripts/gpu_smoke.sh``: every joint of the GPU path, run with the paper presets' own
training settings on tiny random models of the papers' families (no download), one table of joints.

It refuses to run without a CUDA device: one line says so and it exits 2 (a CPU can only rehearse; see
``--cpu-rehearsal`` below). Joints, each a separate process so one failure does not hide the others:

- ``device``: the GPUs (name, memory, count) and the stack (torch and its CUDA, vLLM, TRL, DeepSpeed);
- ``nccl``: an all-reduce between two ranks over NCCL, one per GPU (skipped, and said so, with one GPU);
- ``lineup-served``: ``scripts/launch/lineup-1gpu.sh`` itself: it serves the verifier with ``vllm serve``
  (the embedded SmolLM2 as an HF folder, under the preset's served name), waits until it answers, trains
  ``configs/lineup-paper.yaml`` (RLOO, bf16, gradient checkpointing, vLLM rollouts colocated) under DeepSpeed
  ZeRO-2 in one process with the verifier's letter scoring over HTTP, selects a checkpoint, stops the server;
- ``rubicap-zero3``: ``configs/rubicap-paper.yaml`` (GRPO with its KL term, bf16, gradient checkpointing, vLLM
  colocated) under DeepSpeed ZeRO-3, on two ranks over NCCL when two GPUs are present;
- ``moco``: ``configs/moco-paper.yaml`` in ``scripts/launch/moco-1gpu.sh``'s topology (LoRA, vLLM colocated:
  ``TOPOLOGY``), GRPO, bf16, gradient checkpointing, the momentum's float32 EMA, under DeepSpeed ZeRO-2, two
  ranks when two GPUs are present;
- ``gpu-verifier``: ``bench/gpu_verifier.py`` (a Qwen2.5-14B-shaped verifier, random weights, bf16).

Only sizes, models, data, the reward's tolerance for a random model's replies and MoCo's one-GPU topology are
changed (``TINY``, ``REWARDS``, ``TOPOLOGY``); other ``train.*`` settings stay the presets' (``test_gpu_smoke.py`` checks that no joint turns
gradient checkpointing, bf16 or vLLM off). The report (``report.md``, ``report.json`` in ``--out``) and the
printed table give pass/fail/skip and seconds per joint, the date and the device.

``--cpu-rehearsal``: NOT the GPU check. The same joints on the CPU with the CPU's trainer settings (no bf16,
no vLLM: a CPU has neither), DeepSpeed's CPU configs over gloo, the launch script's server replaced by a
llama.cpp stand-in (``captionrl.testing.vllm_standin``) and the bench with ``--tiny``: it shows the joints'
plumbing works, and nothing about a GPU. Every line it prints says so.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REHEARSAL = "CPU rehearsal, NOT the GPU check"

STEPS = ["train.max_steps=2", "train.save_steps=1", "train.report_to=[]", "train.preflight_items=1",
         "train.force_preflight=true", "train.num_generations=2", "train.per_device_train_batch_size=2",
         "train.max_completion_length=8"]
"""Two steps of two captions, a checkpoint each (the preflight runs and is overridden: a random model)."""
TINY: dict[str, list[str]] = {
    "lineup": ["policy.model=tiny-qwen2.5-vl", "data.prepared=null", "data.window=8", "data.series=[nile,sunspots]",
               "data.n_train=4", "data.n_val=1", "data.n_test=1", "reward.k=2"],
    "rubicap": ["policy.model=tiny-qwen2.5-vl", "data.source=scenes", "data.scene_count=4",
                "data.n=null", "rubrics.source=facts"],
    "moco": ["policy.model=tiny-qwen3-vl", "data.source=scenes", "data.n=4", "data.mix=[]",
             "rubric.n_candidates=2", "rubric.max_new_tokens=16"],
}
"""Per preset: the tiny model of the paper's family and offline data in place of the paper's."""
REWARDS: dict[str, list[str]] = {
    "lineup": [],  # the served verifier answers letters (a real model)
    "rubicap": ["judge.kind=hf", "judge.model=tiny-qwen2.5-vl", "reward.rubric.mode=likelihood", "reward.rubric.decision=soft"],
    "moco": ["rubric.fallback=facts", "reward.max_fallback_frac=1.0", "judge.mode=likelihood", "judge.decision=soft"],
}
"""A random model writes no JSON: the judge scores by likelihood, and MoCo falls back to fact rubrics."""
TOPOLOGY: dict[str, list[str]] = {
    "moco": ["policy.lora=true", "train.vllm_mode=colocate"],
}
"""Per preset, the one- or two-GPU topology its launch script runs (``scripts/launch/moco-1gpu.sh``): the MoCo
preset's own full-parameter topology serves the rollouts from a GPU of their own (``trl vllm-serve``,
``moco-node.sh``), which a smoke on one GPU does not have."""
CPU_TRAIN = ["train.use_cpu=true", "train.bf16=false", "train.use_vllm=false", "train.threads=1"]
"""The only settings the CPU rehearsal changes (a CPU has no bf16 kernels to speak of and no vLLM)."""


@dataclass
class Joint:
    name: str
    passed: bool
    seconds: float
    command: str
    tail: str
    skipped: str = ""  # why the joint did not run (it then counts as passed)

    @property
    def result(self) -> str:
        return "skip" if self.skipped else "pass" if self.passed else "FAIL"


def free_port() -> int:
    """A free TCP port (the rendezvous, the served verifier)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cuda_devices() -> int:
    """How many CUDA devices torch sees (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def run_joint(name: str, cmd: list[str], out: Path, timeout: int, env: dict[str, str] | None = None, *,
              graceful: bool = False) -> Joint:
    """Run one joint in a process group of its own; at ``timeout`` stop it and keep every process's stack.
    ``graceful``: the joint is a launch script, whose servers and training run in sessions of their own: it
    gets SIGTERM first (it then stops them) before its own group gets SIGABRT and SIGKILL."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONFAULTHANDLER": "1",  # a joint stopped at its timeout prints where each of its processes was
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]), **(env or {})}
    env.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.perf_counter()
    # A process group of its own: at the timeout every process of the joint stops, not only the first (the
    # DeepSpeed joint's ranks outlived a killed ``accelerate launch`` and slowed every later joint).
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=timeout)
        passed = proc.returncode == 0
        if not passed:  # a death by signal (the OOM killer, a crash at exit) prints no traceback
            text += f"\nexit status {proc.returncode}\n"
    except subprocess.TimeoutExpired:
        if graceful:
            signal_group(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=90)
        passed, text = False, f"timed out after {timeout} s; each process's Python stack at that moment:\n{stop_group(proc)}"
    except BaseException:
        signal_group(proc.pid, signal.SIGTERM)  # a launch script stops its servers on SIGTERM
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=60)
        signal_group(proc.pid, signal.SIGKILL)
        raise
    seconds = round(time.perf_counter() - t0, 1)
    (out / f"{name}.log").write_text(text)
    joint = Joint(name, passed, seconds, " ".join(cmd), text[-1500:])
    print(f"{joint.result:<5} {name:<14} {seconds:>7.1f} s", flush=True)
    return joint


def skip_joint(name: str, why: str) -> Joint:
    print(f"{'skip':<5} {name:<14} {'-':>7}   ({why})", flush=True)
    return Joint(name, True, 0.0, "", "", skipped=why)


def stop_group(proc: subprocess.Popen) -> str:
    """SIGABRT to every process of ``proc``'s group (each prints its stack: ``PYTHONFAULTHANDLER``), then SIGKILL
    to whatever is left; returns all the output."""
    signal_group(proc.pid, signal.SIGABRT)
    try:
        text, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:  # a process that ignored SIGABRT
        signal_group(proc.pid, signal.SIGKILL)
        text, _ = proc.communicate()
    signal_group(proc.pid, signal.SIGKILL)  # whatever of the group is left
    return text


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


NCCL_CHECK = """\
import os, torch, torch.distributed as dist
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
x = torch.full((1 << 20,), float(rank + 1), device="cuda")
dist.all_reduce(x)
assert float(x[0]) == sum(range(1, dist.get_world_size() + 1)), float(x[0])
print(f"rank {rank}: all_reduce over {dist.get_world_size()} ranks, NCCL {torch.cuda.nccl.version()}", flush=True)
dist.destroy_process_group()
"""

DEVICE_CHECK = """\
import importlib, torch
n = torch.cuda.device_count() if torch.cuda.is_available() else 0
names = [torch.cuda.get_device_name(i) + f' {torch.cuda.get_device_properties(i).total_memory / 2**30:.0f} GiB' for i in range(n)]
print('device:', ', '.join(names) if n else 'cpu (no CUDA device)')
versions = {m: getattr(importlib.import_module(m), '__version__', '?') for m in ('torch', 'transformers', 'trl', 'deepspeed')}
try:
    import vllm; versions['vllm'] = vllm.__version__
except ImportError:
    versions['vllm'] = 'not installed'
print(' '.join(f'{k} {v}' for k, v in versions.items()), 'cuda', torch.version.cuda)
"""


def accelerate_cmd(py: str, config: str, nproc: int) -> list[str]:
    return [py, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / "configs" / "accelerate" / config),
            "--num_processes", str(nproc), "--main_process_port", str(free_port())]


def recipe_args(recipe: str, rehearsal: bool, out: Path) -> list[str]:
    """``--config`` and overrides of one recipe joint: the preset, at tiny scale, with the preset's trainer."""
    return ["--config", str(ROOT / "configs" / f"{recipe}-paper.yaml"), *TINY[recipe], *REWARDS[recipe],
            *TOPOLOGY.get(recipe, []), *STEPS,
            *(CPU_TRAIN if rehearsal else []), f"train.out_dir={out / recipe}"]


def joints(rehearsal: bool, out: Path, gpus: int) -> list[tuple[str, list[str] | str, dict[str, str]]]:
    """(name, command or the reason it is skipped, extra environment) of every joint, in order."""
    py = sys.executable
    ranks = 2 if gpus >= 2 else 1
    todo: list[tuple[str, list[str] | str, dict[str, str]]] = [("device", [py, "-c", DEVICE_CHECK], {})]
    if rehearsal:
        todo.append(("nccl", "a CPU has no NCCL", {}))
    elif gpus < 2:
        todo.append(("nccl", "one GPU: two ranks need two", {}))
    else:
        (out / "nccl_check.py").write_text(NCCL_CHECK)
        todo.append(("nccl", [py, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                              str(free_port()), str(out / "nccl_check.py")], {}))
    todo.append(lineup_served(py, rehearsal, out))
    zero3, zero2 = ("cpu-zero3.yaml", "cpu-zero2.yaml") if rehearsal else ("multi-gpu-zero3.yaml", "multi-gpu-zero2.yaml")
    todo.append(("rubicap-zero3", [*accelerate_cmd(py, zero3, ranks), "-m", "captionrl.cli", "train", "rubicap",
                                   *recipe_args("rubicap", rehearsal, out)], {}))
    todo.append(("moco", [*accelerate_cmd(py, zero2, ranks), "-m", "captionrl.cli", "train", "moco",
                          *recipe_args("moco", rehearsal, out)], {}))
    bench = [py, str(ROOT / "bench" / "gpu_verifier.py"), "--out", str(out / "gpu_verifier.json")]
    # a GPU's figures are kept beside the smoke run's outputs for a person to record in docs/results/; the
    # rehearsal's tiny-model figures are not a benchmark
    todo.append(("gpu-verifier", [*bench, "--tiny", "--device", "cpu"] if rehearsal
                 else [*bench, "--record", str(out / "gpu_verifier.md")], {}))
    return todo


def lineup_served(py: str, rehearsal: bool, out: Path) -> tuple[str, list[str] | str, dict[str, str]]:
    """LineupRL through its one-GPU launch script: a served verifier (vLLM, or llama.cpp in the rehearsal)."""
    from captionrl.embedded import embedded_gguf_path, embedded_model_dir

    port = free_port()
    env = {"CAPTIONRL_PYTHON": py, "CAPTIONRL_LAUNCH_LOGS": str(out / "lineup-served-servers"),
           "CAPTIONRL_MAIN_PROCESS_PORT": str(free_port()), "CAPTIONRL_READY_TIMEOUT": "600"}
    if rehearsal:
        if importlib.util.find_spec("llama_cpp") is None:
            return "lineup-served", "the rehearsal's stand-in server needs llama-cpp-python (pip install -e '.[server]')", {}
        env |= {"CAPTIONRL_SERVE_CMD": f"{py} -m captionrl.testing.vllm_standin",
                "CAPTIONRL_SERVE_MODEL": str(embedded_gguf_path()),
                "CAPTIONRL_ACCELERATE_CONFIG": "configs/accelerate/cpu-zero2.yaml"}
    else:
        env |= {"VERIFIER_MODEL": str(embedded_model_dir()),  # a real 135M model answers the letters
                "CAPTIONRL_SERVE_CMD": f"{shutil.which('vllm', path=str(Path(py).parent)) or 'vllm'} serve"}
    args = recipe_args("lineup", rehearsal, out)[2:]  # the script gives --config itself
    return "lineup-served", ["bash", str(ROOT / "scripts" / "launch" / "lineup-1gpu.sh"),
                             f"verifier.base_url=http://127.0.0.1:{port}/v1", *args], env


def report(results: list[Joint], out: Path, rehearsal: bool, device: str) -> dict:
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    ran = [j for j in results if not j.skipped]
    summary = {"date": date, "device": device, "rehearsal": rehearsal, "passed": all(j.passed for j in results),
               "total_seconds": round(sum(j.seconds for j in results), 1),
               "joints": [{**asdict(j), "result": j.result} for j in results]}
    (out / "report.json").write_text(json.dumps(summary, indent=2))
    title = f"# GPU smoke test{f' ({REHEARSAL}: CPU, no vLLM, no bf16)' if rehearsal else ''}"
    verdict = "all joints that ran passed" if summary["passed"] else "FAILED"
    lines = [title, "", f"{date}, device: {device}; {verdict} ({len(ran)} ran, {len(results) - len(ran)} skipped) "
             f"in {summary['total_seconds']} s", "", "| joint | result | seconds | note |", "|---|---|---:|---|"]
    lines += [f"| {j.name} | {j.result} | {j.seconds if not j.skipped else '-'} | {j.skipped} |" for j in results]
    for j in results:
        if not j.passed:
            lines += ["", f"## {j.name} (failed)", "", f"`{j.command}`", "", "```", j.tail, "```"]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return summary


def print_table(results: list[Joint], device: str, rehearsal: bool) -> None:
    print(f"\n{'GPU smoke test' if not rehearsal else REHEARSAL}: {device}")
    print(f"{'joint':<15}{'result':<8}{'seconds':>8}  note")
    for j in results:
        print(f"{j.name:<15}{j.result:<8}{(f'{j.seconds:.1f}' if not j.skipped else '-'):>8}  {j.skipped}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu-rehearsal", "--dry-run", dest="rehearsal", action="store_true",
                    help="NOT the GPU check: the joints on the CPU without bf16 and vLLM (--dry-run is its old name)")
    ap.add_argument("--out", default="runs/gpu-smoke", help="folder for the runs, the logs and the report")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per joint")
    ap.add_argument("--only", nargs="*", default=None, help="run only these joints (names as in the report)")
    args = ap.parse_args(argv)
    gpus = cuda_devices()
    if not args.rehearsal and gpus == 0:
        import torch

        print(f"gpu_smoke: no CUDA device (torch {torch.__version__}, CUDA build {torch.version.cuda}): this is the "
              "GPU check and cannot pass here; run it on the GPU machine after scripts/setup.sh --gpu "
              f"(on a CPU, scripts/gpu_smoke.sh --cpu-rehearsal rehearses the joints: {REHEARSAL})", file=sys.stderr)
        return 2
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)  # a smoke test starts clean: no resume from an older run
    out.mkdir(parents=True)
    if args.rehearsal:
        print(f"gpu_smoke: {REHEARSAL}: the joints on the CPU (no bf16, no vLLM, llama.cpp for the served verifier)",
              flush=True)
    results = []
    for name, cmd, env in joints(args.rehearsal, out, gpus):
        if args.only is not None and name not in args.only:
            continue
        results.append(skip_joint(name, cmd) if isinstance(cmd, str) else
                       run_joint(name, cmd, out, args.timeout, env, graceful=name == "lineup-served"))
    device = next((line.removeprefix("device: ") for j in results if j.name == "device" and j.passed
                   for line in j.tail.splitlines() if line.startswith("device: ")), "unknown")
    summary = report(results, out, args.rehearsal, device)
    print_table(results, device, args.rehearsal)
    print(f"report: {out / 'report.md'}")
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
