"""Supervised fine-tuning: MoCo Rubric's shared multi-role SFT, and plain SFT distillation.

``captionrl train moco-sft`` (paper §3.2): one model learns all three roles from *sample-aligned*
records, i.e. caption, rubric and judgment records linked by image id and caption instance, so the
Generator writes rubrics about the very captions the Judge then judges. One role-conditioned prompt per
record (prompts after appendix A.1):

* Policy:    image -> a detailed flowing caption                      (one row per caption record)
* Generator: image + 2 references + candidate captions -> rubric JSON  (one row per rubric record)
* Judge:     rubric + caption -> per-criterion reason and yes/no JSON  (one row per judgment record;
  the Judge never sees the image, §3.3)

The checkpoint initialises both the Policy and the momentum Generator-Judge of ``train moco``; the RL
recipe builds its rubric and judge prompts with the same ``captionrl.judges.roles`` functions, so the
roles are asked exactly what they were trained on.

``captionrl train sft`` distils a teacher's captions (JSONL of ``{prompt | series | image, caption}``):
the paper's SFT baseline (learning rate 1e-5, cosine schedule).

Input records (JSONL, one object per line):

* captions:  ``{"image_id", "caption_id", "caption", "image"?: path, "image_text"?: str}``
* rubrics:   ``{"image_id", "rubric_id"?, "references": [2 captions], "candidate_ids"?: [caption_id...]
  | "candidates"?: [text...], "rubric": [{"criterion", "test", "weight": 1|2|3}]}``; without candidates,
  ``n_candidates`` captions of the image are drawn with the run's seed and the draw is recorded.
* judgments: ``{"image_id", "caption_id", "rubric_id"?, "decisions": [{"reason", "decision": yes|no}]}``,
  one decision per rubric item, in order; ``rubric_id`` defaults to the image's only rubric.

``image_text`` stands in for the image with language-only models (the embedded SmolLM2): a textual
rendering of the image evidence. With a vision-language model the ``image`` path is loaded instead.
"""

from __future__ import annotations

import json
import logging
import random
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from captionrl.config import help_field
from captionrl.errors import ConfigError, DataError
from captionrl.judges.roles import (
    POLICY_INSTRUCTION,
    generator_messages,
    judge_messages,
    judgment_json,
    policy_messages,
    rubric_json,
)
from captionrl.records import RecordWriter, read_jsonl
from captionrl.train.common import (
    PolicyConfig,
    cuda_available,
    lora_config,
)
from captionrl.train.skeleton import Recipe, Run, train

logger = logging.getLogger(__name__)

RECIPES = ("moco-sft", "sft")
ROLES = ("policy", "generator", "judge")

def normalise_rubric(items: Any, where: str) -> list[dict[str, Any]]:
    """Validate rubric items with the rubric store's schema (``captionrl.judges.rubric``):
    ``{criterion, test, weight in {1, 2, 3}}``, so the Generator learns the format the RL recipe parses."""
    from captionrl.judges.rubric import validate_rubric

    return [item.to_dict() for item in validate_rubric(items, field_name=f"{where}.rubric")]


def parse_decision(value: Any, where: str) -> str:
    """``yes``/``no`` from a decision given as text or boolean."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    text = str(value).strip().lower()
    if text in ("yes", "y", "true", "1", "satisfied", "pass"):
        return "yes"
    if text in ("no", "n", "false", "0", "not satisfied", "fail"):
        return "no"
    raise DataError(where, value, "is not a yes/no decision", 'write "decision": "yes" or "no"')


# ---------------------------------------------------------------------- linking records
@dataclass
class RoleRecords:
    """Caption, rubric and judgment records of the multi-role SFT (plain dicts, validated on build)."""

    captions: list[dict[str, Any]] = field(default_factory=list)
    rubrics: list[dict[str, Any]] = field(default_factory=list)
    judgments: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_files(cls, captions: str | Path, rubrics: str | Path, judgments: str | Path) -> RoleRecords:
        out = cls()
        for name, path in (("captions", captions), ("rubrics", rubrics), ("judgments", judgments)):
            if not Path(path).is_file():
                raise DataError(f"data.{name}", str(path), "file not found", f"give the path of the {name} JSONL file")
            setattr(out, name, list(read_jsonl(path)))
        return out


def _require(rec: Mapping[str, Any], keys: Sequence[str], where: str) -> None:
    for k in keys:
        if k not in rec or rec[k] in (None, ""):
            raise DataError(f"{where}.{k}", rec.get(k), "is missing", f"add {k!r} to every record of this file")


def _load_image(path: Any) -> Any:
    from PIL import Image

    if hasattr(path, "convert"):
        return path.convert("RGB")
    if not Path(str(path)).is_file():
        raise DataError("image", str(path), "image file not found", "fix the image path (relative paths resolve from the working directory)")
    return Image.open(str(path)).convert("RGB")


def build_multirole_rows(records: RoleRecords, *, with_images: bool = False, n_candidates: int = 4,
                         seed: int = 0) -> list[dict[str, Any]]:
    """One role-conditioned prompt-completion row per record, linked by image id and caption id.

    Every link is checked: a rubric's candidates and a judgment's caption must be captions of the same
    image, and a judgment must have one decision per rubric item. Candidate draws are seeded and their
    ids kept in the row (``candidate_ids``) so that the data set is reproducible and inspectable.
    """
    if n_candidates < 1:
        raise ConfigError("data.n_candidates", n_candidates, "must be >= 1", "use 4, as in the paper")
    captions: dict[str, dict[str, Any]] = {}
    by_image: dict[str, list[str]] = defaultdict(list)
    image_info: dict[str, dict[str, Any]] = defaultdict(dict)
    for i, rec in enumerate(records.captions):
        where = f"captions[{i}]"
        _require(rec, ("image_id", "caption_id", "caption"), where)
        cid, iid = str(rec["caption_id"]), str(rec["image_id"])
        if cid in captions:
            raise DataError(f"{where}.caption_id", cid, "is used twice", "give every caption record its own caption_id")
        captions[cid] = rec
        by_image[iid].append(cid)
    for rec in [*records.captions, *records.rubrics]:
        info = image_info[str(rec.get("image_id"))]
        for k in ("image", "image_text"):
            if rec.get(k) and k not in info:
                info[k] = rec[k]

    def image_args(iid: str, where: str) -> tuple[Any, str | None, list[Any]]:
        info = image_info.get(iid, {})
        if with_images:
            if "image" not in info:
                raise DataError(f"{where}.image", None, f"no record of image {iid!r} gives an image path",
                                "add 'image' to its caption records, or train a language-only model with image_text")
            return info["image"], None, [_load_image(info["image"])]
        return None, info.get("image_text"), []

    rows: list[dict[str, Any]] = []
    for cid, rec in captions.items():
        iid = str(rec["image_id"])
        image, text, images = image_args(iid, f"captions[{cid}]")
        rows.append(_row("policy", f"policy:{cid}", policy_messages(image, text, with_images=with_images),
                         str(rec["caption"]), images, image_id=iid, caption_id=cid))

    rng = random.Random(seed)
    rubrics: dict[str, list[dict[str, Any]]] = {}
    rubric_ids_of_image: dict[str, list[str]] = defaultdict(list)
    for i, rec in enumerate(records.rubrics):
        where = f"rubrics[{i}]"
        _require(rec, ("image_id", "rubric", "references"), where)
        iid = str(rec["image_id"])
        rid = str(rec.get("rubric_id") or iid)
        if rid in rubrics:
            raise DataError(f"{where}.rubric_id", rid, "is used twice", "give each rubric of an image its own rubric_id")
        rubric = normalise_rubric(rec["rubric"], where)
        refs = rec["references"]
        if not isinstance(refs, list) or len(refs) != 2 or not all(isinstance(r, str) and r.strip() for r in refs):
            raise DataError(f"{where}.references", refs, "must be a list of 2 reference captions",
                            "give exactly two reference captions, as in the paper's Generator prompt")
        if rec.get("candidate_ids"):
            cand_ids = [str(c) for c in rec["candidate_ids"]]
            for c in cand_ids:
                if c not in captions:
                    raise DataError(f"{where}.candidate_ids", c, "is not a caption_id of the captions file",
                                    "list caption_ids of caption records")
                if str(captions[c]["image_id"]) != iid:
                    raise DataError(f"{where}.candidate_ids", c, f"is a caption of image {captions[c]['image_id']!r}, not {iid!r}",
                                    "use captions of the rubric's own image")
            candidates = [str(captions[c]["caption"]) for c in cand_ids]
        elif rec.get("candidates"):
            cand_ids, candidates = [], [str(c) for c in rec["candidates"]]
        else:
            pool = sorted(by_image.get(iid, []))
            if not pool:
                raise DataError(f"{where}.candidate_ids", None, f"image {iid!r} has no caption records to draw candidates from",
                                "add candidate_ids or candidates, or caption records of this image")
            cand_ids = rng.sample(pool, min(n_candidates, len(pool)))
            candidates = [str(captions[c]["caption"]) for c in cand_ids]
        image, text, images = image_args(iid, where)
        rubrics[rid] = rubric
        rubric_ids_of_image[iid].append(rid)
        rows.append(_row("generator", f"generator:{rid}",
                         generator_messages(refs, candidates, image, text, with_images=with_images),
                         rubric_json(rubric), images, image_id=iid, rubric_id=rid, candidate_ids=cand_ids))

    for i, rec in enumerate(records.judgments):
        where = f"judgments[{i}]"
        _require(rec, ("image_id", "caption_id"), where)
        iid, cid = str(rec["image_id"]), str(rec["caption_id"])
        if cid not in captions:
            raise DataError(f"{where}.caption_id", cid, "is not a caption_id of the captions file", "link judgments to caption records")
        if str(captions[cid]["image_id"]) != iid:
            raise DataError(f"{where}.image_id", iid, f"caption {cid!r} belongs to image {captions[cid]['image_id']!r}",
                            "fix the image_id or the caption_id")
        rid = rec.get("rubric_id")
        if rid is None:
            ids = rubric_ids_of_image.get(iid, [])
            if len(ids) != 1:
                raise DataError(f"{where}.rubric_id", None, f"image {iid!r} has {len(ids)} rubrics",
                                "give rubric_id to say which rubric was judged")
            rid = ids[0]
        rid = str(rid)
        if rid not in rubrics:
            raise DataError(f"{where}.rubric_id", rid, "no rubric record has this id", "link judgments to rubric records")
        decisions = rec.get("decisions", rec.get("judgments"))
        rubric = rubrics[rid]
        if not isinstance(decisions, list) or len(decisions) != len(rubric):
            raise DataError(f"{where}.decisions", decisions, f"must hold one decision per rubric item ({len(rubric)})",
                            "give [{'reason': ..., 'decision': 'yes'|'no'}] in rubric order")
        clean = []
        for j, d in enumerate(decisions):
            d = d if isinstance(d, Mapping) else {"decision": d}
            clean.append({"reason": str(d.get("reason", "")),
                          "decision": parse_decision(d.get("decision"), f"{where}.decisions[{j}].decision")})
        rows.append(_row("judge", f"judge:{rid}:{cid}", judge_messages(rubric, str(captions[cid]["caption"])),
                         judgment_json(clean), [], image_id=iid, caption_id=cid, rubric_id=rid))
    return rows


def _row(role: str, key: str, prompt: list[dict[str, Any]], completion: str, images: list[Any],
         **meta: Any) -> dict[str, Any]:
    return {"key": key, "role": role, "prompt": prompt,
            "completion": [{"role": "assistant", "content": completion}], "images": images, **meta}


def build_distill_rows(records: Sequence[Mapping[str, Any]], *, with_images: bool = False,
                       precision: int = 2, chart: bool = False, instruction: str | None = None) -> list[dict[str, Any]]:
    """Rows of SFT distillation: ``prompt`` (text or chat messages), ``series`` or ``image``.

    A series record is asked as LineupRL asks its policy (``domains.captioning.series_caption_messages``):
    the rendered chart when ``chart`` (a VLM policy: the SFT baseline on a teacher's chart captions), the
    printed numbers otherwise; ``instruction`` (or the record's own) is the captioning instruction."""
    rows = []
    for i, rec in enumerate(records):
        where = f"data[{i}]"
        _require(rec, ("caption",), where)
        key = str(rec.get("id", rec.get("key", i)))
        images: list[Any] = []
        if rec.get("prompt"):
            p = rec["prompt"]
            prompt = [{"role": "user", "content": p}] if isinstance(p, str) else list(p)
        elif rec.get("series") is not None:
            from captionrl.domains.captioning import series_caption_messages

            values = _series_values(rec["series"], f"{where}.series")
            prompt = series_caption_messages(values, chart=chart and with_images, precision=precision,
                                             instruction=rec.get("instruction") or instruction)
            if chart and with_images:  # TRL's VLM collator: an image placeholder in the turn, the image in a column
                parts = prompt[0]["content"]
                images = [p["image"] for p in parts if p.get("type") == "image"]
                prompt = [{"role": "user", "content": [{"type": "image"} if p.get("type") == "image" else p
                                                       for p in parts]}]
        elif rec.get("image") is not None:
            if not with_images:
                raise DataError(f"{where}.image", rec["image"], "a language-only model cannot read images",
                                "train a vision-language model (policy.model), or give 'prompt' (e.g. image_text) instead")
            prompt = policy_messages(with_images=True, instruction=rec.get("instruction", POLICY_INSTRUCTION))
            images = [_load_image(rec["image"])]
        else:
            raise DataError(where, sorted(rec), "has no prompt, series or image",
                            "give each record 'prompt' (text or chat messages), 'series' (numbers) or 'image' (path)")
        rows.append(_row("policy", f"sft:{key}", prompt, str(rec["caption"]), images))
    return rows


def _series_values(values: Any, where: str) -> list[float]:
    """A record's series as floats: one-dimensional, finite, at least 2 values (else a named DataError)."""
    import numpy as np

    try:
        arr = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise DataError(where, values, "is not a list of numbers", "write the series as a JSON list of numbers") from None
    if arr.ndim != 1 or arr.size < 2 or not np.isfinite(arr).all():
        raise DataError(where, list(np.ravel(arr))[:6], "must be a finite series of at least 2 values",
                        "clean the record (no NaN, no nesting) or drop it")
    return arr.tolist()


def demo_records(n_images: int = 6, seed: int = 0) -> RoleRecords:
    """A real, offline multi-role set from ``easy-vqa`` (64x64 images of one coloured shape).

    Each image's colour and shape come from its own QA pairs. Per image: a faithful caption and a
    caption that gets one fact wrong (which one is drawn with ``seed``); a rubric with one criterion per
    fact; and the true judgments of both captions against it. ``image_text`` states the facts for
    language-only models. Shows the record format; too small to teach a model much.
    """
    import easy_vqa

    questions, answers, image_ids = easy_vqa.get_train_questions()
    paths = easy_vqa.get_train_image_paths()
    shapes_vocab = {"circle", "rectangle", "triangle"}
    facts: dict[int, dict[str, str]] = defaultdict(dict)
    for q, a, iid in zip(questions, answers, image_ids, strict=True):
        if q.startswith("what") and a not in ("yes", "no"):  # "what shape/color ..." questions
            facts[iid]["shape" if a in shapes_vocab else "colour"] = a
    known = sorted(i for i, f in facts.items() if {"colour", "shape"} <= set(f))
    if len(known) < n_images:
        raise DataError("n_images", n_images, f"easy-vqa has only {len(known)} images with colour and shape", "ask for fewer")
    rng = random.Random(seed)
    colours = sorted({f["colour"] for f in facts.values() if "colour" in f})
    shapes = sorted({f["shape"] for f in facts.values() if "shape" in f})
    out = RoleRecords()
    for iid in rng.sample(known, n_images):
        f = facts[iid]
        image_id = f"easyvqa-train-{iid}"
        wrong_kind = rng.choice(["colour", "shape"])
        pool = colours if wrong_kind == "colour" else shapes
        wrong = {**f, wrong_kind: rng.choice([x for x in pool if x != f[wrong_kind]])}
        good = f"The image shows a single {f['colour']} {f['shape']} on a plain background."
        bad = f"The image shows a single {wrong['colour']} {wrong['shape']} on a plain background."
        text = f"one {f['colour']} {f['shape']}"
        for cid, cap in ((f"{image_id}-a", good), (f"{image_id}-b", bad)):
            out.captions.append({"image_id": image_id, "caption_id": cid, "caption": cap,
                                 "image": paths[iid], "image_text": text})
        rubric = [
            {"criterion": f"Names the shape as a {f['shape']}", "test": f"the caption calls the shape a {f['shape']}", "weight": 3},
            {"criterion": f"Gives the shape's colour as {f['colour']}", "test": f"the caption says the shape is {f['colour']}", "weight": 2},
        ]
        out.rubrics.append({"image_id": image_id, "references": [good, f"A {f['colour']} {f['shape']}."],
                            "candidate_ids": [f"{image_id}-a", f"{image_id}-b"], "rubric": rubric})
        for cid, cf in ((f"{image_id}-a", f), (f"{image_id}-b", wrong)):
            decisions = []
            for kind in ("shape", "colour"):
                ok = cf[kind] == f[kind]
                reason = (f"The caption says {cf[kind]}, as required." if ok
                          else f"The caption says {cf[kind]}, not {f[kind]}.")
                decisions.append({"reason": reason, "decision": "yes" if ok else "no"})
            out.judgments.append({"image_id": image_id, "caption_id": cid, "decisions": decisions})
    return out


# ---------------------------------------------------------------------- configs
@dataclass
class SFTDataConfig:
    """Where the SFT records come from."""

    captions: str | None = help_field(None, "moco-sft: JSONL of caption records {image_id, caption_id, caption, image?, image_text?}")
    rubrics: str | None = help_field(None, "moco-sft: JSONL of rubric records {image_id, rubric_id?, references[2], candidate_ids?, rubric[]}")
    judgments: str | None = help_field(None, "moco-sft: JSONL of judgment records {image_id, caption_id, rubric_id?, decisions[]}")
    path: str | None = help_field(None, "sft: JSONL of {prompt | series | image, caption} written by a teacher")
    demo: bool = help_field(False, "moco-sft: use the built-in easy-vqa records (real images and facts; a format demo)")
    demo_images: int = help_field(6, "images in the demo set")
    roles: list[str] = help_field(list(ROLES), "moco-sft: roles to train on (ablation: [policy] is caption-only SFT)")
    n_candidates: int = help_field(4, "candidate captions drawn per rubric record that lists none (paper: 4)")
    max_rows: int | None = help_field(None, "use at most this many rows (a seeded sample; null = all)")
    precision: int = help_field(2, "sft with series: decimals when printing values")
    instruction: str | None = help_field(None, "sft with series: the captioning instruction (null = the default of captionrl.domains.captioning; use LineupRL's data.instruction to ask what RL asks)")

    def __post_init__(self) -> None:
        bad = [r for r in self.roles if r not in ROLES]
        if bad or not self.roles:
            raise ConfigError("data.roles", self.roles, "unknown or empty roles", f"use a subset of {list(ROLES)}")


@dataclass
class SFTTrainConfig:
    """Optimisation, checkpoints and logging of the SFT run (TRL ``SFTTrainer``)."""

    out_dir: str = help_field("runs/sft", "run folder: config.yaml, data.jsonl, checkpoints/, model/, curves.png; rerunning resumes")
    learning_rate: float = help_field(1e-5, "AdamW learning rate (the paper's SFT: 1e-5)")
    lr_scheduler_type: str = help_field("cosine", "learning-rate schedule (paper: cosine)")
    warmup_steps: float = help_field(0.0, "warm-up: steps (>= 1) or a fraction of all steps (< 1)")
    weight_decay: float = help_field(0.0, "AdamW weight decay")
    num_train_epochs: float = help_field(1.0, "passes over the rows (when max_steps is -1)")
    max_steps: int = help_field(-1, "optimizer steps; -1 = num_train_epochs passes")
    per_device_train_batch_size: int = help_field(4, "rows per device per micro-step")
    gradient_accumulation_steps: int = help_field(1, "micro-steps per optimizer step")
    max_length: int = help_field(1024, "longest tokenized row (prompt + completion); rows whose prompt alone is too long are dropped and counted")
    save_steps: int = help_field(200, "checkpoint every N optimizer steps")
    save_total_limit: int | None = help_field(None, "keep the N most recent checkpoints (null: all)")
    logging_steps: int = help_field(10, "log metrics every N steps")
    report_to: list[str] = help_field(["tensorboard"], "metric sinks: tensorboard, wandb, trackio, or [] for none")
    threads: int | None = help_field(None, "torch CPU threads (null: leave OMP_NUM_THREADS's choice)")
    use_cpu: bool | None = help_field(None, "train on CPU; null = CPU when no GPU is visible")
    bf16: bool | None = help_field(None, "bf16 mixed precision; null = on for GPUs, off on CPU")
    gradient_checkpointing: bool | None = help_field(None, "recompute activations; null = on for GPUs, off on CPU")
    resume: str = help_field("auto", "auto: resume from the last checkpoint in out_dir (config must match); off: refuse a folder with checkpoints")
    extra: dict[str, Any] = help_field({}, "any other SFTConfig field, passed through unchanged")

    def __post_init__(self) -> None:
        for name in ("per_device_train_batch_size", "gradient_accumulation_steps", "save_steps", "logging_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name}", getattr(self, name), "must be >= 1", f"set train.{name} to 1 or more")
        if self.max_length < 16:
            raise ConfigError("train.max_length", self.max_length, "is too short for any prompt", "use e.g. 1024")
        if self.max_steps == 0 or self.max_steps < -1:
            raise ConfigError("train.max_steps", self.max_steps, "must be -1 or >= 1", "set train.max_steps: 100")
        if self.learning_rate <= 0:
            raise ConfigError("train.learning_rate", self.learning_rate, "must be > 0", "use 1e-5")
        if self.resume not in ("auto", "off"):
            raise ConfigError("train.resume", self.resume, "unknown resume mode", "use auto or off")
        if isinstance(self.report_to, str):
            self.report_to = [] if self.report_to in ("none", "") else [self.report_to]


@dataclass
class SFTRunConfig:
    """A whole SFT run: recipe, model, data and training."""

    recipe: str = help_field("moco-sft", "moco-sft (shared multi-role SFT) or sft (distillation from captions)")
    seed: int = help_field(0, "seed of shuffling, candidate draws, row sampling and the trainer")
    check: bool = help_field(False, "validate config and data, print row counts per role, load no model")
    policy: PolicyConfig = field(default_factory=PolicyConfig, metadata={"help": "the model being fine-tuned (LoRA or full)"})
    data: SFTDataConfig = field(default_factory=SFTDataConfig, metadata={"help": "SFT records"})
    train: SFTTrainConfig = field(default_factory=SFTTrainConfig, metadata={"help": "optimisation and checkpoints"})

    def __post_init__(self) -> None:
        if self.recipe not in RECIPES:
            raise ConfigError("recipe", self.recipe, "unknown SFT recipe", f"use one of {', '.join(RECIPES)}")
        d = self.data
        if self.recipe == "moco-sft" and not d.demo and not (d.captions and d.rubrics and d.judgments):
            raise ConfigError("data", {"captions": d.captions, "rubrics": d.rubrics, "judgments": d.judgments},
                              "moco-sft needs caption, rubric and judgment records",
                              "set data.captions, data.rubrics and data.judgments, or data.demo=true")
        if self.recipe == "sft" and not d.path:
            raise ConfigError("data.path", d.path, "sft needs the teacher's captions", "set data.path=<file.jsonl>")


# ---------------------------------------------------------------------- run
def build_rows(cfg: SFTRunConfig, with_images: bool) -> list[dict[str, Any]]:
    d = cfg.data
    if cfg.recipe == "moco-sft":
        recs = demo_records(d.demo_images, cfg.seed) if d.demo else RoleRecords.from_files(d.captions, d.rubrics, d.judgments)  # type: ignore[arg-type]
        rows = build_multirole_rows(recs, with_images=with_images, n_candidates=d.n_candidates, seed=cfg.seed)
        rows = [r for r in rows if r["role"] in d.roles]
    else:
        p = Path(str(d.path))
        if not p.is_file():
            raise DataError("data.path", str(p), "file not found", "give the JSONL of teacher captions")
        rows = build_distill_rows(list(read_jsonl(p)), with_images=with_images, precision=d.precision,
                                  chart=cfg.policy.input != "numbers", instruction=d.instruction)
    if not rows:
        raise DataError("data", cfg.recipe, "no rows to train on", "check the record files and data.roles")
    rng = random.Random(cfg.seed)
    if d.max_rows is not None and d.max_rows < len(rows):
        rows = rng.sample(rows, d.max_rows)
    return rows


def drop_too_long(rows: list[dict[str, Any]], tokenizer: Any, max_length: int) -> tuple[list[dict[str, Any]], list[str]]:
    """Drop rows whose prompt leaves no room for the completion (TRL truncates the end: the target)."""
    kept, dropped = [], []
    for r in rows:
        text = tokenizer.apply_chat_template(_text_only(r["prompt"]), tokenize=False, add_generation_prompt=True)
        n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        (kept if n < max_length - 8 else dropped).append(r if n < max_length - 8 else r["key"])
    return kept, dropped


def _as_parts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages whose content is always a list of parts (a string becomes one text part): a VLM data set
    mixes image prompts (Policy, Generator) with text-only ones (Judge), and Arrow needs one type."""
    return [{**m, "content": m["content"] if isinstance(m["content"], list)
             else [{"type": "text", "text": m["content"]}]} for m in messages]


def _text_only(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        c = m["content"]
        if isinstance(c, list):
            c = " ".join(p.get("text", "<image>") for p in c)
        out.append({"role": m["role"], "content": c})
    return out


def sft_args(cfg: SFTRunConfig, output_dir: Path) -> Any:
    from trl import SFTConfig

    t = cfg.train
    on_cpu = t.use_cpu if t.use_cpu is not None else not cuda_available()
    kw: dict[str, Any] = {
        "output_dir": str(output_dir), "seed": cfg.seed, "data_seed": cfg.seed, "use_cpu": on_cpu,
        "bf16": t.bf16 if t.bf16 is not None else not on_cpu, "fp16": False,
        "gradient_checkpointing": t.gradient_checkpointing if t.gradient_checkpointing is not None else not on_cpu,
        "learning_rate": t.learning_rate, "lr_scheduler_type": t.lr_scheduler_type, "warmup_steps": t.warmup_steps,
        "weight_decay": t.weight_decay, "num_train_epochs": t.num_train_epochs, "max_steps": t.max_steps,
        "per_device_train_batch_size": t.per_device_train_batch_size,
        "gradient_accumulation_steps": t.gradient_accumulation_steps, "max_length": t.max_length,
        "save_strategy": "steps", "save_steps": t.save_steps, "save_total_limit": t.save_total_limit,
        "logging_steps": t.logging_steps, "report_to": list(t.report_to) or "none",
        "completion_only_loss": True, "packing": False, "dataloader_num_workers": 0,
    }
    import dataclasses

    names = {f.name for f in dataclasses.fields(SFTConfig)}
    for k, v in t.extra.items():
        if k not in names:
            from captionrl.registry import suggest

            raise ConfigError(f"train.extra.{k}", v, "not an SFTConfig field", suggest(k, sorted(names)))
        kw[k] = v
    try:
        return SFTConfig(**kw)
    except ValueError as exc:
        raise ConfigError("train", cfg.recipe, f"TRL rejected the settings: {exc}", "adjust the named setting") from exc


class SFTRecipe(Recipe):
    """SFT in the shared skeleton: prompt-completion rows as data, TRL's ``SFTTrainer`` instead of an RL
    trainer (no reward functions), ``sft_summary.json`` as the result file."""

    title = "SFT"
    result_file = "sft_summary.json"
    curve_keys = ("loss", "mean_token_accuracy", "learning_rate")

    def __init__(self, cfg: SFTRunConfig, model: Any = None, processing: Any = None, callbacks: Sequence[Any] = ()) -> None:
        super().__init__(cfg, callbacks)
        self.given = (model, processing)
        self.rows: list[dict[str, Any]] = []
        self.dropped: list[str] = []

    def trainer_args(self, run: Run) -> Any:
        return sft_args(self.cfg, run.out / "checkpoints")

    def dataset(self, run: Run) -> list[dict[str, Any]]:
        """Every record link checked before any model loads (text only; images are read once the policy
        says it is a VLM)."""
        return build_rows(self.cfg, with_images=False)

    def load_policy(self, run: Run) -> None:
        model, processing = self.given
        pol = self.cfg.policy
        if pol.input == "chart" and model is None:  # from the config alone: fail before the weights load
            from captionrl.backends.hf import model_is_vlm

            if not model_is_vlm(pol.model, pol.trust_remote_code):
                raise ConfigError("policy.input", "chart", f"{pol.model} is a language-only model",
                                  "set policy.input: numbers, or fine-tune a VLM policy on the charts")
        if model is None:
            super().load_policy(run)
        else:
            run.model, run.processing, run.is_vlm = model, processing, hasattr(processing, "image_processor")

    def build_trainer(self, run: Run) -> Any:
        from datasets import Dataset
        from trl import SFTTrainer

        cfg, out = self.cfg, run.out
        rows = build_rows(cfg, with_images=True) if run.is_vlm else run.data
        tokenizer = getattr(run.processing, "tokenizer", run.processing)
        self.rows, self.dropped = drop_too_long(rows, tokenizer, cfg.train.max_length)
        if self.dropped:
            logger.warning(f"warning: dropped {len(self.dropped)} row(s) whose prompt exceeds train.max_length={cfg.train.max_length} "
                           f"(e.g. {self.dropped[:3]}); raise train.max_length to keep them")
        if not self.rows:
            raise ConfigError("train.max_length", cfg.train.max_length, "every row's prompt is longer", "raise train.max_length")
        with RecordWriter(out / "data.jsonl") as w:
            w.write_many({k: v for k, v in r.items() if k != "images"} for r in self.rows if not w.has(r["key"]))
        columns = ["prompt", "completion"] + (["images"] if run.is_vlm else [])
        table = [{k: r[k] for k in columns} for r in self.rows]
        if run.is_vlm:  # the Judge's text-only prompts beside image prompts: one content type per column
            table = [{**t, "prompt": _as_parts(t["prompt"])} for t in table]
        dataset = Dataset.from_list(table)
        return SFTTrainer(model=run.model, args=run.args, train_dataset=dataset, processing_class=run.processing,
                          peft_config=lora_config(cfg.policy), callbacks=self.callbacks(run))

    def summary(self, run: Run) -> dict[str, Any]:
        return {"recipe": self.cfg.recipe, "rows": dict(Counter(r["role"] for r in self.rows)),
                "dropped_too_long": self.dropped, "train_loss": run.train_output.training_loss,
                "resumed_from": str(run.resume_from) if run.resume_from else None,
                "log_history": run.trainer.state.log_history}


def run(cfg: SFTRunConfig, model: Any = None, processing: Any = None, callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    """Build the rows, train with TRL's ``SFTTrainer`` (resuming from ``out_dir`` when it holds a
    checkpoint), save the model and ``sft_summary.json``; returns the summary and the trainer.
    ``model``/``processing`` skip loading; ``callbacks`` are extra ``TrainerCallback``s."""
    done = train(SFTRecipe(cfg, model, processing, callbacks))
    return {**done.result, "trainer": done.trainer}


@dataclass
class DistillRunConfig(SFTRunConfig):
    """``captionrl train sft``: the same run, distilling a teacher's captions (the SFT baseline)."""

    recipe: str = help_field("sft", "sft (distillation from captions) or moco-sft (shared multi-role SFT)")


# ---------------------------------------------------------------------- command
CONFIG = SFTRunConfig


def run_command(cfg: SFTRunConfig) -> int:
    """``captionrl train moco-sft`` / ``train sft`` (``recipe=sft``): check the rows or train."""
    if cfg.check:
        rows = build_rows(cfg, with_images=False)
        print(json.dumps(dict(Counter(r["role"] for r in rows))))
        return 0
    result = run(cfg)
    print(f"rows:   {result['rows']}  (dropped as too long: {len(result['dropped_too_long'])})")
    print(f"steps:  {result['steps']}  train loss {result['train_loss']:.4f}")
    print(f"model:  {result['model']}")
    if result.get("curves"):
        print(f"curves: {result['curves']}")
    return 0
