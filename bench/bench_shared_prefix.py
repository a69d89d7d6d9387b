"""The loss pass's forward+backward, TRL's own against the shared-prompt one, on the same batch, side by side.

Two workloads, both with real prompts of the embedded LineupRL data and the embedded model in float32:

- ``main``: the main job's step (``configs/lineup-cpu.yaml``: its window, instruction, G and batch);
- ``long``: a ``--long_window``-value series per prompt (512 by default: the long-prompt case of issue 21),
  G=4. TRL's pass runs row by row there, one forward+backward per row with the gradients accumulated, as
  ``per_device_train_batch_size: 1`` with gradient accumulation would (its four rows at once need far more
  memory); the shared pass takes the group at once. Memory: on CPU the attention weights of every layer are
  kept for the backward, so one ~3,600-token row of the 512-value case took more than 15 GB and was killed
  on a 24 GB machine beside two training runs (2026-12-02); ``--long_window 256`` (~1,800 tokens) needs
  about a quarter of that.

Completions are the describer's captions, varied per row, right-padded as TRL pads them. Each path runs
``--repeats`` times, interleaved, and the best time of each is compared (the machine is shared: the
minimum is the least disturbed). It also prints the largest per-token log-prob difference between the
two paths (they are equal up to float rounding). The output is appended to ``bench/RESULTS.md``.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_shared_prefix.py
"""

from __future__ import annotations

import argparse
import sys
import time
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import ROOT, cpu_line, record_result


def batch(tok, window: int, groups: int, g: int, instruction: str | None, max_completion: int):
    """``groups`` real LineupRL prompts (chat template, left-padded) x ``g`` describer captions each."""
    from captionrl.domains.captioning import caption_messages
    from captionrl.domains.corpora import load_corpus
    from captionrl.domains.describe import describe_series
    from captionrl.domains.timeseries import render_numbers

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
    P, C = max(map(len, prompts)), max(map(len, comps))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    rows, masks = [], []
    for r, c in enumerate(comps):
        p = prompts[r // g]
        rows.append([pad] * (P - len(p)) + p + c + [pad] * (C - len(c)))
        masks.append([0] * (P - len(p)) + [1] * (len(p) + len(c)) + [0] * (C - len(c)))
    return torch.tensor(rows), torch.tensor(masks), C


TARGETS = "targets: main >= 2x, long >= 3x"


def main() -> None:
    import yaml
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import RLOOTrainer
    from trl.trainer.utils import add_fused_lm_head

    from captionrl.embedded import embedded_model_dir
    from captionrl.train.shared_prefix import shared_prefix_logps

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "lineup-cpu.yaml"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workloads", nargs="+", default=["main", "long"])
    ap.add_argument("--long_window", type=int, default=512, help="values of the long workload's series")
    ap.add_argument("--no_record", action="store_true", help="print only; do not append to bench/RESULTS.md")
    args = ap.parse_args()

    cfg = yaml.safe_load(Path(args.config).read_text())
    folder = embedded_model_dir()
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.train()
    add_fused_lm_head(model, temperature=float(cfg["train"].get("temperature", 1.0)), outputs=("log_probs", "entropy"))
    owner = types.SimpleNamespace(accelerator=Accelerator(cpu=True))
    g = int(cfg["train"]["num_generations"])
    per_step = int(cfg["train"]["per_device_train_batch_size"])
    workloads = {
        "main": dict(window=int(cfg["data"]["window"]), groups=per_step // g, g=g,
                     instruction=cfg["data"].get("instruction"), max_completion=int(cfg["train"]["max_completion_length"])),
        "long": dict(window=args.long_window, groups=1, g=4, instruction=cfg["data"].get("instruction"), max_completion=48),
    }
    row_by_row = {"long"}  # TRL's pass one row at a time there (see the module doc)

    def trl_pass(ids, mask, keep):
        return RLOOTrainer._get_per_token_logps_and_entropies(owner, model, ids, mask, keep, compute_entropy=True)[0]

    def shared_pass(ids, mask, keep):
        return shared_prefix_logps(model, ids, mask, keep, compute_entropy=True)[0]

    def fwd_bwd(fn, ids, mask, keep, rows_at_once=None):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        step = rows_at_once or ids.size(0)
        out = []
        for start in range(0, ids.size(0), step):
            sl = slice(start, start + step)
            lp = fn(ids[sl], mask[sl], keep)
            (lp * mask[sl, -keep:]).sum().backward()
            out.append(lp.detach())
        return time.perf_counter() - t0, torch.cat(out)

    lines = [cpu_line(), f"torch threads {torch.get_num_threads()}, float32, embedded SmolLM2-135M-Instruct, "
             f"best of {args.repeats} interleaved runs, forward + backward of the loss pass",
             f"{'workload':<8} {'rows':>4} {'prompt tok':>10} {'compl tok':>9} {'TRL s':>7} {'shared s':>8} "
             f"{'ratio':>6} {'max|dlogp|':>10}"]
    print("\n".join(lines), flush=True)
    header = list(lines)
    for name in args.workloads:
        ids, mask, keep = batch(tok, **workloads[name])
        times: dict[str, list[float]] = {"trl": [], "shared": []}
        out = {}
        for _ in range(args.repeats):
            for path, fn in (("trl", trl_pass), ("shared", shared_pass)):
                rows_at_once = 1 if path == "trl" and name in row_by_row else None
                dt, out[path] = fwd_bwd(fn, ids, mask, keep, rows_at_once)
                times[path].append(dt)
        cm = mask[:, -keep:].bool()
        diff = float((out["trl"] - out["shared"])[cm].abs().max())
        t_trl, t_sh = min(times["trl"]), min(times["shared"])
        line = (f"{name:<8} {ids.size(0):>4} {ids.size(1) - keep:>10} {keep:>9} {t_trl:>7.2f} {t_sh:>8.2f} "
                f"{t_trl / t_sh:>5.2f}x {diff:>10.1e}" + ("  (TRL's pass row by row)" if name in row_by_row else ""))
        print(line, flush=True)
        lines.append(line)
        if not args.no_record:  # each workload as it ends: a later one killed for memory loses nothing before it
            record_result("bench_shared_prefix.py", f"{' '.join(sys.argv[1:])} (workload {name})",
                          "\n".join([*header, line, TARGETS]))
    print(TARGETS)


if __name__ == "__main__":
    main()
