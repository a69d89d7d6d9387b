"""``captionrl train moco-sft``: MoCo Rubric's shared multi-role SFT (paper §3.2).

One model learns all three roles from *sample-aligned* records, i.e. caption, rubric and judgment records linked by image id and caption instance, so the
Generator writes rubrics about the very captions the Judge then judges. One role-conditioned prompt per
record (prompts after appendix A.1):

* Policy:    image -> a detailed flowing caption                      (one row per caption record)
* Generator: image + 2 references + candidate captions -> rubric JSON  (one row per rubric record)
* Judge:     rubric + caption -> per-criterion reason and yes/no JSON  (one row per judgment record;
  the Judge never sees the image, §3.3)

The checkpoint initialises both the Policy and the momentum Generator-Judge of ``train moco``; the RL
recipe builds its rubric and judge prompts with the same ``captionrl.judges.roles`` functions, so the
roles are asked exactly what they were trained on.

The run is ``train/sft.py``'s (TRL's ``SFTTrainer`` in the shared skeleton); this module builds its rows.

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

import random
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from captionrl.config import help_field
from captionrl.errors import ConfigError, DataError
from captionrl.judges.roles import (
    generator_messages,
    judge_messages,
    judgment_json,
    policy_messages,
    rubric_json,
)
from captionrl.records import read_jsonl
from captionrl.train.sft import (
    SFTRecipe,
    SFTRunConfig,
    check_or_train,
    load_image,
    require_keys,
    sft_row,
    train_sft,
)

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
        require_keys(rec, ("image_id", "caption_id", "caption"), where)
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
            return info["image"], None, [load_image(info["image"])]
        return None, info.get("image_text"), []

    rows: list[dict[str, Any]] = []
    for cid, rec in captions.items():
        iid = str(rec["image_id"])
        image, text, images = image_args(iid, f"captions[{cid}]")
        rows.append(sft_row("policy", f"policy:{cid}", policy_messages(image, text, with_images=with_images),
                         str(rec["caption"]), images, image_id=iid, caption_id=cid))

    rng = random.Random(seed)
    rubrics: dict[str, list[dict[str, Any]]] = {}
    rubric_ids_of_image: dict[str, list[str]] = defaultdict(list)
    for i, rec in enumerate(records.rubrics):
        where = f"rubrics[{i}]"
        require_keys(rec, ("image_id", "rubric", "references"), where)
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
        rows.append(sft_row("generator", f"generator:{rid}",
                         generator_messages(refs, candidates, image, text, with_images=with_images),
                         rubric_json(rubric), images, image_id=iid, rubric_id=rid, candidate_ids=cand_ids))

    for i, rec in enumerate(records.judgments):
        where = f"judgments[{i}]"
        require_keys(rec, ("image_id", "caption_id"), where)
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
        rows.append(sft_row("judge", f"judge:{rid}:{cid}", judge_messages(rubric, str(captions[cid]["caption"])),
                         judgment_json(clean), [], image_id=iid, caption_id=cid, rubric_id=rid))
    return rows


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


# ---------------------------------------------------------------------- configs and run
@dataclass
class MocoSFTDataConfig:
    """Where the multi-role records come from."""

    captions: str | None = help_field(None, "JSONL of caption records {image_id, caption_id, caption, image?, image_text?}")
    rubrics: str | None = help_field(None, "JSONL of rubric records {image_id, rubric_id?, references[2], candidate_ids?, rubric[]}")
    judgments: str | None = help_field(None, "JSONL of judgment records {image_id, caption_id, rubric_id?, decisions[]}")
    demo: bool = help_field(False, "use the built-in easy-vqa records (real images and facts; a format demo)")
    demo_images: int = help_field(6, "images in the demo set")
    roles: list[str] = help_field(list(ROLES), "roles to train on (ablation: [policy] is caption-only SFT)")
    n_candidates: int = help_field(4, "candidate captions drawn per rubric record that lists none (paper: 4)")
    max_rows: int | None = help_field(None, "use at most this many rows (a seeded sample; null = all)")

    def __post_init__(self) -> None:
        bad = [r for r in self.roles if r not in ROLES]
        if bad or not self.roles:
            raise ConfigError("data.roles", self.roles, "unknown or empty roles", f"use a subset of {list(ROLES)}")


@dataclass
class MocoSFTConfig(SFTRunConfig):
    """A whole multi-role SFT run: the SFT run of ``train/sft.py`` on sample-aligned role records."""

    data: MocoSFTDataConfig = field(default_factory=MocoSFTDataConfig, metadata={"help": "multi-role SFT records"})  # type: ignore[assignment]

    def __post_init__(self) -> None:
        d = self.data
        if not d.demo and not (d.captions and d.rubrics and d.judgments):
            raise ConfigError("data", {"captions": d.captions, "rubrics": d.rubrics, "judgments": d.judgments},
                              "moco-sft needs caption, rubric and judgment records",
                              "set data.captions, data.rubrics and data.judgments, or data.demo=true")


class MocoSFTRecipe(SFTRecipe):
    """The SFT run on role-conditioned rows (Policy, Generator, Judge)."""

    name = "moco-sft"

    def build_rows(self, with_images: bool) -> list[dict[str, Any]]:
        cfg, d = self.cfg, self.cfg.data
        recs = demo_records(d.demo_images, cfg.seed) if d.demo else RoleRecords.from_files(d.captions, d.rubrics, d.judgments)
        rows = build_multirole_rows(recs, with_images=with_images, n_candidates=d.n_candidates, seed=cfg.seed)
        return [r for r in rows if r["role"] in d.roles]


def run(cfg: MocoSFTConfig, model: Any = None, processing: Any = None, callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    """Train the shared multi-role checkpoint (``train/sft.py``'s ``train_sft``); ``model``/``processing``
    skip loading; ``callbacks`` are extra ``TrainerCallback``s."""
    return train_sft(MocoSFTRecipe(cfg, model, processing, callbacks))


# ---------------------------------------------------------------------- command
CONFIG = MocoSFTConfig


def run_command(cfg: MocoSFTConfig) -> int:
    """``captionrl train moco-sft``: check the rows or train."""
    print(check_or_train(MocoSFTRecipe(cfg)))
    return 0
