"""The README's whole main command (``configs/lineup-cpu.yaml``: preflight, training, final checks) as a given
commit runs it and as this checkout runs it, side by side in one run: wall and CPU time, their ratio, and the
checks each trained model gets that did not produce its reward.

The reference side is ``--ref``'s code *and* config (``git archive`` of its ``src`` and ``configs`` into the
output folder, its ``src`` first on ``PYTHONPATH``); the new side is this checkout with ``--config`` and
``--overrides``. By default both verifiers are held to float32 (what ``dtype: auto`` picks on a CPU without
native bf16; ``--native_dtype`` lets each config choose) and both runs start at once with one torch thread
each, so they share the machine's conditions (``--sequential`` runs them one after the other with the machine
to themselves). ``--record FILE`` also appends the printed table to FILE.

    .venv/bin/python bench/bench_main_job.py --ref main --out /tmp/bench-main-job --overrides train.beta=0.0

Each run's CPU time (user + system, from ``wait4``) is printed beside its wall time: it does not grow when
other jobs share the cores. Each run's wall time runs from its launch to the moment its process exits (the
runs are polled, so the one that ends first is timed when it ends). ``--collect`` prints and records the table
from finished run folders under ``--out`` without running anything, taking each wall time from its log's
creation and last write (``stat``): for a bench whose own process was stopped while its runs went on.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import ROOT, Printed, add_record_flag, add_ref_flags, cpu_line, ref_tree
from bench_main_job_step import AVX2_ENV, child_env

CHECKS = ("red", "red_of_checkable", "green", "c2s[claims]", "transcription", "ends_with_stop", "clipped_ratio",
          "length_chars", "bottleneck_mse", "c2s[train]")
"""Final-check columns, the training verifier's own ``c2s[train]`` last (it produced the reward)."""


def command(config: str, overrides: list[str], out_dir: Path, threads: int | None) -> list[str]:
    fixed = [f"train.out_dir={out_dir}", "train.report_to=[]"]
    if threads:
        fixed.append(f"train.threads={threads}")
    return [sys.executable, "-m", "captionrl.cli", "train", "lineup", "--config", config, *fixed, *overrides]


def launch(name: str, cmd: list[str], log: Path, env_extra: dict[str, str], threads: int | None,
           src: Path | None = None) -> subprocess.Popen:
    env = child_env(env_extra, threads)
    if src is not None:  # the reference commit's package ahead of this checkout's
        env["PYTHONPATH"] = str(src) + os.pathsep + env["PYTHONPATH"]
    print(f"{name}: {' '.join(cmd[3:])}", flush=True)
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def collect(name: str, run_dir: Path, log: Path, rc: int, wall: float, cpu: float | None = None) -> dict:
    result = run_dir / "result.json"
    if rc != 0 or not result.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise SystemExit(f"{name}: exit {rc}, no result.json; last lines of {log}:\n{tail}")
    res = json.loads(result.read_text())
    checks = json.loads((run_dir / "eval" / "final_checks.json").read_text())
    rows = {r["system"]: r for r in checks["rows"]}
    timing = json.loads((run_dir / "timing.json").read_text())
    return {"name": name, "wall_s": wall, "cpu_s": cpu, "train_s": res["train_seconds"], "steps": res["steps"],
            "step_s": res["step_seconds"], "rows": rows, "timing": timing, "verdict": checks.get("verdict")}


def log_wall(log: Path) -> float:
    """A finished run's wall time from its log: created at launch, last written when the process exited."""
    born = subprocess.run(["stat", "-c", "%W", str(log)], capture_output=True, text=True, check=True).stdout.strip()
    if not born.isdigit() or int(born) == 0:
        raise SystemExit(f"{log}: the file system keeps no creation time; --collect cannot time this run")
    return os.stat(log).st_mtime - int(born)


def reap(proc: subprocess.Popen) -> tuple[int, float] | None:
    """``(exit code, CPU seconds)`` of a run that has exited, else ``None``.

    ``wait4`` returns the run's own resource usage: its user + system CPU time does not grow when another
    job takes the cores, so it is the figure to read beside a wall time measured on a shared machine."""
    pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
    if pid == 0:
        return None
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


def wait_all(pending: dict[str, tuple[subprocess.Popen, Path, Path, float]]) -> dict[str, dict]:
    """Poll the runs and time each one when its own process exits (not when an earlier one does)."""
    results: dict[str, dict] = {}
    while pending:
        for name in list(pending):
            proc, run_dir, log, t0 = pending[name]
            done = reap(proc)
            if done is not None:
                rc, cpu = done
                results[name] = collect(name, run_dir, log, rc, time.perf_counter() - t0, cpu)
                print(f"{name}: {results[name]['wall_s']:.0f} s wall, {cpu:.0f} s CPU", flush=True)
                del pending[name]
        time.sleep(1.0)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_ref_flags(ap, "its code and its config run as the reference side")
    ap.add_argument("--config", default=str(ROOT / "configs" / "lineup-cpu.yaml"), help="this checkout's config")
    ap.add_argument("--ref_config", default="configs/lineup-cpu.yaml",
                    help="the reference side's config, a path inside --ref's tree (default: %(default)s)")
    ap.add_argument("--ref_overrides", nargs="*", default=[], metavar="KEY=VALUE",
                    help="settings for the reference side only (keys its code knows)")
    ap.add_argument("--sequential", action="store_true", help="one run after the other, torch's default threads")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads per run (default: 1 side by side, torch's default with --sequential)")
    ap.add_argument("--native_dtype", action="store_true", help="let each config choose its verifier dtype")
    ap.add_argument("--avx2", action="store_true", help="torch, oneDNN and MKL held to AVX2 kernels (no AVX512, no native bf16)")
    ap.add_argument("--out", default=None, help="keep the runs here (default: a temporary folder)")
    ap.add_argument("--collect", action="store_true",
                    help="run nothing: print and record the table from the finished runs under --out")
    add_record_flag(ap)
    args = ap.parse_args()

    threads = args.threads if args.threads else (None if args.sequential else 1)
    dtype = [] if args.native_dtype else ["verifier.dtype=float32"]
    env_extra = AVX2_ENV if args.avx2 else {}
    say = Printed(__file__)
    say(cpu_line())
    say(f"ref: the code and config of {args.ref} {' '.join(args.ref_overrides)}".rstrip()
        + f"; new: this checkout, {Path(args.config).name} {' '.join(args.overrides)}".rstrip())
    say(f"{'sequential' if args.sequential else 'side by side'}, {threads or 'default'} torch thread(s) each; verifier "
        f"{'as configured' if args.native_dtype else 'float32 in both'}; kernels {'AVX2 only' if args.avx2 else 'native'}")
    names = ("ref", "new")
    if args.collect:
        if not args.out:
            raise SystemExit("--collect needs --out, the folder holding the finished runs")
        out = Path(args.out)
        say(f"collected from {out}: wall times from each run log's creation and last write")
        results = {name: collect(name, out / name, out / f"{name}.log", 0, log_wall(out / f"{name}.log"))
                   for name in names}
    else:
        with tempfile.TemporaryDirectory(prefix="bench-main-job-") as tmp:
            out = Path(args.out) if args.out else Path(tmp)
            out.mkdir(parents=True, exist_ok=True)
            tree = ref_tree(args.ref, out)
            setups = {"ref": (str(tree / args.ref_config), [*dtype, *args.ref_overrides], tree / "src"),
                      "new": (args.config, [*dtype, *args.overrides], None)}
            results, pending = {}, {}
            for name, (config, overrides, src) in setups.items():
                run_dir, log = out / name, out / f"{name}.log"
                proc = launch(name, command(config, overrides, run_dir, threads), log, env_extra, threads, src)
                pending[name] = (proc, run_dir, log, time.perf_counter())
                if args.sequential:
                    results.update(wait_all(pending))
            results.update(wait_all(pending))

    say()
    say(f"{'run':<5} {'wall s':>8} {'CPU s':>8} {'train s':>8} {'steps':>6} {'s/step':>7} {'verifier dtype':>15}")
    for r in results.values():
        vd = next((v["dtype"] for k, v in r["timing"].get("dtypes", {}).items() if k.startswith("hf:")), "?")
        cpu = f"{r['cpu_s']:>8.0f}" if r["cpu_s"] is not None else f"{'-':>8}"
        say(f"{r['name']:<5} {r['wall_s']:>8.0f} {cpu} {r['train_s']:>8.0f} {r['steps']:>6} {r['step_s']:>7.1f} {vd:>15}")
    say(f"\nwall time new/ref: {results['new']['wall_s'] / results['ref']['wall_s']:.2f}x")
    if all(r["cpu_s"] for r in results.values()):
        say(f"CPU time new/ref: {results['new']['cpu_s'] / results['ref']['cpu_s']:.2f}x "
            "(user + system seconds of each run: unchanged by other jobs on the machine)")
    say("\nfinal checks (each run's own test windows; c2s[train] is the training verifier, the rest did not "
        "produce the reward)")
    say(f"{'run/model':<14} {'n':>4} " + " ".join(f"{c:>16}" for c in CHECKS))
    for r in results.values():
        for system in ("trained", "initial"):
            row = r["rows"].get(system, {})
            cells = [f"{row[c]:>16.3f}" if isinstance(row.get(c), (int, float)) else f"{'-':>16}" for c in CHECKS]
            say(f"{r['name'] + '/' + system:<14} {row.get('n', '-'):>4} " + " ".join(cells))
    for r in results.values():
        controls = {s: r["rows"][s]["bottleneck_mse"] for s in ("naive", "empty caption", "shuffled caption")
                    if s in r["rows"]}
        say(f"{r['name']}: bottleneck controls {json.dumps(controls)}")
        if r.get("verdict"):
            say(f"{r['name']}: {r['verdict']['line']}")
    say.record(args)


if __name__ == "__main__":
    main()
