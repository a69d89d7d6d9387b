"""One rank of the two-process shared-prompt check (``test_shared_prefix_ranks.py`` launches two with
``accelerate launch`` and one of ``configs/accelerate/cpu-zero{2,3}.yaml`` or ``cpu-2proc.yaml``).

For each policy (the tiny random Llama, a tiny random Qwen2.5-VL with an image per row), with gradient
checkpointing on (non-reentrant, transformers' default), wrapped as the trainer wraps it (a DeepSpeed engine of
the launch's ZeRO stage, or DDP): TRL's own loss pass, then the shared-prompt pass, on this rank's batch (two
groups, prompts of two lengths left-padded, completions right-padded, different on each rank). After each
backward every parameter's full gradient (``deepspeed.utils.safe_get_full_grad``: reduced over both ranks and,
under ZeRO-3, gathered from the shards) is read; an optimizer step at learning rate 0 then clears it. The
rank writes ``rank<k>.json``: the largest per-token log-prob and entropy differences, the largest relative
gradient difference and the parameter with it, how many prompt passes the shared pass ran, and how many
parameters were sharded (ZeRO-3 holds an empty local shard)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prefix_batches import COMPLETIONS, PROMPTS, text_batch, trl_pass, vlm_batch


def build(name: str, rank: int) -> tuple[Any, Any, Any, int, dict[str, Any]]:
    """The policy (fused LM head added as RLOOTrainer adds it, checkpointing on) and this rank's batch."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer
    from trl.trainer.utils import add_fused_lm_head

    torch.manual_seed(0)
    order = COMPLETIONS if rank == 0 else COMPLETIONS[::-1]   # each rank its own rows: the all-reduce sums two
    if name == "text":
        from captionrl.testing.tiny_llama import tiny_llama_dir

        folder = tiny_llama_dir()
        tok = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        ids, mask, keep = text_batch(tok, PROMPTS, order[:6], group=3)
        multimodal: dict[str, Any] = {}
    else:
        from captionrl.backends.hf import resolve_model_path

        folder = resolve_model_path(f"tiny-{name}")[0]
        proc = AutoProcessor.from_pretrained(folder)
        proc.tokenizer.padding_side = "left"                  # TRL pads prompts on the left
        model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
        prompts = ["Describe this chart.", "Describe this chart in detail, please."]
        colours = [(250, 10, 10), (10, 200, 10)] if rank == 0 else [(10, 10, 250), (200, 200, 10)]
        group_of = [0, 0, 0, 1, 1, 1]
        ids, mask, keep, multimodal = vlm_batch(proc, [prompts[g] for g in group_of], [colours[g] for g in group_of],
                                                order[:6])
    model.train()
    add_fused_lm_head(model, temperature=0.9, outputs=("log_probs", "entropy"))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model, ids, mask, keep, multimodal


def wrap(model: Any, stage: int | None, rows: int, vlm: bool) -> tuple[Any, Any]:
    """The engine the trainer trains: a DeepSpeed engine at the launch's ZeRO stage, else DDP, looking for
    unused parameters for a vision-language policy as TRL's trainers set it (``ddp_find_unused_parameters``)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    if stage is None:
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, find_unused_parameters=vlm), optimizer
    import deepspeed

    # ZeRO-3 keeps a tensor whole on every rank below its persistence threshold (DeepSpeed's default, 100k
    # elements, is every weight of these tiny models); transformers' "auto", 10 x hidden size, shards their
    # weight matrices and keeps the norms and biases whole, as the default does for a real 3B-7B policy
    hidden = model.config.get_text_config().hidden_size
    config = {"train_micro_batch_size_per_gpu": rows, "gradient_accumulation_steps": 1, "steps_per_print": 10**9,
              "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 10 * hidden},
              "zero_allow_untested_optimizer": True}
    engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine, optimizer


def full_grads(engine: Any) -> dict[str, torch.Tensor]:
    """Every parameter's gradient over both ranks (a collective under ZeRO: every rank calls it in order)."""
    if hasattr(engine, "zero_optimization_stage"):
        from deepspeed.utils import safe_get_full_grad

        out = {}
        for name, p in engine.module.named_parameters():
            g = safe_get_full_grad(p)
            if g is not None:
                out[name] = g.detach().float().clone()
        return out
    return {n: p.grad.detach().clone() for n, p in engine.module.named_parameters() if p.grad is not None}


def step(engine: Any, optimizer: Any, loss: Any) -> dict[str, torch.Tensor]:
    """Backward, the full gradients, then a step at learning rate 0 (weights unchanged) that clears them."""
    if hasattr(engine, "zero_optimization_stage"):
        engine.backward(loss)
        grads = full_grads(engine)
        engine.step()
    else:
        loss.backward()
        grads = full_grads(engine)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return grads


def compare(name: str, accelerator: Any, stage: int | None) -> dict[str, Any]:
    from captionrl.train.run.shared_prefix import shared_prefix_logps, shared_prefix_logps_qwen_vl

    model, ids, mask, keep, mm = build(name, accelerator.process_index)
    engine, optimizer = wrap(model, stage, ids.size(0), vlm=name != "text")
    cmask = mask[:, -keep:].float()
    ref_lp, ref_ent, _ = trl_pass(engine, ids, mask, keep, accelerator, **mm)
    ref_grads = step(engine, optimizer, (ref_lp * cmask).sum())
    shared = shared_prefix_logps if name == "text" else shared_prefix_logps_qwen_vl
    with accelerator.autocast():
        lp, ent, prompts = shared(engine, ids, mask, keep, True, **mm)
    grads = step(engine, optimizer, (lp * cmask).sum())
    worst, worst_name = 0.0, ""
    for n, g in ref_grads.items():
        rel = float((grads[n] - g).abs().max() / g.abs().max().clamp(min=1e-6)) if n in grads else float("inf")
        if rel > worst:
            worst, worst_name = rel, n
    sharded = sum(1 for p in engine.module.parameters() if p.numel() == 0 and getattr(p, "ds_numel", 0) > 0)
    return {"max_dlogp": float(((lp - ref_lp) * cmask).abs().max()), "max_dentropy": float(((ent - ref_ent) * cmask).abs().max()),
            "max_rel_grad": worst, "worst_param": worst_name, "params": len(ref_grads), "same_params": set(grads) == set(ref_grads),
            "prompt_passes": prompts, "rows": int(ids.size(0)), "sharded_params": sharded,
            "checkpointing": any(getattr(m, "gradient_checkpointing", False) for m in engine.module.modules()),
            "engine": type(engine).__name__}


def main() -> None:
    from accelerate import Accelerator
    from accelerate.utils import GradientAccumulationPlugin

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", nargs="+", default=["text", "qwen2.5-vl"])
    args = ap.parse_args()
    # as the Trainer does on CPU (TrainingArguments.use_cpu): a gloo process group over the launched ranks, and
    # the ZeRO stage of the launch config for deepspeed.initialize (its "auto" fields are the Trainer's to fill)
    stage = None
    if os.environ.pop("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        stage = int(os.environ["ACCELERATE_DEEPSPEED_ZERO_STAGE"])
    accelerator = Accelerator(cpu=True, gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=1))
    result: dict[str, Any] = {"rank": accelerator.process_index, "processes": accelerator.num_processes,
                              "zero_stage": stage}
    for name in args.models:
        result[name] = compare(name, accelerator, stage)
    Path(args.out, f"rank{accelerator.process_index}.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
