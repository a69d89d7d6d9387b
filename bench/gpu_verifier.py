"""Letter-mode identification questions/s of a Qwen2.5-14B-shaped verifier in-process, with and without
prefix sharing, for one LineupRL step's worth of questions (32 prompts x 8 captions x K=4 rotations).

The weights are random (built from a config: no downloads); throughput depends on the shape, not on the
weights, and the two paths must still agree on every probability. The tokenizer is the embedded SmolLM2
one (its ids fit Qwen2.5's vocabulary). Runs in bf16 on a GPU (~30 GB of weights; < 10 minutes on one
H100/H200-class GPU); ``--tiny`` shrinks the model and the step so the same code runs on a CPU in a test.

    python bench/gpu_verifier.py --out gpu_verifier.json          # on a GPU machine
    python bench/gpu_verifier.py --tiny                           # anywhere, seconds

Prints a table and a line to paste into the README, and writes the numbers with date and device as JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import Printed, add_record_flag, cpu_line, groups

QWEN25_14B = {"vocab_size": 152064, "hidden_size": 5120, "intermediate_size": 13824, "num_hidden_layers": 48,
              "num_attention_heads": 40, "num_key_value_heads": 8, "max_position_embeddings": 32768,
              "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False}
"""Qwen2.5-14B-Instruct's config.json shape fields (the paper's verifier)."""
TINY = {**QWEN25_14B, "vocab_size": 49152, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2}


def build_model(shape: dict, device: str, dtype) -> object:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**shape)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM._from_config(config, dtype=dtype)
    return model.eval()


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="a 2-layer, 64-wide model and a 2x2xK=4 step (CPU test)")
    ap.add_argument("--prompts", type=int, default=32, help="series per step (the policy's prompts)")
    ap.add_argument("--g", type=int, default=8, help="captions per prompt")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--length", type=int, default=64, help="values per series")
    ap.add_argument("--batch_size", type=int, default=32)
    ap.add_argument("--device", default=None, help="default: cuda when available (required without --tiny)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    add_record_flag(ap)
    args = ap.parse_args(argv)
    say = Printed(__file__, argv)

    import torch

    from captionrl.backends.hf import HFBackend
    from captionrl.devices import dtype_name, resolve_dtype
    from captionrl.judges.identification import IdentificationJudge, IdentifyConfig

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.tiny:
        args.prompts, args.g, args.length = min(args.prompts, 2), min(args.g, 2), min(args.length, 8)
    elif not device.startswith("cuda"):
        raise SystemExit("a Qwen2.5-14B-shaped model needs a CUDA GPU (~30 GB in bf16); use --tiny on a CPU")
    dtype, reason = resolve_dtype("auto", device)
    shape = TINY if args.tiny else QWEN25_14B
    t0 = time.perf_counter()
    model = build_model(shape, device, dtype)
    build_s = time.perf_counter() - t0
    from transformers import AutoTokenizer

    from captionrl.backends.hf import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("embedded")[0])
    captions, candidates = groups(args.prompts, args.g, args.k, args.length)
    cfg = IdentifyConfig(mode="letter", k=args.k, signal="soft")
    n_questions = len(captions) * args.k
    dev_name = torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu"
    say(cpu_line())
    say(f"device {dev_name}, {dtype_name(dtype)} ({reason}); model {'tiny ' if args.tiny else ''}Qwen2.5-14B shape, "
        f"{sum(p.numel() for p in model.parameters()) / 1e9:.3f}B random parameters built in {build_s:.1f}s")
    say(f"{n_questions} letter questions: {args.prompts} prompts x {args.g} captions x K={args.k}, "
        f"series length {args.length}, batch {args.batch_size}")
    results: dict[str, dict] = {}
    scores: dict[str, list] = {}
    for name, share in (("shared prefix", True), ("no sharing", False)):
        backend = HFBackend.from_model(model, tokenizer, name="hf:qwen2.5-14b-shape", share_prefix=share,
                                       batch_size=args.batch_size)
        judge = IdentificationJudge(backend, cfg)
        judge.judge(captions[:1], {"candidates": candidates[:1]})  # warm-up (kernels, allocator)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = judge.judge(captions, {"candidates": candidates})
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        secs = time.perf_counter() - t0
        scores[name] = [j.score for j in out]
        results[name] = {"seconds": round(secs, 3), "questions_per_s": round(n_questions / secs, 2),
                         "unscored": sum(j.score is None for j in out)}
    diffs = [abs(a - b) for a, b in zip(scores["shared prefix"], scores["no sharing"], strict=True)
             if a is not None and b is not None]
    speedup = results["no sharing"]["seconds"] / results["shared prefix"]["seconds"]
    say(f"{'path':<15} {'seconds':>8} {'questions/s':>12}")
    for name, r in results.items():
        say(f"{name:<15} {r['seconds']:>8.2f} {r['questions_per_s']:>12.2f}")
    say(f"prefix sharing speed-up: {speedup:.2f}x; max |soft score difference| {max(diffs, default=0.0):.2e}")
    summary = {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"), "device": dev_name,
               "torch": torch.__version__, "dtype": dtype_name(dtype), "tiny": args.tiny,
               "shape": {k: shape[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                "num_key_value_heads", "intermediate_size", "vocab_size")},
               "questions": n_questions, "prompts": args.prompts, "g": args.g, "k": args.k,
               "length": args.length, "results": results, "speedup": round(speedup, 3),
               "max_abs_diff": max(diffs, default=0.0)}
    say(f"README: | {summary['date']} | {dev_name} | {dtype_name(dtype)} | {n_questions} questions | "
        f"shared {results['shared prefix']['questions_per_s']} q/s | plain {results['no sharing']['questions_per_s']} q/s "
        f"| {speedup:.2f}x |")
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    say.record(args)
    return summary


if __name__ == "__main__":
    main()
