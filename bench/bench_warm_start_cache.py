"""The main job's warm start as a given commit runs it and as this checkout runs it, side by side in one run:
TRL's ``train_runtime`` of each, its ratio, and how far apart the two trained models are (a speedup must not
change what is learned).

The reference side is ``--ref``'s code and config (``git archive`` of its ``src`` and ``configs``, its ``src``
first on ``PYTHONPATH``); the new side is this checkout with ``--overrides`` (``warm_start.reuse_frozen=false``
measures the frozen-bottom cache's own share against ``--ref HEAD``). Each side runs the package's own warm
start (``train.warm_start.warm_start``, as ``captionrl train lineup`` does) on its config's training windows
and warm-start settings (``configs/lineup-cpu.yaml``), one torch thread each, both started at once so they
share the machine's conditions; the reference commit must have the same ``warm_start(cfg, rows, model,
processing, out)`` entry point. ``--avx2`` holds torch, oneDNN and MKL to AVX2 kernels (a CPU without AVX512 or
native bf16). ``--n_train`` and ``--epochs`` make a shorter run. ``--record FILE`` also appends the printed
table to FILE.

    .venv/bin/python bench/bench_warm_start_cache.py --ref main --out /tmp/bench-ws --n_train 16
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

CONFIG = "configs/lineup-cpu.yaml"


def child(out: Path, config: str, overrides: list[str], n_train: int, epochs: float, seed: int) -> None:
    """One warm start, as ``captionrl train lineup`` runs it, by the ``captionrl`` package first on the path;
    writes ``summary.json`` and ``weights.pt``."""
    import torch

    from captionrl.config import load_config
    from captionrl.domains.lineup_data import build_lineup_data
    from captionrl.train.lineup import LineupConfig
    from captionrl.train.run.loading import load_policy
    from captionrl.train.warm_start import warm_start

    torch.set_num_threads(1)
    cfg = load_config(LineupConfig, config, [f"seed={seed}", f"data.n_train={n_train}", f"warm_start.epochs={epochs}",
                                             f"train.out_dir={out}", *overrides])
    rows = build_lineup_data(cfg.data, cfg.reward.k, cfg.seed).rows["train"]
    model, processing, _ = load_policy(cfg.policy)
    torch.manual_seed(seed)
    summary = warm_start(cfg, rows, model, processing, out)
    torch.save({k: v for k, v in model.state_dict().items()}, out / "weights.pt")
    (out / "summary.json").write_text(json.dumps(summary))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_ref_flags(ap, "its code and its config run as the reference side")
    ap.add_argument("--out", help="folder for both runs (default: a temporary one)")
    ap.add_argument("--n_train", type=int, default=128, help="training windows (the CPU config's 128)")
    ap.add_argument("--epochs", type=float, default=4, help="warm-start epochs (the CPU config's 4)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--avx2", action="store_true", help="hold torch, oneDNN and MKL to AVX2 kernels")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)  # CONFIG [KEY=VALUE...]: one side's warm start
    add_record_flag(ap)
    args = ap.parse_args()
    if args.child:
        child(Path(args.out), args.child[0], args.child[1:], args.n_train, args.epochs, args.seed)
        return 0

    say = Printed(__file__)
    say(cpu_line() + (" | kernels held to AVX2" if args.avx2 else ""))
    with tempfile.TemporaryDirectory(prefix="bench-ws-cache-") as tmp:
        out = Path(args.out) if args.out else Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        tree = ref_tree(args.ref, out)
        sides = {"ref": (str(tree / CONFIG), [], tree / "src"), "new": (str(ROOT / CONFIG), args.overrides, None)}
        procs = {}
        for name, (config, overrides, src) in sides.items():
            folder = out / name
            folder.mkdir(parents=True, exist_ok=True)
            env = child_env(AVX2_ENV if args.avx2 else {}, threads=1)
            if src is not None:
                env["PYTHONPATH"] = str(src) + os.pathsep + env["PYTHONPATH"]
            cmd = [sys.executable, __file__, "--ref", args.ref, "--child", config, *overrides, "--out", str(folder),
                   "--n_train", str(args.n_train), "--epochs", str(args.epochs), "--seed", str(args.seed)]
            log = (folder / "log.txt").open("w")
            procs[name] = (subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), time.time(), log)
        walls = {}
        for name, (proc, start, log) in procs.items():
            if proc.wait() != 0:
                say(f"{name}: exited {proc.returncode}; see {out / name / 'log.txt'}")
                return 1
            walls[name] = time.time() - start
            log.close()
        import torch

        summary = {n: json.loads((out / n / "summary.json").read_text()) for n in procs}
        weights = {n: torch.load(out / n / "weights.pt") for n in procs}
        diff = max(float((weights["new"][k] - v).abs().max()) for k, v in weights["ref"].items())
        say(f"warm start of {args.n_train} windows x {args.epochs:g} epochs, seed {args.seed}, two runs side by side, "
            f"one torch thread each; ref: {args.ref}; new: this checkout {' '.join(args.overrides)}".rstrip())
        say("| run | train_runtime | steps | s/step | wall (with loading) |")
        say("|---|---|---|---|---|")
        for n in procs:
            s = summary[n]
            say(f"| {n} | {s['seconds']:.0f} s | {s['steps']} | {s['seconds'] / s['steps']:.2f} | {walls[n]:.0f} s |")
        ratio = summary["new"]["seconds"] / summary["ref"]["seconds"]
        say(f"new/ref train_runtime: {ratio:.2f}x; frozen-bottom cache: "
            f"{ {n: summary[n].get('frozen_bottom_cache') for n in procs} }")
        say(f"training loss: { {n: summary[n].get('train_loss') for n in procs} }")
        say(f"largest weight difference between the two trained models: {diff:.2e}")
        say.record(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
