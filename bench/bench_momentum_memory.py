"""Memory added by the momentum model: LoRA-adapter momentum vs full-copy momentum.

The Policy is the embedded SmolLM2-135M-Instruct with LoRA adapters (PEFT). Each implementation is
measured in its own fresh process (so one's freed memory cannot hide the other's): resident set size
before and after building the momentum, and the exact bytes of the extra parameter tensors. Ratios are
to the Policy's memory (its parameter bytes, base + adapter). Acceptance target: the adapter momentum
adds < 10% of the Policy's memory.

    OMP_NUM_THREADS=1 python bench/bench_momentum_memory.py [--lora-r 16] [--variant joint] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import Printed, add_record_flag, cpu_line

MB = 1024 * 1024


def rss() -> int:
    import psutil

    gc.collect()
    return int(psutil.Process(os.getpid()).memory_info().rss)


def measure(impl: str, lora_r: int, targets: str, variant: str) -> dict[str, float]:
    """Run in a child process: load the LoRA Policy, build one momentum, report memory."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from captionrl.embedded import embedded_model_dir
    from captionrl.momentum import FullCopyMomentum, LoraAdapterMomentum, MomentumSettings

    r0 = rss()
    base = AutoModelForCausalLM.from_pretrained(embedded_model_dir(), dtype=torch.float32)
    target = "all-linear" if targets == "all-linear" else targets.split(",")
    policy = get_peft_model(base, LoraConfig(r=lora_r, lora_alpha=2 * lora_r, target_modules=target, task_type="CAUSAL_LM"))
    for p in policy.parameters():  # touch every page, as training would
        p.data.add_(0)
    r1 = rss()
    policy_bytes = sum(p.numel() * p.element_size() for p in policy.parameters())
    adapter_bytes = sum(p.numel() * p.element_size() for p in policy.parameters() if p.requires_grad)
    settings = MomentumSettings(m=0.99, interval=1, variant=variant)
    t0 = time.perf_counter()
    mom = LoraAdapterMomentum(policy, settings) if impl == "lora_adapter" else FullCopyMomentum(policy, settings)
    build_s = time.perf_counter() - t0
    r2 = rss()
    t0 = time.perf_counter()
    mom.update()
    update_s = time.perf_counter() - t0
    extra_bytes = sum(phi.numel() * phi.element_size() for slot in settings.slots for _n, _t, phi in mom._pairs(slot))
    return {
        "impl": impl, "variant": variant, "lora_r": lora_r,
        "policy_param_mb": policy_bytes / MB, "policy_adapter_mb": adapter_bytes / MB,
        "policy_rss_mb": (r1 - r0) / MB,
        "momentum_rss_mb": (r2 - r1) / MB, "momentum_param_mb": extra_bytes / MB,
        "ratio_rss": (r2 - r1) / policy_bytes, "ratio_param": extra_bytes / policy_bytes,
        "build_s": build_s, "update_s": update_s, "distance_after_update": mom.distance(),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--targets", default="all-linear", help="'all-linear' or comma-separated module names")
    ap.add_argument("--variant", default="joint", help="momentum variant (one-sided variants hold two copies)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    add_record_flag(ap)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(measure(a.child, a.lora_r, a.targets, a.variant)))
        return 0
    say = Printed(__file__)
    say(cpu_line())
    results = {}
    for impl in ("lora_adapter", "full_copy"):
        cmd = [sys.executable, __file__, "--child", impl, "--lora-r", str(a.lora_r), "--targets", a.targets,
               "--variant", a.variant]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        results[impl] = json.loads(out.strip().splitlines()[-1])
    if a.json:
        say(json.dumps(results, indent=2))
        say.record(a)
        return 0
    pol = results["lora_adapter"]
    say(f"Policy: SmolLM2-135M + LoRA r={a.lora_r} ({a.targets}): {pol['policy_param_mb']:.1f} MB parameters "
        f"({pol['policy_adapter_mb']:.1f} MB adapter), {pol['policy_rss_mb']:.1f} MB RSS; variant={a.variant}")
    say(f"{'momentum':<14}{'+RSS MB':>10}{'+params MB':>12}{'RSS/policy':>12}{'params/policy':>15}{'build s':>9}{'update s':>10}")
    for impl, r in results.items():
        say(f"{impl:<14}{r['momentum_rss_mb']:>10.1f}{r['momentum_param_mb']:>12.1f}{r['ratio_rss']:>12.1%}"
            f"{r['ratio_param']:>15.1%}{r['build_s']:>9.2f}{r['update_s']:>10.3f}")
    full, lora = results["full_copy"], results["lora_adapter"]
    say(f"adapter / full copy: {lora['momentum_param_mb'] / full['momentum_param_mb']:.3f} (params), "
        f"{lora['momentum_rss_mb'] / max(full['momentum_rss_mb'], 1e-9):.3f} (RSS)")
    ok = lora["ratio_rss"] < 0.10 and lora["ratio_param"] < 0.10
    say(f"target adapter momentum < 10% of the Policy: {'met' if ok else 'NOT met'}")
    say.record(a)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
