"""What the evaluation protocols share: systems (one caption file per captioner), demo systems on the
offline data, the offline image items, and judges' backends built from a spec string.

Protocols import from here and never from each other (only ``report`` reads other protocols' results),
so each protocol file reads top to bottom without following a circle.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from captionrl.config import help_field
from captionrl.errors import ConfigError, DataError, InputTooLongError
from captionrl.records import check_caption, read_jsonl

Systems = dict[str, dict[str, dict[str, Any]]]
"""system name -> item id -> caption record (``caption`` plus optional reference/image/benchmark)."""

COLORS = ("red", "green", "blue", "yellow", "teal", "brown", "black", "gray")
SHAPES = ("circle", "rectangle", "triangle")


# ---------------------------------------------------------------------- caption files
def split_spec(spec: str) -> tuple[str, str]:
    """``NAME=PATH`` -> (NAME, PATH); a bare ``PATH`` is named after its file stem."""
    name, sep, path = spec.partition("=")
    if not sep:
        return Path(spec).stem, spec
    return name or Path(path).stem, path


def load_caption_file(path: str | Path) -> dict[str, dict[str, Any]]:
    """Read one system's captions (JSONL ``{id, caption, ...}``), validating every line."""
    p = Path(path)
    if not p.exists():
        raise DataError("captions", str(path), "file not found", "give a JSONL file with {id, caption} lines")
    out: dict[str, dict[str, Any]] = {}
    for n, rec in enumerate(read_jsonl(p, unique_key="id")):
        if "id" not in rec or "caption" not in rec:
            raise DataError(f"{p.name}:line {n + 1}", sorted(rec), "needs 'id' and 'caption' fields",
                            'write lines like {"id": "img1", "caption": "A red circle."}')
        check_caption(rec["caption"], f"{p.name}:{rec['id']}.caption", "A red circle.")
        key = str(rec["id"])
        if key in out:
            raise DataError(f"{p.name}:id", key, "appears twice", "give every item one caption per system")
        out[key] = rec
    if not out:
        raise DataError("captions", str(path), "holds no caption lines", "check the file")
    return out


def load_systems(specs: Sequence[str]) -> Systems:
    """``["sysA.jsonl", "name=sysB.jsonl"]`` -> {name: {id: record}}; names default to file stems."""
    systems: Systems = {}
    for spec in specs:
        name, path = split_spec(spec)
        if name in systems:
            raise ConfigError("captions", spec, f"system name {name!r} is used twice",
                              "name the files differently or write NAME=PATH")
        systems[name] = load_caption_file(path)
    return systems


def check_fits_context(texts: Mapping[str, str], backends: Mapping[str, Any], what: str = "caption") -> None:
    """Raise ``InputTooLongError`` naming where a text came from (``file:line N``) when it alone is longer than
    a backend's context, before any model call: such a text cannot fit any prompt, and a forward pass on it
    is killed for memory with no message (a 200,000-character caption pasted by mistake).

    Only backends that know their context and tokenizer (``context_tokens``, ``count_tokens``: in-process
    ones) are checked here; the backend itself also checks every whole prompt before its forward pass, and a
    server answers a too-long prompt with an HTTP error (unscored, with the server's message)."""
    for name, backend in backends.items():
        limit = getattr(backend, "context_tokens", None)
        count = getattr(backend, "count_tokens", None)
        if not isinstance(limit, int) or not callable(count):
            continue
        for origin, text in texts.items():
            if len(text.encode("utf-8")) < limit:  # byte-level tokenizers: never more tokens than bytes
                continue
            n = count(text)
            if n > limit:
                raise InputTooLongError(
                    origin, f"a {what} of {len(text)} characters ({n} tokens)",
                    f"is longer than the context of {name} ({limit} tokens), so no prompt holding it fits",
                    f"shorten or remove that {what} (a paste gone wrong?), or use a model with a longer context")


def caption_length(text: str) -> int:
    """Caption length in words (the unit CapArena reports)."""
    return len(text.split())


def shared_ids(systems: Systems, names: Sequence[str]) -> list[str]:
    """Item ids captioned by every one of ``names``, in the first system's order."""
    first = systems[names[0]]
    return [i for i in first if all(i in systems[n] for n in names[1:])]


def item_field(systems: Systems, names: Sequence[str], item_id: str, field: str) -> Any:
    """A per-item field (reference, image, benchmark) from the first system that has it."""
    for n in names:
        v = systems[n].get(item_id, {}).get(field)
        if v not in (None, ""):
            return v
    return None


# ---------------------------------------------------------------------- offline data and demo systems
def easy_vqa_items(n: int = 12, seed: int = 0, split: str = "test") -> list[dict[str, Any]]:
    """``n`` easy-vqa images (seeded choice, recorded by the caller) with a reference caption and MC questions.

    easy-vqa ships only QA pairs; each image shows one coloured shape, so the colour and shape answers
    give a reference caption ("A blue circle."), and each answer becomes a multiple-choice question:
    yes/no, one of 3 shapes, or the colour among 4 (3 seeded distractor colours).
    """
    from captionrl.domains.images import load_easy_vqa

    rng = random.Random(f"easy-vqa|{seed}")
    items = []
    for it in load_easy_vqa(split):
        facts = {f["kind"]: f["value"] for f in it.facts}
        if "colour" in facts and "shape" in facts:
            items.append((it, facts["colour"], facts["shape"]))
    rng.shuffle(items)
    out = []
    for it, color, shape in items[:n]:
        questions = [_mc(q["question"], q["answer"], rng, k) for k, q in enumerate(it.qa)]
        out.append({
            "id": it.id, "image": it.image, "benchmark": "easy-vqa",
            "reference": f"A {color} {shape} on a plain background.", "questions": questions,
        })
    return out


def _mc(question: str, answer: str, rng: random.Random, k: int) -> dict[str, Any]:
    if answer in ("yes", "no"):
        options = ["yes", "no"]
    elif answer in SHAPES:
        options = list(SHAPES)
    else:
        options = [answer, *rng.sample([c for c in COLORS if c != answer], 3)]
        rng.shuffle(options)
    return {"question": question, "options": options, "answer": answer, "qid": str(k)}


def offline_items(n: int = 12, seed: int = 0) -> list[dict[str, Any]]:
    """The offline image items every image protocol defaults to: ``{id, image, reference, questions,
    benchmark}``: easy-vqa images and synthetic scenes (which also carry a rubric)."""
    items = easy_vqa_items(n, seed)
    items.extend(_scene_items(n, seed))
    return items


def _scene_items(n: int, seed: int) -> list[dict[str, Any]]:
    """Synthetic scenes: known facts, reference caption, exact QA and the rubric built from the facts."""
    from captionrl.domains.scenes import generate_scenes, rubric_from_facts

    return [{"id": sc.id, "image": sc.render(), "benchmark": "scenes", "reference": sc.reference_caption,
             "questions": list(sc.qa), "contradicting": sc.contradicting_caption,
             "rubric": [r.to_dict() for r in rubric_from_facts(sc)]} for sc in generate_scenes(n, seed)]


def demo_systems(items: Sequence[Mapping[str, Any]]) -> Systems:
    """Systems of known quality built from offline items, for runs without caption files.

    ``reference`` (the item's reference caption), ``other_item`` (the next different reference: fluent
    but wrong), ``generic`` (generic image words) and ``empty``: a working judge must order them
    reference > other_item/generic > empty, which makes the default run a check of the judge itself.
    """
    from captionrl.probes import GENERIC_WORDS, other_text

    systems: Systems = {"reference": {}, "other_item": {}, "generic": {}, "empty": {}}
    refs = [it["reference"] for it in items]
    for i, it in enumerate(items):
        base = {k: it[k] for k in ("id", "reference", "image", "benchmark") if k in it}
        captions = {
            "reference": it["reference"],
            "other_item": other_text(refs, i),
            "generic": GENERIC_WORDS,
            "empty": "",
        }
        for name, cap in captions.items():
            systems[name][str(it["id"])] = {**base, "caption": cap}
    return systems


def systems_for(caption_files: Sequence[str], demo_items: int, seed: int) -> Systems:
    """The systems of an image-caption evaluation: the user's caption files, or the offline demo systems."""
    if caption_files:
        return load_systems(caption_files)
    return demo_systems(offline_items(demo_items, seed=seed))


# ---------------------------------------------------------------------- backends
def backend_from_spec(spec: str) -> Any:
    """The backend a spec string names (``hf:embedded``, ``openai:URL#MODEL``, ``hf:x,dtype=bfloat16``); an
    identification verifier may also be ``claims:rules`` (code-checked claims, no model)."""
    from captionrl.judges.claims_verifier import is_claims_spec, parse_claims_spec

    if is_claims_spec(spec):
        return parse_claims_spec(spec)
    from captionrl.backends import backend_from_spec as build

    return build(spec)


def check_spec(field: str, spec: str, *, claims: bool = False) -> None:
    """Validate a backend spec when a config is built (milliseconds, before any model loads); ``claims``:
    the field names an identification verifier, which may also be ``claims:rules``."""
    from captionrl.backends import parse_backend_spec
    from captionrl.judges.claims_verifier import is_claims_spec, parse_claims_spec

    if claims and is_claims_spec(spec):
        parse_claims_spec(spec, field)
        return

    try:
        parse_backend_spec(spec)
    except ConfigError as exc:
        raise ConfigError(field, spec, f"is not a backend spec ({exc})",
                          "write e.g. hf:embedded, hf:embedded,dtype=bfloat16 or openai:http://HOST:PORT/v1#MODEL") from exc


class LazyBackend:
    """Build the backend only when something first needs it (an n-gram reward, say, needs none)."""

    def __init__(self, spec: str) -> None:
        self._spec = spec
        self._backend: Any = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if self._backend is None:
            self._backend = backend_from_spec(self._spec)
        return getattr(self._backend, name)


@dataclass
class JudgedCaptionsConfig:
    """Settings every judge-over-caption-files protocol shares (pairwise, ranking): which systems, where the
    results go, the judge and how it sees the item. Subclasses set ``MODES`` and their own defaults."""

    MODES: ClassVar[tuple[str, ...]] = ("choose", "generate")

    captions: list[str] = help_field([], "caption files, one per system (JSONL {id, caption, reference?, image?, benchmark?}); empty: demo systems on offline data")
    out: str = help_field("runs/eval", "output folder (rerun with the same folder to resume)")
    mode: str = help_field("choose", "how the judge answers (see the protocol)")
    evidence: str = help_field("reference", "reference (text-only judge reads the reference caption) or image (VLM judge)")
    seed: int = help_field(0, "seed of the demo data selection (and of any shuffles)")
    limit: int | None = help_field(None, "judge at most this many items")
    demo_items: int = help_field(12, "items of the offline demo data when no caption files are given")
    batch: int = help_field(16, "items per judge call")
    judge: str = help_field("hf:embedded", "judge backend spec: hf:embedded, hf:PATH, openai:URL#MODEL, vllm:MODEL (+ ,key=value)")

    def __post_init__(self) -> None:
        if self.mode not in self.MODES:
            raise ConfigError("mode", self.mode, "unknown mode", f"use {' or '.join(self.MODES)}")
        if self.evidence not in ("reference", "image"):
            raise ConfigError("evidence", self.evidence, "unknown evidence", "use reference or image")
        if self.batch < 1:
            raise ConfigError("batch", self.batch, "must be at least 1", f"set batch={type(self).batch}")
        check_spec("judge", self.judge)
