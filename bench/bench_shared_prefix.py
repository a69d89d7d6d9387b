"""The loss pass's forward+backward, TRL's own against the shared-prompt one, on the same batch, side by side.

Two workloads, both with real prompts of the embedded LineupRL data and the embedded model in float32:

- ``main``: the main job's step (``configs/lineup-cpu.yaml``: its window, instruction, G and batch);
- ``long``: a ``--long_window``-value series per prompt (512 by default: a paper-length series),
  G=4. TRL's pass runs row by row there, one forward+backward per row with the gradients accumulated, as
  ``per_device_train_batch_size: 1`` with gradient accumulation would (its four rows at once need far more
  memory); the shared pass takes the group at once. Memory: on CPU the attention weights of every layer are
  kept for the backward, so one ~3,600-token row of the 512-value case takes more than 15 GB and does not fit
  a 24 GB machine beside other jobs; ``--long_window 256`` (~1,800 tokens) needs about a quarter of that.

``--checkpointing off on`` runs each workload without and with gradient checkpointing (non-reentrant, as
every paper preset trains: the layers run again in the backward pass, the shared prompt cache kept through
it). ``--zero 2`` or ``--zero 3`` runs the same comparison on 2 CPU processes under DeepSpeed ZeRO (the bench
launches itself with ``accelerate launch --config_file configs/accelerate/cpu-zero<N>.yaml``, gloo
collectives): each rank takes half of the workload's groups, every time is the slower rank's, and rank 0
prints and records.

Completions are the describer's captions, varied per row, right-padded as TRL pads them. Each path runs
``--repeats`` times, interleaved, and the best time of each is compared (the machine is shared: the
minimum is the least disturbed). It also prints the largest per-token log-prob difference between the
two paths (they are equal up to float rounding). ``--record FILE`` also appends the output to FILE.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_shared_prefix.py
    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_shared_prefix.py --workloads main --checkpointing off on
    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_shared_prefix.py --workloads main --checkpointing on --zero 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import ROOT, add_record_flag, cpu_line, record_result


def batch(tok, window: int, groups: int, g: int, instruction: str | None, max_completion: int):
    """``groups`` real LineupRL prompts (chat template, left-padded) x ``g`` describer captions each."""
    from captionrl.domains.captioning import caption_messages
    from captionrl.domains.corpora import load_corpus
    from captionrl.domains.describe import describe_series
    from captionrl.domains.timeseries import render_numbers
    from captionrl.testing.trl_layout import trl_rows

    series = max(load_corpus("embedded"), key=lambda s: len(s.values))  # the longest embedded corpus
    starts = range(0, len(series.values) - window, max(1, (len(series.values) - window) // groups))
    windows = [types.SimpleNamespace(values=series.values[s: s + window], id=f"w{s}") for s in list(starts)[:groups]]
    prompts, comps = [], []
    for w in windows:
        msgs = caption_messages(render_numbers(w.values)[0], len(w.values), instruction=instruction)
        prompts.append(list(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]))
        base = describe_series(w.values)
        for j in range(g):
            ids = tok(" ".join(base.split()[: 8 + 5 * j]), add_special_tokens=False)["input_ids"][: max_completion - 1]
            comps.append([*ids, tok.eos_token_id])
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return trl_rows(prompts, comps, g, pad)


TARGETS = "targets: main >= 2x, long >= 3x"


def load_average() -> str:
    """The machine's 1-minute load average (other jobs share the cores: the figures hold only beside it)."""
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "unknown"


def launch_ranks(stage: int) -> None:
    """Run this bench again on 2 CPU processes under DeepSpeed ZeRO-``stage`` (the same arguments, less
    ``--zero``); rank 0 prints and records."""
    from captionrl.embedded import embedded_model_dir

    embedded_model_dir()  # converted once here: two ranks converting it at once would race
    argv = [a for i, a in enumerate(sys.argv[1:]) if a != "--zero" and sys.argv[i] != "--zero"]
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    cmd = [accelerate, "launch", "--config_file", str(ROOT / "configs" / "accelerate" / f"cpu-zero{stage}.yaml"),
           "--main_process_port", str(29500 + os.getpid() % 1000), str(Path(__file__).resolve()), *argv,
           "--rank_of", str(stage)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    raise SystemExit(subprocess.run(cmd, env=env).returncode)


class Ranks:
    """One process, or one of the 2 ZeRO ranks: wraps the model, runs backward, and agrees on times."""

    def __init__(self, stage: int | None) -> None:
        from accelerate import Accelerator
        from accelerate.utils import GradientAccumulationPlugin

        self.stage = stage
        if stage is not None:  # the Trainer's CPU set-up: gloo over the launched ranks; DeepSpeed wraps the model
            os.environ.pop("ACCELERATE_USE_DEEPSPEED", None)
        self.accelerator = Accelerator(cpu=True, gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=1))
        self.rank, self.size = self.accelerator.process_index, self.accelerator.num_processes
        self.engine: Any = None

    def wrap(self, model: Any, rows: int) -> Any:
        if self.stage is None:
            self.engine = model
            return model
        import deepspeed

        hidden = model.config.get_text_config().hidden_size   # transformers' "auto" ZeRO-3 thresholds
        config = {"train_micro_batch_size_per_gpu": rows, "gradient_accumulation_steps": 1, "steps_per_print": 10**9,
                  "zero_optimization": {"stage": self.stage, "stage3_param_persistence_threshold": 10 * hidden,
                                        "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden)},
                  "zero_allow_untested_optimizer": True}
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        return self.engine

    def backward(self, loss: Any) -> None:
        if self.stage is None:
            loss.backward()
        else:
            self.engine.backward(loss)

    def clear(self) -> None:
        if self.stage is None:
            self.engine.zero_grad(set_to_none=True)
        else:
            self.engine.step()   # learning rate 0: the weights stay; the step clears the gradients

    def slowest(self, value: float) -> float:
        """The largest ``value`` over the ranks (a step ends when its slowest rank does)."""
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return float(t)


def main() -> None:
    import yaml
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import RLOOTrainer
    from trl.trainer.utils import add_fused_lm_head

    from captionrl.embedded import embedded_model_dir
    from captionrl.train.run.shared_prefix import shared_prefix_logps

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "lineup-cpu.yaml"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workloads", nargs="+", default=["main", "long"])
    ap.add_argument("--long_window", type=int, default=512, help="values of the long workload's series")
    ap.add_argument("--checkpointing", nargs="+", choices=["off", "on"], default=["off"],
                    help="gradient checkpointing (non-reentrant) off, on, or both in turn")
    ap.add_argument("--zero", type=int, choices=[2, 3], help="2 CPU processes under DeepSpeed ZeRO-2 or ZeRO-3")
    ap.add_argument("--rank_of", type=int, help=argparse.SUPPRESS)   # set by the launch of --zero
    add_record_flag(ap)
    args = ap.parse_args()
    if args.zero is not None:
        launch_ranks(args.zero)

    ranks = Ranks(args.rank_of)
    cfg = yaml.safe_load(Path(args.config).read_text())
    folder = embedded_model_dir()  # under --zero the launcher converted it first
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.train()
    add_fused_lm_head(model, temperature=float(cfg["train"].get("temperature", 1.0)), outputs=("log_probs", "entropy"))
    owner = types.SimpleNamespace(accelerator=ranks.accelerator)
    g = int(cfg["train"]["num_generations"])
    per_step = int(cfg["train"]["per_device_train_batch_size"])
    workloads = {
        "main": dict(window=int(cfg["data"]["window"]), groups=per_step // g, g=g,
                     instruction=cfg["data"].get("instruction"), max_completion=int(cfg["train"]["max_completion_length"])),
        "long": dict(window=args.long_window, groups=1, g=4, instruction=cfg["data"].get("instruction"), max_completion=48),
    }
    row_by_row = {"long"}  # TRL's pass one row at a time there (see the module doc)
    engine = ranks.wrap(model, per_step // ranks.size)

    def trl_pass(ids, mask, keep):
        return RLOOTrainer._get_per_token_logps_and_entropies(owner, engine, ids, mask, keep, compute_entropy=True)[0]

    def shared_pass(ids, mask, keep):
        return shared_prefix_logps(engine, ids, mask, keep, compute_entropy=True)[0]

    def fwd_bwd(fn, ids, mask, keep, rows_at_once=None):
        t0 = time.perf_counter()
        step = rows_at_once or ids.size(0)
        out = []
        for start in range(0, ids.size(0), step):
            sl = slice(start, start + step)
            lp = fn(ids[sl], mask[sl], keep)
            ranks.backward((lp * mask[sl, -keep:]).sum())
            out.append(lp.detach())
        dt = time.perf_counter() - t0
        ranks.clear()
        return ranks.slowest(dt), torch.cat(out)

    where = (f"2 processes, DeepSpeed ZeRO-{ranks.stage} (gloo), each rank half the groups, the slower rank's time"
             if ranks.stage is not None else "one process")
    lines = [cpu_line(), f"torch threads {torch.get_num_threads()}, float32, embedded SmolLM2-135M-Instruct, "
             f"best of {args.repeats} interleaved runs, forward + backward of the loss pass, {where}",
             f"{'workload':<8} {'ckpt':>4} {'rows':>4} {'prompt tok':>10} {'compl tok':>9} {'TRL s':>7} "
             f"{'shared s':>8} {'ratio':>6} {'max|dlogp|':>10}"]
    if ranks.rank == 0:
        print("\n".join(lines), flush=True)
    header = list(lines)
    load_at_start = load_average()
    for name in args.workloads:
        if workloads[name]["groups"] < ranks.size:
            if ranks.rank == 0:
                print(f"{name:<8} skipped: one group, and each of the {ranks.size} ranks needs one", flush=True)
            continue
        ids, mask, keep = batch(tok, **workloads[name])
        if ranks.size > 1:   # each rank its share of the groups (a group stays on one rank, as TRL's sampler keeps it)
            per_group = workloads[name]["g"]
            rows = [r for r in range(ids.size(0)) if (r // per_group) % ranks.size == ranks.rank]
            ids, mask = ids[rows], mask[rows]
        for checkpointing in args.checkpointing:
            if checkpointing == "on":
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_disable()
            times: dict[str, list[float]] = {"trl": [], "shared": []}
            out = {}
            for _ in range(args.repeats):
                for path, fn in (("trl", trl_pass), ("shared", shared_pass)):
                    rows_at_once = 1 if path == "trl" and name in row_by_row else None
                    dt, out[path] = fwd_bwd(fn, ids, mask, keep, rows_at_once)
                    times[path].append(dt)
            cm = mask[:, -keep:].bool()
            diff = ranks.slowest(float((out["trl"] - out["shared"])[cm].abs().max()))
            t_trl, t_sh = min(times["trl"]), min(times["shared"])
            line = (f"{name:<8} {checkpointing:>4} {ids.size(0) * ranks.size:>4} {ids.size(1) - keep:>10} {keep:>9} "
                    f"{t_trl:>7.2f} {t_sh:>8.2f} {t_trl / t_sh:>5.2f}x {diff:>10.1e}"
                    + ("  (TRL's pass row by row)" if name in row_by_row else ""))
            if ranks.rank != 0:
                continue
            load = (f"load average (1 min) of the machine: {load_at_start} at the bench's start, {load_average()} "
                    f"now, on {os.cpu_count()} cores")
            print(line, load, sep="\n", flush=True)
            lines.append(line)
            if args.record:  # each workload as it ends: a later one killed for memory loses nothing before it
                argv = sys.argv[1:]
                if args.rank_of is not None:   # the launched rank: name the command the user ran
                    at = argv.index("--rank_of")
                    argv = [*argv[:at], *argv[at + 2:], "--zero", str(args.rank_of)]
                flags = " ".join(argv)
                record_result("bench_shared_prefix.py", f"{flags} (workload {name}, checkpointing {checkpointing})",
                              "\n".join([*header, line, load, TARGETS]), path=args.record)
    if ranks.rank == 0:
        print(TARGETS)


if __name__ == "__main__":
    main()
