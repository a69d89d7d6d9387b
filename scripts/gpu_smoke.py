"""The GPU smoke test behind ``scripts/gpu_smoke.sh``: every joint of the GPU path once, on tiny random models
of the papers' families (no download), one report.

Joints, each a separate process so one failure does not hide the others:

- ``device``: what torch sees (CUDA device name and memory, or the CPU in a dry run);
- ``lineup`` / ``rubicap`` / ``moco``: each recipe trains 2 steps with vLLM rollouts (colocate) on one GPU,
  then its final checks; the policy is a tiny random Qwen2.5-VL (LineupRL, RubiCap) or Qwen3-VL (MoCo),
  verifiers and judges tiny in-process models;
- ``lineup-zero3``: LineupRL again under DeepSpeed ZeRO-3 through ``accelerate launch`` with the project's own
  config (one process: the single-GPU form of the 8-GPU launch);
- ``gpu-verifier``: ``bench/gpu_verifier.py`` (a Qwen2.5-14B-shaped verifier, random weights, bf16).

``--dry-run`` runs the same joints on the CPU without vLLM (transformers generation), the ZeRO-3 joint on
``configs/accelerate/cpu-zero3.yaml`` and the bench with ``--tiny``: everything but the device and vLLM.
The report (``report.md`` and ``report.json`` in ``--out``) says pass/fail, seconds and the output's tail per
joint, with the date and the device.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

COMMON = ["train.max_steps=2", "train.save_steps=1", "train.report_to=[]", "train.preflight_items=1",
          "train.force_preflight=true", "train.num_generations=2", "train.per_device_train_batch_size=2"]
RECIPES: dict[str, tuple[str, list[str]]] = {
    "lineup": ("lineup-cpu.yaml", [
        "policy.model=tiny-qwen2.5-vl", "policy.input=chart", "policy.dtype=float32", "verifier.kind=hf",
        "verifier.model=tiny-qwen2.5-vl", "reward.mode=likelihood", "data.window=8", "data.n_train=4",
        "data.n_val=1", "data.n_test=1", "data.series=[nile,sunspots]", "reward.k=2",
        "train.max_completion_length=8", "eval.bottleneck=false"]),
    "rubicap": ("rubicap-cpu.yaml", [
        "policy.model=tiny-qwen2.5-vl", "policy.dtype=float32", "judge.kind=hf", "judge.model=tiny-qwen2.5-vl",
        "data.scene_count=4", "train.max_completion_length=8"]),
    "moco": ("moco-cpu.yaml", [
        "policy.model=tiny-qwen3-vl", "data.n=4", "train.max_completion_length=8", "rubric.max_new_tokens=16"]),
}


@dataclass
class Joint:
    name: str
    passed: bool
    seconds: float
    command: str
    tail: str


def free_port() -> int:
    """A free TCP port for the DeepSpeed joint's rendezvous."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def device_flags(dry_run: bool) -> list[str]:
    """The trainer's device settings: the GPU path (bf16 autocast, vLLM colocate) or its CPU stand-in."""
    if dry_run:
        return ["train.use_cpu=true", "train.bf16=false", "train.gradient_checkpointing=false", "train.use_vllm=false",
                "train.threads=1"]
    return ["train.use_cpu=false", "train.bf16=true", "train.gradient_checkpointing=false", "train.use_vllm=true",
            "train.vllm_mode=colocate", "train.vllm_gpu_memory_utilization=0.2"]


def run_joint(name: str, cmd: list[str], out: Path, timeout: int) -> Joint:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONFAULTHANDLER": "1",  # a joint stopped at its timeout prints where each of its processes was
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
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
        passed, text = False, f"timed out after {timeout} s; each process's Python stack at that moment:\n{stop_group(proc)}"
    except BaseException:
        signal_group(proc.pid, signal.SIGKILL)
        raise
    seconds = round(time.perf_counter() - t0, 1)
    (out / f"{name}.log").write_text(text)
    print(f"{'PASS' if passed else 'FAIL'}  {name:<13} {seconds:>7.1f} s", flush=True)
    return Joint(name, passed, seconds, " ".join(cmd), text[-1500:])


def stop_group(proc: subprocess.Popen) -> str:
    """SIGABRT to every process of ``proc``'s group (each prints its stack: ``PYTHONFAULTHANDLER``), then
    SIGKILL to whatever is left; returns all the output."""
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


def joints(dry_run: bool, out: Path) -> list[tuple[str, list[str]]]:
    """(name, command) of every joint, in order."""
    py = sys.executable
    todo: list[tuple[str, list[str]]] = [("device", [py, "-c", (
        "import torch; c = torch.cuda.is_available(); "
        "print(torch.cuda.get_device_name(0) + f', {torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB' "
        "if c else 'cpu'); print('torch', torch.__version__, 'cuda', torch.version.cuda)")])]
    flags = device_flags(dry_run)
    for name, (config, overrides) in RECIPES.items():
        todo.append((name, [py, "-m", "captionrl.cli", "train", name, "--config", str(ROOT / "configs" / config),
                            *overrides, *COMMON, *flags, f"train.out_dir={out / name}"]))
    accelerate = shutil.which("accelerate", path=str(Path(py).parent)) or "accelerate"
    config, overrides = RECIPES["lineup"]
    ds_config = "cpu-zero3.yaml" if dry_run else "multi-gpu-zero3.yaml"
    todo.append(("lineup-zero3", [accelerate, "launch", "--config_file", str(ROOT / "configs" / "accelerate" / ds_config),
                                  "--num_processes", "1", "--main_process_port", str(free_port()),
                                  "-m", "captionrl.cli", "train", "lineup", "--config", str(ROOT / "configs" / config),
                                  *overrides, *COMMON, *[f for f in flags if not f.startswith("train.use_vllm")],
                                  "train.use_vllm=false", f"train.out_dir={out / 'lineup-zero3'}"]))
    bench = [py, str(ROOT / "bench" / "gpu_verifier.py"), "--out", str(out / "gpu_verifier.json")]
    todo.append(("gpu-verifier", [*bench, "--tiny", "--device", "cpu"] if dry_run else bench))
    return todo


def report(results: list[Joint], out: Path, dry_run: bool, device: str) -> dict:
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    summary = {"date": date, "device": device, "dry_run": dry_run, "passed": all(j.passed for j in results),
               "total_seconds": round(sum(j.seconds for j in results), 1), "joints": [asdict(j) for j in results]}
    (out / "report.json").write_text(json.dumps(summary, indent=2))
    lines = [f"# GPU smoke test{' (dry run: CPU, no vLLM)' if dry_run else ''}", "",
             f"{date}, device: {device}; {'all joints passed' if summary['passed'] else 'FAILED'} "
             f"in {summary['total_seconds']} s", "", "| joint | result | seconds |", "|---|---|---:|"]
    lines += [f"| {j.name} | {'pass' if j.passed else 'FAIL'} | {j.seconds} |" for j in results]
    for j in results:
        if not j.passed:
            lines += ["", f"## {j.name} (failed)", "", f"`{j.command}`", "", "```", j.tail, "```"]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU, no vLLM: everything but the device")
    ap.add_argument("--out", default="runs/gpu-smoke", help="folder for the runs, the logs and the report")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per joint")
    ap.add_argument("--only", nargs="*", default=None, help="run only these joints (names as in the report)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)  # a smoke test starts clean: no resume from an older run
    out.mkdir(parents=True)
    results = [run_joint(name, cmd, out, args.timeout) for name, cmd in joints(args.dry_run, out)
               if args.only is None or name in args.only]
    device = next((j.tail.strip().splitlines()[0] for j in results if j.name == "device" and j.passed and j.tail.strip()),
                  "unknown")
    summary = report(results, out, args.dry_run, device)
    print(f"report: {out / 'report.md'}")
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
