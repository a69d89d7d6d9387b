"""Reward preflight and end-of-run checks for the image recipes (RubiCap, MoCo Rubric).

- ``image_preflight``: the item's reference caption (for synthetic scenes: the exact-facts caption) must
  out-score every hacking probe under the run's own reward (``captionrl.preflight``): RubiCap's rubric
  reward (``rubicap_preflight``) and MoCo's online rubric of the momentum Generator-Judge
  (``moco_preflight``).
- ``image_final_checks``: greedy captions of the trained policy on a seeded sample of the training images,
  scored by checks that did not produce the reward: CIDEr-D against the references (the rubric or the
  online rubric produced the reward, not n-gram overlap), and the share of captions ending with a full
  stop, the clipped ratio and the length. Written as ``final_checks.md`` / ``final_checks.json``. A run
  whose reward was CIDEr-D itself (RubiCap's ``reward.family: cider`` baseline) passes further ``judges``
  (the rubric judge), whose mean score joins every row: the check that run did not train on.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

PREFLIGHT_KEYS = ("reward.family", "reward.rubric.mode", "reward.rubric.decision", "reward.rubric.threshold", "rubrics.source", "judge")
MOCO_PREFLIGHT_KEYS = ("judge.mode", "judge.decision", "judge.threshold", "rubric.fallback", "rubric.max_attempts",
                       "momentum.variant", "policy.model")
"""MoCo config keys that change what the preflight finds (its Generator and Judge are the momentum Policy)."""


def references_of(items: Sequence[Any]) -> dict[str, list[str]]:
    """item id -> its reference captions (items without references are left out)."""
    return {str(it.id): list(it.references) for it in items if getattr(it, "references", None)}


def rubicap_preflight(cfg: Any, rows: Sequence[Mapping[str, Any]], reward: Any, out: Path,
                      references: Mapping[str, Sequence[str]]) -> Any:
    """RubiCap's preflight: the rubric reward, refusals naming RubiCap's keys."""
    return image_preflight(cfg, rows, reward, out, references, PREFLIGHT_KEYS)


def moco_preflight(cfg: Any, rows: Sequence[Mapping[str, Any]], reward: Any, out: Path, state: Any) -> Any:
    """MoCo's preflight through its own reward path: for each probe caption the momentum Generator writes a
    rubric for that item (from its two references and the caption; the facts fallback where configured) and
    the momentum Judge scores it. The honest reference is the scene's exact-facts caption (``references[0]``).
    The probe groups are not training groups: they stay out of ``rubrics.rank*.jsonl``. ``state`` is the
    trainer's state before step 1 (the reward seeds its caption subsets with the step, as in training)."""
    from functools import partial

    refs = {str(r["item_id"]): list(r["references"]) for r in rows if r.get("references")}
    judge = getattr(reward, "judge", None)
    saved = getattr(judge, "records", None)
    if saved is not None:
        judge.records = None  # type: ignore[union-attr]
    try:
        return image_preflight(cfg, rows, partial(reward, trainer_state=state), out, refs, MOCO_PREFLIGHT_KEYS)
    finally:
        if saved is not None:
            judge.records = saved  # type: ignore[union-attr]


def image_preflight(cfg: Any, rows: Sequence[Mapping[str, Any]], reward: Any, out: Path,
                    references: Mapping[str, Sequence[str]], keys: Sequence[str]) -> Any:
    """The honest reference of each sampled row (its first reference caption) against the probes."""
    import os

    from captionrl.preflight import run_preflight, sample_rows
    from captionrl.probes import GENERIC_WORDS

    usable = [r for r in rows if references.get(str(r["item_id"]))]
    if cfg.train.preflight_items <= 0:
        return None
    if not usable:
        logger.warning("reward preflight skipped: no training item has a reference caption")
        return None
    chosen = sample_rows(usable, cfg.train.preflight_items, cfg.seed)
    honest = [references[str(r["item_id"])][0] for r in chosen]
    main = int(os.environ.get("RANK", "0")) == 0
    return run_preflight(reward, chosen, honest, [GENERIC_WORDS] * len(chosen), keys=keys,
                         force=cfg.train.force_preflight, out_dir=out if main else None, echo=main,
                         hint="a judge model that can read the captions, a stricter threshold or decision: hard")


def greedy_captions(model: Any, processing: Any, rows: Sequence[Mapping[str, Any]], max_new_tokens: int,
                    name: str) -> tuple[dict[str, str], dict[str, bool]]:
    """(item id -> greedy caption, item id -> clipped by the budget) of an in-memory VLM policy."""
    from captionrl.backends import ChatRequest
    from captionrl.backends.hf import HFBackend
    from captionrl.domains.images import decode_image

    backend = HFBackend.from_model(model, processing, name=name, batch_size=8)
    reqs = []
    for r in rows:
        image = decode_image(r["image"], str(r["item_id"]))
        msgs = []
        for m in r["prompt"]:
            content = m["content"]
            if isinstance(content, list):
                content = [{"type": "image", "image": image} if p.get("type") == "image" else p for p in content]
            msgs.append({**m, "content": content})
        reqs.append(ChatRequest(messages=msgs, max_new_tokens=max_new_tokens, temperature=0.0))
    gens = backend.generate(reqs)
    caps = {str(r["item_id"]): (g.text or "") for r, g in zip(rows, gens, strict=True)}
    clipped = {str(r["item_id"]): g.finish_reason == "length" for r, g in zip(rows, gens, strict=True)}
    return caps, clipped


def image_final_checks(model: Any, processing: Any, rows: Sequence[Mapping[str, Any]],
                       references: Mapping[str, Sequence[str]], out_dir: Path, max_new_tokens: int,
                       n_items: int = 8, seed: int = 0, judges: Mapping[str, Any] | None = None,
                       reward_family: str = "rubric") -> dict[str, Any]:
    """CIDEr-D against references and caption form of the trained policy's greedy captions; each of
    ``judges`` (name -> a ``Judge``) adds the mean of its scores, from the rows' own columns (unscored
    captions left out of the mean, never counted as 0)."""
    from captionrl.eval.final_checks import markdown
    from captionrl.judges.ngram import CiderD
    from captionrl.preflight import sample_rows
    from captionrl.records import write_json

    usable = [r for r in rows if references.get(str(r["item_id"]))]
    chosen = sample_rows(usable, n_items, seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"protocol": "final-checks", "rows": [], "columns": [], "notes": []}
    if not chosen:
        summary["notes"].append("no item has a reference caption: no check other than the reward is available")
    else:
        caps, clipped = greedy_captions(model, processing, chosen, max_new_tokens, "trained")
        cider = CiderD().fit([list(v) for v in references.values()])
        ids = list(caps)
        systems = {"trained": caps}
        if all(len(references[i]) >= 2 for i in ids):  # a yardstick: one reference scored against the others
            systems["reference (first vs the others)"] = {i: references[i][0] for i in ids}
        by_id = {str(r["item_id"]): r for r in chosen}
        for name, c in systems.items():
            refs = {i: [x for x in references[i] if x != c[i]] or list(references[i]) for i in ids}
            judged = {}
            for jname, judge in (judges or {}).items():
                cols = {k: [by_id[i][k] for i in ids] for k in by_id[ids[0]] if k not in ("prompt", "image")}
                got = [j.score for j in judge.judge([c[i] for i in ids], cols) if j.scored]
                judged[jname] = round(float(np.mean(got)), 4) if got else None
            summary["rows"].append({
                "system": name, "n": len(ids),
                "cider_d": round(float(np.mean([cider.score(c[i], refs[i]) for i in ids])), 4),
                "ends_with_stop": round(float(np.mean([c[i].rstrip().endswith((".", "!", "?")) for i in ids])), 4),
                "clipped_ratio": round(float(np.mean([clipped[i] for i in ids])), 4) if name == "trained" else None,
                "length_chars": round(float(np.mean([len(c[i]) for i in ids])), 1),
                **judged,
            })
        summary["examples"] = {i: caps[i] for i in ids[:3]}
        held_out = [n for n in ("cider_d", *(judges or {})) if n != {"cider": "cider_d"}.get(reward_family, reward_family)]
        summary["reward_family"] = reward_family
        summary["held_out"] = held_out
        summary["notes"].append(f"the reward was {reward_family}; checks it did not produce: {', '.join(held_out)}"
                                + (" (CIDEr-D against the reference captions)" if "cider_d" in held_out else ""))
        summary["columns"] = ["n", "cider_d", *(judges or {}), "ends_with_stop", "clipped_ratio", "length_chars"]
    write_json(out_dir / "final_checks.json", summary)
    (out_dir / "final_checks.md").write_text(markdown(summary))
    return summary
