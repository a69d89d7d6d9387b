"""The end of a LineupRL run: checkpoint selection on the validation items, then the held-out evaluation.

``select_checkpoint`` (the paper's Table 4 rule: the checkpoint whose greedy captions earn the highest
training reward on the validation items) and ``evaluate``: the trained (and the initial) captioner caption
the test items greedily; identification under verifiers that took no part in training (the training
verifier in its own column, never in the mean) and the final checks (``eval.final_checks``) judge them, with
the verdict taken against the model RL started from (the warm start, where there is one) and the initial
model as a second reference.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from captionrl.backends import BackendConfig
from captionrl.domains.lineup_data import LineupData, add_charts
from captionrl.eval.final_checks import TRAIN_VERIFIER, WARM_START, verdict_references
from captionrl.rewards.reward import Reward
from captionrl.train.lineup_config import LineupConfig, eval_verifier

logger = logging.getLogger(__name__)

def load_checkpoint_policy(cfg: LineupConfig, ckpt: Path) -> Any:
    """A checkpoint's policy for inference: full weights, or the base model plus the saved LoRA adapters."""
    from captionrl.train.run.loading import load_policy
    from captionrl.train.run.sharding import to_inference_device

    if (ckpt / "adapter_config.json").exists():
        from peft import PeftModel

        base, _, _ = load_policy(cfg.policy)
        model = PeftModel.from_pretrained(base, str(ckpt)).merge_and_unload()
    else:
        model, _, _ = load_policy(dataclasses.replace(cfg.policy, model=str(ckpt)))
    model.eval()
    return to_inference_device(model)  # the training GPU, not rank 0's CPU


def select_checkpoint(cfg: LineupConfig, data: LineupData, processing: Any, reward: Reward, out: Path,
                      use_chart: bool) -> dict[str, Any]:
    """Paper, Table 4: pick the checkpoint whose greedy captions earn the highest training reward (the run's
    one ``Reward``, scored directly: no training sample records) on the validation items (no test metric is
    used). Records are resumable, keyed by (checkpoint, item)."""
    from tqdm.auto import tqdm

    from captionrl.records import RecordWriter, write_json

    rows = add_charts(data.rows["val"], cfg.data.instruction, cfg.data.chart_size) if use_chart else data.rows["val"]
    ckpts = sorted((p for p in (out / "checkpoints").glob("checkpoint-*") if (p / "trainer_state.json").exists()),
                   key=lambda p: int(p.name.split("-")[1]))
    sel = out / "selection"
    writer = RecordWriter(sel / "records.jsonl")
    scores: dict[str, float] = {}
    try:
        for ckpt in tqdm(ckpts, desc="select checkpoint", unit="ckpt"):
            todo = [r for r in rows if not writer.has(f"{ckpt.name}|{r['item_id']}")]
            if todo:
                model = load_checkpoint_policy(cfg, ckpt)
                caps = generate_captions(model, processing, todo, cfg.train.max_completion_length, use_chart, ckpt.name)
                del model
                cols = {k: [r[k] for r in todo] for k in ("item_id", "series", "series_text", "candidates", "questions")
                        if k in todo[0]}
                got = reward.score([caps[r["item_id"]] for r in todo], cols)
                for r, g in zip(todo, got, strict=True):
                    writer.write({"key": f"{ckpt.name}|{r['item_id']}", "checkpoint": ckpt.name,
                                  "item_id": r["item_id"], "caption": caps[r["item_id"]],
                                  "reward": g.score if g.scored else None})
            vals = [rec["reward"] for rec in writer.records() if rec["checkpoint"] == ckpt.name and rec["reward"] is not None]
            if vals:
                scores[ckpt.name] = float(np.mean(vals))
    finally:
        writer.close()
    best = max(scores, key=lambda k: scores[k]) if scores else None
    summary = {"protocol": "checkpoint-selection", "columns": ["system", "val_reward"],
               "rows": [{"system": k, "val_reward": round(v, 4)} for k, v in scores.items()],
               "config": {"n_val": len(rows), "criterion": "mean training reward of greedy captions"},
               "best": best}
    write_json(sel / "summary.json", summary)
    return {"checkpoint": str(out / "checkpoints" / best) if best else None, "scores": scores}


def generate_captions(model: Any, processing: Any, rows: Sequence[Mapping[str, Any]], max_new_tokens: int,
                      use_chart: bool, name: str, clipped: dict[str, bool] | None = None) -> dict[str, str]:
    """Greedy captions of ``rows`` by an in-memory policy (the same prompts it was trained on); ``clipped``
    (if given) receives, per item, whether the caption was cut by the token budget."""
    from captionrl.backends import ChatRequest
    from captionrl.backends.hf import HFBackend

    backend = HFBackend.from_model(model, processing, name=name, batch_size=8)
    reqs = []
    for r in rows:
        msgs = r["prompt"]
        if use_chart:
            text = msgs[0]["content"]
            msgs = [{"role": "user", "content": [{"type": "image", "image": r["image"]}, {"type": "text", "text": text}]}]
        reqs.append(ChatRequest(messages=msgs, max_new_tokens=max_new_tokens, temperature=0.0))
    gens = backend.generate(reqs)
    if clipped is not None:
        clipped.update({str(r["item_id"]): g.finish_reason == "length" for r, g in zip(rows, gens, strict=True)})
    return {str(r["item_id"]): (g.text or "") for r, g in zip(rows, gens, strict=True)}


def weights_digest(model: Any) -> str:
    """A digest of every weight of ``model`` (names, dtypes, shapes and bytes): two models with the same
    digest generate the same greedy captions from the same prompts."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().reshape(-1).contiguous().cpu()
        h.update(f"{name}|{flat.dtype}|{tuple(tensor.shape)}|".encode())
        h.update(flat.view(torch.uint8).numpy())
    return h.hexdigest()


def stored_captions(store: Path, model: Any, processing: Any, rows: Sequence[Mapping[str, Any]],
                    max_new_tokens: int, use_chart: bool, name: str,
                    clipped: dict[str, bool] | None = None,
                    on_done: Callable[[bool], None] | None = None) -> dict[str, str]:
    """``generate_captions``, kept in ``store`` (JSONL) by what made each caption: the model's weights
    (``weights_digest``), the prompt, the token budget and the input kind. A reference model (the warm start,
    the initial model) that already captioned these prompts in this run folder is not asked again: a rerun
    that finds its warm start done, or a run resumed during its final checks, reads its captions back.
    ``on_done(made)`` is called at the end: ``made`` is False when every caption was read back."""
    from captionrl.records import RecordWriter, digest

    made_by = weights_digest(model)

    def key(row: Mapping[str, Any]) -> str:
        return digest({"weights": made_by, "prompt": row["prompt"], "max_new_tokens": max_new_tokens,
                       "chart": use_chart})

    keys = {str(r["item_id"]): key(r) for r in rows}
    with RecordWriter(store) as writer:
        todo = [r for r in rows if not writer.has(keys[str(r["item_id"])])]
        if todo:
            cut: dict[str, bool] = {}
            fresh = generate_captions(model, processing, todo, max_new_tokens, use_chart, name, cut)
            writer.write_many({"key": keys[i], "system": name, "item_id": i, "caption": c, "clipped": cut.get(i)}
                              for i, c in fresh.items())
        elif rows:
            logger.info(f"final checks: the {name} captions of these {len(rows)} windows were made before by the "
                        f"same weights ({store}); read back")
        got = {i: writer.get(k) or {} for i, k in keys.items()}
    if clipped is not None:
        clipped.update({i: bool(rec.get("clipped")) for i, rec in got.items()})
    if on_done is not None:
        on_done(bool(todo))
    return {i: str(rec.get("caption", "")) for i, rec in got.items()}


def evaluate(cfg: LineupConfig, data: LineupData, policy: Any, processing: Any, verifier: Any,
             out_dir: Path, use_chart: bool, progress: Any = None) -> dict[str, Any]:
    """Held-out identification of the trained captioner (and the untrained one) via ``eval.identification``;
    ``progress`` (a ``train.run.progress.RunProgress``) advances once per system captioned (skips one whose captions
    are read back) and once for the checks."""
    from captionrl.eval.identification import CaptionSet, IdentifyEvalConfig, run_identification

    def advance(made: bool = True) -> None:  # a system's captions read back are skipped, not timed
        if progress is not None:
            progress.advance(1) if made else progress.skip(1)

    rows = data.rows["test"]
    if use_chart:
        rows = add_charts(rows, cfg.data.instruction, cfg.data.chart_size)
    max_new = cfg.train.max_completion_length
    clipped: dict[str, dict[str, bool]] = {"trained": {}, "initial": {}}
    systems = [CaptionSet("trained", generate_captions(policy, processing, rows, max_new, use_chart, "trained",
                                                       clipped["trained"]))]
    advance()
    warm = out_dir.parent / "warm_start" / "model"
    store = out_dir / "reference_captions.jsonl"  # the reference models' captions, read back by a rerun
    if cfg.warm_start.enabled and warm.is_dir():  # RL's start point: the verdict's reference
        model = load_checkpoint_policy(cfg, warm)
        clipped[WARM_START] = {}
        systems.append(CaptionSet(WARM_START, stored_captions(store, model, processing, rows, max_new, use_chart,
                                                              WARM_START, clipped[WARM_START], on_done=advance)))
        del model
    if cfg.eval.compare_initial:
        from captionrl.train.run.loading import load_policy
        from captionrl.train.run.sharding import to_inference_device

        base, base_proc, _ = load_policy(cfg.policy)
        base = to_inference_device(base).eval()
        systems.append(CaptionSet("initial", stored_captions(store, base, base_proc, rows, max_new, use_chart, "initial",
                                                             clipped["initial"], on_done=advance)))
        del base
    items = [data.pool[r["item_id"]] for r in rows]
    distractors = {r["item_id"]: list(r["candidate_ids"][1:]) for r in rows}
    train_name = TRAIN_VERIFIER if cfg.eval.train_verifier else None
    verifiers = {train_name: verifier} if train_name else {}
    from captionrl.backends import make_backend

    for name, value in cfg.eval.verifiers.items():
        v = eval_verifier(value, f"eval.verifiers.{name}")
        verifiers[name] = make_backend(v) if isinstance(v, BackendConfig) else v
    ecfg = IdentifyEvalConfig(modes=list(cfg.eval.modes or [cfg.reward.mode]), directions=list(cfg.eval.directions),
                              ks=[cfg.reward.k], seed=cfg.seed, precision=cfg.data.precision,
                              controls=cfg.eval.controls)
    # the training verifier keeps its own column and stays out of the held-out mean: a reward is not its own evaluation
    summary = run_identification(items, systems, distractors, data.pool, verifiers, ecfg, out_dir,
                                 train_verifier=train_name)
    captions = {s.name: s.captions for s in systems}
    result = {"table": str(out_dir / "table.md"), "summary": str(out_dir / "summary.json"),
              "rows": summary.rows, "captions": captions}
    if cfg.eval.final_checks:
        from captionrl.eval.final_checks import run_final_checks

        series = {it.id: it.values for it in items}
        shared = {"guard": cfg.reward.counting(), "tolerance": cfg.reward.factuality_tolerance,
                  "instruction": cfg.instruction(), "references": verdict_references(list(captions))}
        from captionrl.records import read_jsonl

        shared["identification_records"] = read_jsonl(out_dir / "records.jsonl", appended=True)
        checks = run_final_checks(captions, series, out_dir, identification=summary.summary(), clipped=clipped,
                                  bottleneck=cfg.eval.bottleneck, **shared)
        result["final_checks"] = str(out_dir / "final_checks.md")
        result["final_rows"] = checks["rows"]
        groups: dict[str, list[str]] = {}
        for it in items:
            groups.setdefault(str(it.meta.get("corpus") or it.domain), []).append(it.id)
        if cfg.data.test_corpora and len(groups) > 1:  # held-out corpora: each reported on its own
            from captionrl.eval.final_checks import run_final_checks_by_group

            errors = {name: checks_of["bottleneck_mse"] for name, checks_of in checks["per_item"].items()
                      if checks_of.get("bottleneck_mse")}
            run_final_checks_by_group(captions, series, groups, out_dir / "by_corpus", bottleneck_items=errors or None,
                                      **shared)
            result["by_corpus"] = str(out_dir / "by_corpus" / "by_corpus.md")
        if checks.get("verdict"):
            result["verdict"] = checks["verdict"]
            logger.info(checks["verdict"]["line"])
    advance()
    return result
