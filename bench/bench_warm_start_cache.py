"""The main job's warm start as it runs today against a baseline, side by side in one run: TRL's
``train_runtime`` of each, its ratio, and how far apart the two trained models are (neither speedup may change
what is learned).

Today: the frozen bottom computed once per window (``warm_start.reuse_frozen: true``, ``train.bottom_cache``)
and TRL's fused LM head scoring only the labelled positions on CPU (``train.compact_head``). Baselines:
``--baseline plain`` computes the frozen bottom every epoch (the cache's own share); ``--baseline before``
also lets the fused head score every position, as TRL does on CPU (the warm start before both).

Both start at once, one torch thread each, on the CPU config's training windows and warm-start settings
(``configs/lineup-cpu.yaml``: 128 windows, 4 epochs, 20 of 30 blocks frozen), so they share the machine's
conditions. ``--avx2`` holds torch, oneDNN and MKL to AVX2 kernels (a CPU without AVX512 or native bf16).
``--n_train`` and ``--epochs`` make a shorter run. ``--record FILE`` also appends the printed table to FILE.

    .venv/bin/python bench/bench_warm_start_cache.py --out /tmp/bench-ws-cache
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import ROOT, Printed, add_record_flag, cpu_line
from bench_main_job_step import AVX2_ENV, child_env

CONFIG = ROOT / "configs" / "lineup-cpu.yaml"


def child(out: Path, mode: str, n_train: int, epochs: float, seed: int) -> None:
    """One warm start, as ``captionrl train lineup`` runs it; writes ``summary.json`` and ``weights.pt``.
    ``mode``: today, plain (no bottom cache) or before (no cache, and TRL's fused head on every position)."""
    import contextlib

    import torch

    import captionrl.train.compact_head as compact_head
    from captionrl.config import load_config
    from captionrl.domains.lineup_data import build_lineup_data
    from captionrl.train.common import load_policy
    from captionrl.train.lineup import LineupConfig
    from captionrl.train.warm_start import warm_start

    torch.set_num_threads(1)
    if mode == "before":  # the skeleton imports compact_on_cpu when it trains: this name is the one it finds
        compact_head.compact_on_cpu = contextlib.nullcontext
    reuse = mode == "today"
    cfg = load_config(LineupConfig, CONFIG, [f"seed={seed}", f"data.n_train={n_train}", f"warm_start.epochs={epochs}",
                                             f"warm_start.reuse_frozen={str(reuse).lower()}", f"train.out_dir={out}"])
    rows = build_lineup_data(cfg.data, cfg.reward.k, cfg.seed).rows["train"]
    model, processing, _ = load_policy(cfg.policy)
    torch.manual_seed(seed)
    summary = warm_start(cfg, rows, model, processing, out)
    torch.save({k: v for k, v in model.state_dict().items()}, out / "weights.pt")
    (out / "summary.json").write_text(json.dumps(summary))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="folder for both runs (default: a temporary one)")
    ap.add_argument("--n_train", type=int, default=128, help="training windows (the CPU config's 128)")
    ap.add_argument("--epochs", type=float, default=4, help="warm-start epochs (the CPU config's 4)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--avx2", action="store_true", help="hold torch, oneDNN and MKL to AVX2 kernels")
    ap.add_argument("--baseline", choices=["plain", "before"], default="before",
                    help="plain: no bottom cache; before: no cache and the fused head on every position (default)")
    ap.add_argument("--child", choices=["today", "plain", "before"], help=argparse.SUPPRESS)
    add_record_flag(ap)
    args = ap.parse_args()
    if args.child:
        child(Path(args.out), args.child, args.n_train, args.epochs, args.seed)
        return 0

    say = Printed(__file__)
    say(cpu_line() + (" | kernels held to AVX2" if args.avx2 else ""))
    with tempfile.TemporaryDirectory(prefix="bench-ws-cache-") as tmp:
        out = Path(args.out) if args.out else Path(tmp)
        env = child_env(AVX2_ENV if args.avx2 else {}, threads=1)
        procs = {}
        names = ("today", args.baseline)
        for name in names:
            folder = out / name
            folder.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, __file__, "--child", name, "--out", str(folder), "--n_train", str(args.n_train),
                   "--epochs", str(args.epochs), "--seed", str(args.seed)]
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
        diff = max(float((weights["today"][k] - v).abs().max()) for k, v in weights[args.baseline].items())
        say(f"warm start of {args.n_train} windows x {args.epochs:g} epochs, seed {args.seed}, two runs side by side, "
            f"one torch thread each")
        say("| run | train_runtime | steps | s/step | wall (with loading) |")
        say("|---|---|---|---|---|")
        for n in procs:
            s = summary[n]
            say(f"| {n} | {s['seconds']:.0f} s | {s['steps']} | {s['seconds'] / s['steps']:.2f} | {walls[n]:.0f} s |")
        ratio = summary["today"]["seconds"] / summary[args.baseline]["seconds"]
        say(f"today/{args.baseline} train_runtime: {ratio:.2f}x; cache: {summary['today']['frozen_bottom_cache']}")
        said = {n: summary[n].get("train_loss") for n in names}
        say(f"training loss: {said}")
        say(f"largest weight difference between the two trained models: {diff:.2e}")
        say.record(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
