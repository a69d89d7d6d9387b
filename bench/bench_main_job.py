"""The README's whole main command (``configs/lineup-cpu.yaml``: preflight, training, final checks) with the
config as it stood before issue 21 against today's, side by side in one run: wall time, its ratio, and the
checks each trained model gets that did not produce its reward.

Issue 21 asks for the main command in at most a third of its wall time on the day the issue was filed,
on the same machine. Old, by default: the command as a user ran it then, the code *and* config of
``OLD_REF`` (e6c58d9, whose README command the issue timed: 32 steps of 2 series x 4 captions, 128-token
captions, 12 test windows), extracted with ``git archive`` into the output folder and run from there.
``--old_ref current`` is the stricter baseline: the old config
(``bench/baselines/lineup-cpu-before-issue21.yaml``, the same file) on today's code with TRL's own loss pass
(``train.shared_prompt_forward=false``), which credits the old side with every later speedup of shared
code (verifier prefix sharing, the skipped old-policy pass, the batched preflight). New: the config as it is. By default both
verifiers are held to float32 (what ``dtype: auto`` picks on a CPU without native bf16; ``--native_dtype``
lets each config choose) and both runs start at once with one torch thread each, so they share the
machine's conditions (``--sequential`` runs them one after the other with the machine to themselves).
``--record FILE`` also appends the printed table to FILE.

    .venv/bin/python bench/bench_main_job.py --out /tmp/bench-main-job

Each run's CPU time (user + system, from ``wait4``) is printed beside its wall time: it does not grow
when other jobs share the cores. Each run's wall time runs from its launch to the moment its process exits (the runs are polled, so the one
that ends first is timed when it ends). ``--collect`` prints and records the table from finished run folders
under ``--out`` without running anything, taking each wall time from its log's creation and last write
(``stat``): for a bench whose own process was stopped while its runs went on.
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

from _workload import ROOT, add_record_flag, cpu_line, record_result
from bench_main_job_step import AVX2_ENV, child_env

OLD_CONFIG = ROOT / "bench" / "baselines" / "lineup-cpu-before-issue21.yaml"
OLD_OVERRIDES = ["train.shared_prompt_forward=false"]
"""On today's code the old command runs TRL's own loss pass (the shared-prompt forward came with issue 21)."""
MAIN_JOB_BUDGET_S = 600.0
"""Issue 32: the main command within 10 minutes on 2 cores of a CPU without native bf16, one torch thread."""
OLD_REF = "e6c58d9"
"""The commit whose README main command issue 21 timed (its configs/lineup-cpu.yaml is OLD_CONFIG)."""


def old_checkout(ref: str, out: Path) -> Path:
    """``ref``'s tree extracted under ``out`` (no git state is touched): its ``src`` and ``configs``."""
    dest = out / f"old-src-{ref}"
    if not (dest / "src").is_dir():
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "src", "configs"], capture_output=True,
                                 check=False)
        if archive.returncode != 0:
            raise SystemExit(f"--old_ref {ref}: git archive failed ({archive.stderr.decode().strip()}); "
                             "give a commit of this repository, or --old_ref current")
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest
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
    if src is not None:  # the old commit's package ahead of this checkout's
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
            "step_s": res["step_seconds"], "rows": rows, "timing": timing}


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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "lineup-cpu.yaml"))
    ap.add_argument("--old_config", default=None,
                    help="old side's config (default: the old commit's configs/lineup-cpu.yaml, or OLD_CONFIG "
                         "with --old_ref current)")
    ap.add_argument("--old_ref", default=OLD_REF,
                    help="commit whose code and config are the old side (default: %(default)s, the command "
                         "issue 21 timed); 'current': the old config on today's code")
    add_record_flag(ap)
    ap.add_argument("--sequential", action="store_true", help="one run after the other, torch's default threads")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads per run (default: 1 side by side, torch's default with --sequential; "
                         "--sequential --threads 1 is issue 32's condition with the machine to each run)")
    ap.add_argument("--native_dtype", action="store_true", help="let each config choose its verifier dtype")
    ap.add_argument("--avx2", action="store_true", help="torch, oneDNN and MKL held to AVX2 kernels (no AVX512, no native bf16)")
    ap.add_argument("--out", default=None, help="keep the runs here (default: a temporary folder)")
    ap.add_argument("--collect", action="store_true",
                    help="run nothing: print and record the table from the finished runs under --out")
    args = ap.parse_args()

    threads = args.threads if args.threads else (None if args.sequential else 1)
    dtype = [] if args.native_dtype else ["verifier.dtype=float32"]
    setups = {"old": (args.old_config or str(OLD_CONFIG), OLD_OVERRIDES + dtype), "new": (args.config, dtype)}
    env_extra = AVX2_ENV if args.avx2 else {}
    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    say(cpu_line())
    old_code = "today's code, TRL's loss pass" if args.old_ref == "current" else f"the code and config of {args.old_ref}"
    say(f"old: {old_code}; new: this checkout")
    say(f"{'sequential' if args.sequential else 'side by side'}, {threads or 'default'} torch thread(s) each; verifier "
        f"{'as configured' if args.native_dtype else 'float32 in both'}; kernels {'AVX2 only' if args.avx2 else 'native'}")
    if args.collect:
        if not args.out:
            raise SystemExit("--collect needs --out, the folder holding the finished runs")
        out = Path(args.out)
        say(f"collected from {out}: wall times from each run log's creation and last write")
        results = {name: collect(name, out / name, out / f"{name}.log", 0, log_wall(out / f"{name}.log"))
                   for name in setups}
    else:
        with tempfile.TemporaryDirectory(prefix="bench-main-job-") as tmp:
            out = Path(args.out) if args.out else Path(tmp)
            out.mkdir(parents=True, exist_ok=True)
            results, pending = {}, {}
            srcs: dict[str, Path | None] = {"old": None, "new": None}
            if args.old_ref != "current":
                tree = old_checkout(args.old_ref, out)
                srcs["old"] = tree / "src"
                setups["old"] = (args.old_config or str(tree / "configs" / "lineup-cpu.yaml"), dtype)
            for name, (config, overrides) in setups.items():
                run_dir, log = out / name, out / f"{name}.log"
                proc = launch(name, command(config, overrides, run_dir, threads), log, env_extra, threads, srcs[name])
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
    ratio = results["new"]["wall_s"] / results["old"]["wall_s"]
    say(f"\nwall time new/old: {ratio:.2f}x (issue 21's target against e6c58d9: <= 0.33x)")
    new_wall = results["new"]["wall_s"]
    say(f"new wall time: {new_wall:.0f} s ({'within' if new_wall <= MAIN_JOB_BUDGET_S else 'OVER'} issue 32's "
        f"{MAIN_JOB_BUDGET_S:.0f} s on 2 cores without native bf16, one torch thread)")
    if all(r["cpu_s"] for r in results.values()):
        say(f"CPU time new/old: {results['new']['cpu_s'] / results['old']['cpu_s']:.2f}x "
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
        say(f"{r['name']}: bottleneck controls {json.dumps(controls)}; "
            f"old-policy log-probs {r['timing'].get('old_policy_logprobs', '?')[:40]}; "
            f"shared-prompt forward {json.dumps(r['timing'].get('shared_prompt_forward', '?'))}")
    record_result("bench_main_job.py", " ".join(sys.argv[1:]), "\n".join(lines), path=args.record)


if __name__ == "__main__":
    main()
