"""``captionrl moco records``: the caption, rubric and judgment records of MoCo Rubric's shared multi-role SFT.

The paper (§3.2) trains one model on *sample-aligned* records: captions of an image, a rubric written
from that image, its two references and a subset of those captions, and the judgments of each caption
against that rubric. This command asks teacher backends for all three, in three resumable stages:

1. **captions**: every caption teacher writes ``samples`` captions per image with the Policy prompt
   (A.1.1; ``judges.roles.policy_messages``). Caption id ``<image>|<teacher>|<k>``.
2. **rubrics**: the rubric writer gets the Generator prompt (A.1.2; ``judges.roles.generator_messages``)
   with the image, the two references and a seeded subset of ``n_candidates`` of the image's captions,
   and its reply is parsed by the very parser the RL recipe uses (``parse_generator_reply``).
3. **judgments**: the judge teacher gets the Judge prompt (A.1.3; ``judges.roles.judge_messages``) for
   every caption of the image and must return one yes/no decision per rubric item
   (``judges.rubric.parse_judge_reply``).

Output (``out_dir``): ``captions.jsonl``, ``rubrics.jsonl``, ``judgments.jsonl`` in exactly the format
``captionrl train moco-sft`` reads (``data.captions/rubrics/judgments``); ``images/`` (in-memory images,
e.g. scenes, saved as PNG so the records point at files); ``rejected.jsonl`` (every malformed or failed
teacher reply, with its raw text and the parse error: a recorded, counted skip, never a silent drop);
``summary.json`` (counts per stage, rejections, skipped images). Rerunning with the same ``out_dir``
skips every record already written (by its key) and retries what was rejected.

Images come from the ``data`` section shared with ``train moco`` (``MocoDataConfig``): the same images,
with the same two references, that the RL stage trains on. An image without two references is skipped
and recorded (the Generator prompt needs two).

``image_text: references`` lets language-only teachers (e.g. a text LLM behind an OpenAI-compatible
server) stand in for VLM teachers: the image is replaced by a text rendering (its reference captions),
and the records carry that ``image_text`` so ``moco-sft`` can train a language-only model on them too.
``structured_output`` asks servers that support it (llama.cpp, vLLM) to constrain the writer's and the
judge's replies to their JSON schemas; in-process (``hf``) teachers always decode under those schemas
(``backends.structured``); replies are schema-checked either way.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from captionrl.backends.base import ChatRequest
from captionrl.config import help_field
from captionrl.errors import ConfigError, DataError
from captionrl.judges.online_rubric import generator_request_messages, parse_generator_reply, stable_int
from captionrl.judges.roles import (
    STRUCTURED_OUTPUTS,
    judge_messages,
    judgment_schema,
    policy_messages,
    rubric_schema,
    structured,
)
from captionrl.judges.rubric import parse_judge_reply
from captionrl.judges.rubric_build import RubricWriterSettings
from captionrl.records import RecordWriter, write_json
from captionrl.train.moco import MocoDataConfig

IMAGE_TEXT = ("none", "references")


@dataclass
class MocoRecordsConfig(RubricWriterSettings):
    """Teachers, rubric writer and judge that write the shared multi-role SFT records. The writer's attempts,
    retry temperature and rubric size are every rubric writer's (``RubricWriterSettings``); the judge teacher
    takes the same attempts at the same retry temperature."""

    seed: int = help_field(0, "seed of caption sampling, candidate subsets and sampled retries (all recorded)")
    out_dir: str = help_field("runs/records", "output folder: captions, rubrics, judgments for train moco-sft; rerun to resume")
    check: bool = help_field(False, "validate the config and the images, print what would be asked, call no model")
    data: MocoDataConfig = field(default_factory=MocoDataConfig, metadata={"help": "images and their two references (the data section of train moco)"})
    teachers: list[dict[str, Any]] = help_field([], "caption teachers: BackendConfig mappings, e.g. [{kind: openai, model: Qwen3-VL-235B-A22B-Instruct, base_url: http://HOST:8001/v1}]")
    writer: dict[str, Any] | None = help_field(None, "the rubric writer (Generator teacher): a BackendConfig mapping")
    judge: dict[str, Any] | None = help_field(None, "the judge teacher (text only; null = the writer)")
    samples: int = help_field(2, "captions per teacher per image")
    temperature: float = help_field(1.0, "caption sampling temperature (> 0 gives varied candidates; seeds recorded)")
    n_candidates: int = help_field(4, "captions of the image shown to the writer (a seeded subset; the paper: 4)")
    caption_max_new_tokens: int = help_field(512, "longest teacher caption")
    writer_max_new_tokens: int = help_field(1024, "longest rubric reply")
    judge_max_new_tokens: int = help_field(1024, "longest judgment reply")
    image_text: str = help_field("none", "none (teachers see the image) or references (language-only teachers read the reference captions instead; recorded as image_text)")
    structured_output: str = help_field("none", "constrain writer and judge replies to their JSON schema: none, json_schema (OpenAI/vLLM) or json_object (llama.cpp)")

    def __post_init__(self) -> None:
        from captionrl.train.run.sections import backend_config

        super().__post_init__()
        if not self.teachers:
            raise ConfigError("teachers", self.teachers, "needs at least one caption teacher",
                              "list them, e.g. [{kind: openai, model: MODEL, base_url: http://HOST:8001/v1}]")
        for i, b in enumerate(self.teachers):
            backend_config(b, f"teachers[{i}]")
        if not self.writer:
            raise ConfigError("writer", self.writer, "the rubric writer is missing", "set writer: {kind: openai, model: ..., base_url: ...}")
        backend_config(self.writer, "writer")
        if self.judge is not None:
            backend_config(self.judge, "judge")
        for name in ("samples", "n_candidates"):
            if getattr(self, name) < 1:
                raise ConfigError(name, getattr(self, name), "must be >= 1", f"set {name}: 2")
        if self.image_text not in IMAGE_TEXT:
            raise ConfigError("image_text", self.image_text, "unknown choice", "use none or references")
        if self.structured_output not in STRUCTURED_OUTPUTS:
            raise ConfigError("structured_output", self.structured_output, "unknown style", f"use one of {', '.join(STRUCTURED_OUTPUTS)}")


# ---------------------------------------------------------------------- images
@dataclass
class RecordImage:
    """One image as the records see it: id, file path, two references, optional text rendering."""

    id: str
    path: str
    references: list[str]
    image_text: str | None = None
    _pil: Any = None

    def load(self) -> Any:
        from captionrl.domains.images import decode_image

        if self._pil is None:
            self._pil = decode_image(self.path, self.id)
        return self._pil


def load_items(cfg: MocoDataConfig, seed: int = 0) -> tuple[list[Any], list[dict[str, Any]]]:
    """The data section's ``ImageItem``s (two references each) and the images its loader left out.

    Uses the shared image loader (``domains.image_data.load_image_items``: scenes, easy-vqa, PixMoCap,
    DenseFusion, COCO, manifests, validated, skips recorded) where this version has it, exactly as
    ``train moco`` does; otherwise the offline scenes (reference + a paraphrase as the two references)."""
    try:
        from captionrl.domains.image_data import load_image_items
    except ImportError:
        load_image_items = None
    if load_image_items is not None:
        loaded = load_image_items(cfg, seed=seed)
        return list(loaded.items), list(loaded.skipped)
    from captionrl.domains import images
    from captionrl.domains.scenes import generate_scenes, second_reference

    if cfg.source != "scenes":
        raise ConfigError("data.source", cfg.source, "no loader for this image source in this version", "use scenes")
    out = []
    for scene in generate_scenes(cfg.n_train, cfg.scene_seed, size=cfg.image_size, max_groups=cfg.max_groups,
                                 text_prob=cfg.text_prob):
        item = images.scene_item(scene)
        out.append(images.ImageItem(item.id, item.image, (scene.reference_caption, second_reference(scene)),
                                    item.qa, item.facts, item.source, item.meta))
    return out, []


def prepare_images(items: Sequence[Any], out: Path, image_text: str) -> tuple[list[RecordImage], list[dict[str, Any]]]:
    """Records' view of the items: in-memory images saved under ``out/images``; items without two
    references are returned as skips (``{"item", "reason"}``), never dropped silently."""
    ready, skipped = [], []
    for it in items:
        refs = [str(r) for r in it.references if str(r).strip()]
        if len(refs) < 2:
            skipped.append({"item": str(it.id), "reason": f"has {len(refs)} reference caption(s); the Generator prompt needs 2"})
            continue
        if isinstance(it.image, (str, Path)):
            path = str(Path(it.image).resolve())
        else:
            img_dir = out / "images"
            img_dir.mkdir(parents=True, exist_ok=True)
            path = str((img_dir / f"{_safe(str(it.id))}.png").resolve())
            if not Path(path).is_file():
                it.load().save(path)
        text = " ".join(refs[:2]) if image_text == "references" else None
        ready.append(RecordImage(str(it.id), path, refs[:2], text))
    return ready, skipped


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


# ---------------------------------------------------------------------- the three stages
class RecordsBuilder:
    """Runs the three stages against given backends, appending to the JSONL files in ``out``."""

    def __init__(self, cfg: MocoRecordsConfig, teachers: Sequence[Any], writer: Any, judge: Any, out: Path,
                 teacher_names: Sequence[str] | None = None) -> None:
        self.cfg, self.teachers, self.writer, self.judge, self.out = cfg, list(teachers), writer, judge, out
        # caption ids use the teacher's model name, not its URL: a server moved to another port resumes
        self.names = list(teacher_names or [t.name for t in teachers])
        self.captions = RecordWriter(out / "captions.jsonl")
        self.rubrics = RecordWriter(out / "rubrics.jsonl")
        self.judgments = RecordWriter(out / "judgments.jsonl")
        self.rejected = RecordWriter(out / "rejected.jsonl")
        self.new: Counter[str] = Counter()
        self.rejects: Counter[str] = Counter()

    def close(self) -> None:
        for w in (self.captions, self.rubrics, self.judgments, self.rejected):
            w.close()

    def _with_image(self) -> bool:
        return self.cfg.image_text == "none"

    def reject(self, role: str, record_id: str, **info: Any) -> None:
        """A failed or malformed teacher reply: kept with its raw text and errors, counted, retried next run."""
        n = sum(1 for k in self.rejected.done_keys if k.startswith(f"{role}|{record_id}|"))
        self.rejected.write({"key": f"{role}|{record_id}|{n}", "role": role, "id": record_id, **info})
        self.rejects[role] += 1

    # -- 1. captions
    def caption_stage(self, images: Sequence[RecordImage]) -> None:
        from captionrl.domains.images import with_image

        cfg = self.cfg
        for teacher, tname in zip(self.teachers, self.names, strict=True):
            todo = [(im, k) for im in images for k in range(cfg.samples)
                    if not self.captions.has(f"{im.id}|{tname}|{k}")]
            for start in range(0, len(todo), 8):
                chunk = todo[start: start + 8]
                reqs = []
                for im, k in chunk:
                    msgs = policy_messages(image_text=im.image_text, with_images=self._with_image())
                    if self._with_image():
                        msgs = with_image(msgs, im.load())
                    seed = stable_int(f"{cfg.seed}|{im.id}|{tname}|{k}")
                    reqs.append(ChatRequest(msgs, max_new_tokens=cfg.caption_max_new_tokens,
                                            temperature=cfg.temperature, seed=seed))
                for (im, k), req, gen in zip(chunk, reqs, teacher.generate(reqs), strict=True):
                    cid = f"{im.id}|{tname}|{k}"
                    text = (gen.text or "").strip()
                    if not text:
                        self.reject("caption", cid, image_id=im.id, teacher=tname, raw=gen.text,
                                    errors=[gen.error or "empty caption"])
                        continue
                    self.captions.write({"key": cid, "image_id": im.id, "caption_id": cid, "caption": text,
                                         "image": im.path, **({"image_text": im.image_text} if im.image_text else {}),
                                         "teacher": tname, "backend": teacher.name, "sample": k, "seed": req.seed,
                                         "temperature": cfg.temperature})
                    self.new["captions"] += 1

    def _captions_of(self, image_id: str) -> list[dict[str, Any]]:
        return sorted((r for r in self.captions.records() if str(r["image_id"]) == image_id), key=lambda r: r["caption_id"])

    # -- 2. rubrics
    def rubric_stage(self, images: Sequence[RecordImage]) -> None:
        cfg = self.cfg
        todo = []
        for im in images:
            if self.rubrics.has(im.id):
                continue
            caps = self._captions_of(im.id)
            if not caps:
                self.reject("rubric", im.id, image_id=im.id, raw=None, errors=["no caption of this image was written"])
                continue
            rng = random.Random(stable_int(f"{cfg.seed}|{im.id}|subset"))
            subset = sorted(rng.sample(range(len(caps)), min(cfg.n_candidates, len(caps))))
            cand = [caps[i] for i in subset]
            msgs = generator_request_messages(im.references, [c["caption"] for c in cand],
                                              im.load() if self._with_image() else None, im.image_text,
                                              with_image=self._with_image())
            todo.append((im, cand, msgs))
        fmt = structured(rubric_schema(cfg.min_items, cfg.max_items), cfg.structured_output)
        for start in range(0, len(todo), 8):
            chunk = todo[start: start + 8]
            results = self._attempts(
                self.writer, [m for _, _, m in chunk], cfg.writer_max_new_tokens, [fmt] * len(chunk),
                [stable_int(f"{cfg.seed}|{im.id}|rubric") for im, _, _ in chunk],
                lambda text, _i: parse_generator_reply(text, cfg.min_items, cfg.max_items))
            for (im, cand, _), (parsed, raws, errors) in zip(chunk, results, strict=True):
                if parsed is None:
                    self.reject("rubric", im.id, image_id=im.id, raws=raws, errors=errors,
                                candidate_ids=[c["caption_id"] for c in cand])
                    continue
                self.rubrics.write({"key": im.id, "image_id": im.id, "rubric_id": im.id, "references": im.references,
                                    "candidate_ids": [c["caption_id"] for c in cand],
                                    "rubric": [r.to_dict() for r in parsed], "image": im.path,
                                    **({"image_text": im.image_text} if im.image_text else {}),
                                    "writer": self.writer.name, "attempts": len(raws), "raws": raws})
                self.new["rubrics"] += 1

    # -- 3. judgments
    def judgment_stage(self, images: Sequence[RecordImage]) -> None:
        cfg = self.cfg
        todo = []
        for im in images:
            rub = self.rubrics.get(im.id)
            if rub is None:
                continue
            for cap in self._captions_of(im.id):
                key = f"{im.id}|{cap['caption_id']}"
                if not self.judgments.has(key):
                    todo.append((key, im, cap, rub["rubric"]))
        for start in range(0, len(todo), 8):
            chunk = todo[start: start + 8]
            sizes = [len(r) for *_, r in chunk]
            results = self._attempts(
                self.judge, [judge_messages(r, c["caption"]) for _, _, c, r in chunk], cfg.judge_max_new_tokens,
                [structured(judgment_schema(n), cfg.structured_output) for n in sizes],
                [stable_int(f"{cfg.seed}|{k}|judge") for k, *_ in chunk],
                lambda text, i, sizes=sizes: parse_judge_reply(text, sizes[i]))
            for (key, im, cap, _), (parsed, raws, errors) in zip(chunk, results, strict=True):
                if parsed is None:
                    self.reject("judgment", key, image_id=im.id, caption_id=cap["caption_id"], raws=raws, errors=errors)
                    continue
                decisions, reasons = parsed
                self.judgments.write({"key": key, "image_id": im.id, "caption_id": cap["caption_id"], "rubric_id": im.id,
                                      "decisions": [{"reason": r, "decision": "yes" if d else "no"}
                                                    for d, r in zip(decisions, reasons, strict=True)],
                                      "judge": self.judge.name, "attempts": len(raws)})
                self.new["judgments"] += 1

    def _attempts(self, backend: Any, messages: Sequence[Any], max_new_tokens: int, formats: Sequence[dict[str, Any]],
                  seeds: Sequence[int], parse: Any) -> list[tuple[Any, list[str | None], list[str]]]:
        """Attempt 1 greedy, retries sampled with recorded seeds, batched over what is still unparsed;
        returns (parsed or None, raw replies, errors) per prompt."""
        cfg = self.cfg
        parsed: list[Any] = [None] * len(messages)
        raws: list[list[str | None]] = [[] for _ in messages]
        errors: list[list[str]] = [[] for _ in messages]
        pending = list(range(len(messages)))
        for attempt in range(cfg.max_attempts):
            if not pending:
                break
            temp = 0.0 if attempt == 0 else cfg.retry_temperature
            reqs = [ChatRequest(messages[i], max_new_tokens=max_new_tokens, temperature=temp,
                                seed=seeds[i] + attempt, **formats[i]) for i in pending]
            still = []
            for i, gen in zip(pending, backend.generate(reqs), strict=True):
                raws[i].append(gen.text)
                if gen.text is None:
                    errors[i].append(f"attempt {attempt + 1}: backend error: {gen.error}")
                    still.append(i)
                    continue
                try:
                    parsed[i] = parse(gen.text, i)
                except (DataError, ValueError) as exc:
                    errors[i].append(f"attempt {attempt + 1}: {' '.join(str(exc).split())}")
                    still.append(i)
            pending = still
        return [(parsed[i], raws[i], errors[i]) for i in range(len(messages))]

    def summary(self, images: Sequence[RecordImage], skipped: Sequence[dict[str, Any]]) -> dict[str, Any]:
        by_role = Counter(str(r.get("role")) for r in self.rejected.records())
        return {
            "images": len(images), "skipped_images": list(skipped),
            "records": {"captions": len(self.captions.records()), "rubrics": len(self.rubrics.records()),
                        "judgments": len(self.judgments.records())},
            "written_this_run": dict(self.new), "rejected_this_run": dict(self.rejects),
            "rejected_total": dict(by_role),
            "teachers": self.names, "writer": self.writer.name, "judge": self.judge.name,
            "files": {"captions": str(self.captions.path), "rubrics": str(self.rubrics.path),
                      "judgments": str(self.judgments.path), "rejected": str(self.rejected.path)},
        }


def build_records(cfg: MocoRecordsConfig, teachers: Sequence[Any] | None = None, writer: Any = None,
                  judge: Any = None) -> dict[str, Any]:
    """Items -> captions -> rubrics -> judgments in ``cfg.out_dir``; returns (and writes) the summary.
    Backends default to the config's; tests may pass their own."""
    from captionrl.backends import make_backend
    from captionrl.train.run.sections import backend_config

    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    items, left_out = load_items(cfg.data, cfg.seed)
    images, skipped = prepare_images(items, out, cfg.image_text)
    skipped = left_out + skipped
    if not images:
        raise DataError("data", cfg.data.source, "no image has two references", "give each image two reference captions")
    names = None
    if teachers is None:
        confs = [backend_config(b, f"teachers[{i}]") for i, b in enumerate(cfg.teachers)]
        teachers = [make_backend(c) for c in confs]
        names = [c.model for c in confs]
    names = names or [t.name for t in teachers]
    if len(set(names)) != len(names):
        raise ConfigError("teachers", names, "two teachers have the same name (caption ids would collide)",
                          "serve each teacher under its own model name")
    writer = writer or make_backend(backend_config(cfg.writer, "writer"))
    judge = judge or (make_backend(backend_config(cfg.judge, "judge")) if cfg.judge else writer)
    builder = RecordsBuilder(cfg, teachers, writer, judge, out, names)
    try:
        builder.caption_stage(images)
        builder.rubric_stage(images)
        builder.judgment_stage(images)
        summary = builder.summary(images, skipped)
    finally:
        builder.close()
    write_json(out / "summary.json", summary)
    return summary


# ---------------------------------------------------------------------- command
CONFIG = MocoRecordsConfig


def run_command(cfg: MocoRecordsConfig) -> int:
    """``captionrl moco records``: write (or, with ``check``, only validate) the multi-role SFT records."""
    if cfg.check:
        items, left_out = load_items(cfg.data, cfg.seed)
        images, skipped = prepare_images(items, Path(cfg.out_dir), cfg.image_text)
        print(json.dumps({"images": len(images), "skipped_images": len(left_out) + len(skipped), "teachers": len(cfg.teachers),
                          "captions_to_ask": len(images) * len(cfg.teachers) * cfg.samples}))
        return 0
    s = build_records(cfg)
    print(json.dumps({"records": s["records"], "rejected_this_run": s["rejected_this_run"],
                      "skipped_images": len(s["skipped_images"])}))
    out = Path(cfg.out_dir)
    print(f"train on them: captionrl train moco-sft data.captions={out / 'captions.jsonl'} "
          f"data.rubrics={out / 'rubrics.jsonl'} data.judgments={out / 'judgments.jsonl'}")
    return 0
