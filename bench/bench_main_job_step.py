"""The README main job's RLOO step (``configs/lineup-cpu.yaml``) as a given commit runs it and as this checkout
runs it, one after the other on the machine at hand: seconds per step, their ratio and where a step goes
(reward share).

The reference side is ``--ref``'s code and config (``git archive`` of its ``src`` and ``configs``, its ``src``
first on ``PYTHONPATH``); the new side is this checkout with ``--config`` and ``--overrides``. Both run
``train.max_steps`` steps with evaluation and the reward preflight off (they are not the step), one torch
thread, no checkpoints; each run is its own process (``captionrl train lineup``) and the numbers come from its
``timing.json`` (or, for a run cut by its timeout, from its console lines).

``--avx2`` adds the same two runs with torch, oneDNN and MKL held to AVX2 kernels (``AVX2_ENV``): the CPU then
behaves like one without AVX512 or native bf16 (a laptop or a common cloud VM), where ``dtype: auto`` picks
float32.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_main_job_step.py --ref main --steps 2 --avx2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import ROOT, Printed, add_record_flag, add_ref_flags, cpu_line, ref_tree

AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
"""A CPU without AVX512 or native bf16, emulated: torch's own kernels, oneDNN's, and MKL's (torch's float32
GEMMs go to MKL, which ignores the other two: without ``MKL_ENABLE_INSTRUCTIONS`` a 1800x576 by 576x1536
float32 matmul ran at 106 GFLOPS on an AMX Xeon, with it at 66, one thread)."""
PARTS = ("generation", "reward", "verifier", "logprobs", "backward", "optimizer", "step")
STEP_LINE = re.compile(r"step (\d+) time: generation ([\d.]+)s \| reward ([\d.]+)s \(verifier ([\d.]+)s\) \| "
                       r"logprobs ([\d.]+)s \| forward/backward ([\d.]+)s \| optimizer ([\d.]+)s \| step ([\d.]+)s")
"""The per-step console line of ``train.run.timing.format_breakdown``: read back from a run cut by the timeout."""


def from_log(log: Path) -> dict:
    """Mean per-part seconds of the steps a cut run finished (its console lines); no steps: empty."""
    rows = [[float(x) for x in m.groups()[1:]] for m in STEP_LINE.finditer(log.read_text(errors="replace"))]
    if not rows:
        return {"steps": 0, "mean_seconds": {}, "share_of_step": {}, "dtypes": {}}
    mean = {p: sum(r[i] for r in rows) / len(rows) for i, p in enumerate(PARTS)}
    dtype = re.search(r"hf:embedded dtype: (\w+)", log.read_text(errors="replace"))
    return {"steps": len(rows), "mean_seconds": mean, "share_of_step": {"reward": mean["reward"] / mean["step"]},
            "dtypes": {"hf:embedded": {"dtype": dtype.group(1) if dtype else "?"}}}


def child_env(env_extra: dict[str, str], threads: int | None = None) -> dict[str, str]:
    """The environment of a bench's ``captionrl`` subprocess: this checkout's ``src`` first on the path."""
    env = {**os.environ, **env_extra, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def run_job(name: str, config: str, overrides: list[str], steps: int, out: Path, env_extra: dict[str, str],
            timeout: float | None, src: Path | None = None) -> dict:
    """One ``captionrl train lineup`` run (``src``: another commit's package, ahead of this checkout's); its
    timing.json plus the process's wall time. A run cut by ``timeout`` reports the steps its console lines
    show (``cut`` true)."""
    run_dir = out / name
    common = [f"train.max_steps={steps}", "eval.enabled=false", "train.preflight_items=0", "train.threads=1",
              "train.report_to=[]", "train.save_steps=100000", f"train.out_dir={run_dir}"]
    cmd = [sys.executable, "-m", "captionrl.cli", "train", "lineup", "--config", config, *common, *overrides]
    env = child_env(env_extra)
    if src is not None:
        env["PYTHONPATH"] = str(src) + os.pathsep + env["PYTHONPATH"]
    out.mkdir(parents=True, exist_ok=True)
    log = out / f"{name}.log"
    t0 = time.perf_counter()
    with log.open("w") as fh:
        try:
            rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, check=False,
                                timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            return {"name": name, "wall_s": time.perf_counter() - t0, "cut": True, **from_log(log)}
    wall = time.perf_counter() - t0
    timing = run_dir / "timing.json"
    if rc != 0 or not timing.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise SystemExit(f"{name}: exit {rc}, no timing.json; last lines of {log}:\n{tail}")
    return {"name": name, "wall_s": wall, "cut": False, **json.loads(timing.read_text())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_ref_flags(ap, "its code and its config run as the reference side")
    ap.add_argument("--config", default=str(ROOT / "configs" / "lineup-cpu.yaml"), help="this checkout's config")
    ap.add_argument("--ref_config", default="configs/lineup-cpu.yaml",
                    help="the reference side's config, a path inside --ref's tree (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=2, help="training steps per run (train.max_steps)")
    ap.add_argument("--avx2", action="store_true", help="also run both with AVX2 kernels only (no native bf16)")
    ap.add_argument("--avx2_timeout", type=float, default=300.0,
                    help="seconds an AVX2-only run may take (an emulated bf16 verifier can be very slow)")
    ap.add_argument("--out", default=None, help="keep the runs here (default: a temporary folder)")
    add_record_flag(ap)
    args = ap.parse_args()
    say = Printed(__file__)

    say(cpu_line())
    say(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')}; {args.steps} steps per run; "
        f"ref: the code and config of {args.ref}; new: this checkout {' '.join(args.overrides)}".rstrip())
    with tempfile.TemporaryDirectory(prefix="bench-main-job-") as tmp:
        out = Path(args.out) if args.out else Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        tree = ref_tree(args.ref, out)
        sides = {"ref": (str(tree / args.ref_config), [], tree / "src"), "new": (args.config, args.overrides, None)}
        setups = [("ref", {}), ("new", {})]
        if args.avx2:
            setups += [("new-avx2", AVX2_ENV), ("ref-avx2", AVX2_ENV)]
        results = []
        for name, env_extra in setups:
            config, overrides, src = sides[name.split("-")[0]]
            res = run_job(name, config, overrides, args.steps, out, env_extra,
                          args.avx2_timeout if env_extra else None, src)
            results.append(res)
            cut = f" (cut at {res['wall_s']:.0f} s)" if res["cut"] else ""
            if res["steps"]:
                say(f"{name}: {res['mean_seconds']['step']:.1f} s/step over {res['steps']} steps, "
                    f"process {res['wall_s']:.0f} s{cut}")
            else:
                say(f"{name}: no step finished{cut}")

    say()
    head = f"{'run':<9} {'verifier':<9} " + " ".join(f"{p:>10}" for p in PARTS) + f" {'reward share':>13}"
    say("mean seconds per step (timing.json of each run)")
    say(head)
    for res in results:
        m = res["mean_seconds"]
        if not res["steps"]:
            say(f"{res['name']:<9} no step finished in {res['wall_s']:.0f} s (model load included)")
            continue
        dtype = next((v["dtype"] for k, v in res["dtypes"].items() if "verifier" in k or k.startswith("hf:")), "?")
        share = res["share_of_step"].get("reward", float("nan"))
        say(f"{res['name']:<9} {dtype:<9} " + " ".join(f"{m[p]:>10.2f}" for p in PARTS) + f" {share:>13.3f}")
    by = {r["name"]: r["mean_seconds"]["step"] for r in results if r["steps"]}
    say()
    say(f"step time new/ref, this CPU: {by['new'] / by['ref']:.2f}x")
    if args.avx2 and "ref-avx2" in by:
        say(f"step time new/ref, AVX2 kernels only: {by['new-avx2'] / by['ref-avx2']:.2f}x")
    elif args.avx2:
        cut = next(r for r in results if r["name"] == "ref-avx2")
        say(f"step time new/ref, AVX2 kernels only: < {by['new-avx2'] / cut['wall_s']:.2f}x (the ref run finished no "
            f"step in {cut['wall_s']:.0f} s; new: {by['new-avx2']:.1f} s/step)")
    for res in results:
        say(f"{res['name']}: dtypes {json.dumps(res['dtypes'])}")
    say.record(args)


if __name__ == "__main__":
    main()
