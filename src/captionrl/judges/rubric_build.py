"""Building RubiCap rubrics offline: teacher committee -> rubric writer -> rubric store (``captionrl rubrics build``).

N teacher backends caption each image (``committee_captions``, resumable JSONL); a rubric writer (LLM or
VLM) reads the committee's captions and the student's current captions, keeps the facts the teachers agree
on, targets the student's deficiencies, and emits weighted binary rubric items as JSON (``RubricWriter``).
Replies are schema-checked (``captionrl.judges.rubric.validate_rubric``); an invalid reply is retried up to
``max_attempts`` times, then the item is recorded as *unscored* (rubric ``None``), never as an empty
rubric. Judging captions against the stored rubrics lives in ``captionrl.judges.rubric``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from captionrl.backends.base import Backend, ChatRequest
from captionrl.config import help_field
from captionrl.domains.captioning import IMAGE_CAPTION_INSTRUCTION
from captionrl.domains.scenes import rubric_from_facts
from captionrl.errors import ConfigError, DataError
from captionrl.judges import prompts as P
from captionrl.judges.roles import rubric_schema, structured
from captionrl.judges.rubric import RubricItem, RubricStore, parse_rubric_reply
from captionrl.records import RecordWriter, write_json


# ====================================================================== teacher committee
def caption_messages(image: Any, instruction: str = IMAGE_CAPTION_INSTRUCTION,
                     image_text: str | None = None) -> list[dict[str, Any]]:
    """The caption request for one image (MoCo Rubric A.1.1 style), image part first; with ``image_text``
    a text-only request in which that text stands in for the image (language-only teachers)."""
    if image_text is not None:
        return [{"role": "user", "content": f"Image (described in text): {image_text}\n\n{instruction}"}]
    return [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": instruction}]}]


IMAGE_TEXT = ("none", "references")


def image_text_of(item: Any, image_text: str) -> str | None:
    """The text that stands in for ``item``'s image (``references``: its reference captions), or None."""
    if image_text == "none":
        return None
    refs = [str(r) for r in getattr(item, "references", ()) if str(r).strip()]
    if not refs:
        raise DataError(f"item[{item.id}].references", [], "image_text=references needs reference captions",
                        "give the item references, or let VLM teachers see the image (image_text: none)")
    return " ".join(refs)


def committee_captions(
    items: Sequence[Any],
    teachers: Sequence[Backend],
    out_path: str | Path,
    *,
    instruction: str = IMAGE_CAPTION_INSTRUCTION,
    samples: int = 1,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    seed: int = 0,
    progress: bool = True,
    image_text: str = "none",
) -> dict[str, list[str]]:
    """Caption every item with every teacher; JSONL records keyed ``item|teacher|k``, resumable.

    A failed generation is recorded with ``caption: null`` and its error, and retried on the next run.
    ``image_text="references"``: language-only teachers read the item's references instead of the image.
    Returns item id -> the successful captions (all teachers, in teacher order).
    """
    from tqdm.auto import tqdm

    if samples < 1:
        raise ConfigError("samples", samples, "must be >= 1", "set samples to 1 or more")
    if not teachers:
        raise ConfigError("committee", [], "needs at least one teacher backend", "pass --committee SPEC [SPEC ...]")
    with RecordWriter(out_path) as w:
        todo = [(it, t, k) for it in items for t in teachers for k in range(samples)
                if not _done(w, f"{it.id}|{t.name}|{k}")]
        bar = tqdm(total=len(todo), desc="committee captions", disable=not progress)
        for teacher in teachers:
            mine = [(it, k) for it, t, k in todo if t is teacher]
            for start in range(0, len(mine), 8):
                chunk = mine[start : start + 8]
                reqs = [ChatRequest(caption_messages(None if image_text != "none" else it.load(), instruction,
                                                     image_text_of(it, image_text)), max_new_tokens=max_new_tokens,
                                    temperature=temperature, seed=None if temperature == 0 else seed + k)
                        for it, k in chunk]
                for (it, k), gen in zip(chunk, teacher.generate(reqs), strict=True):
                    w.write({"key": f"{it.id}|{teacher.name}|{k}", "item_id": it.id, "teacher": teacher.name,
                             "sample": k, "caption": gen.text, "error": gen.error, "instruction": instruction,
                             "temperature": temperature, "seed": seed + k})
                bar.update(len(chunk))
        bar.close()
        return _captions_by_item(w.records())


def _done(w: RecordWriter, key: str) -> bool:
    rec = w.get(key)
    return rec is not None and bool(str(rec.get("caption") or "").strip())


TEACHER_FAILURE_POLICIES = ("error", "warn")


class TeacherFailureError(DataError):
    """A committee teacher failed on more than the allowed share of the items: the rubrics would be written
    from fewer teachers than the committee names."""


def teacher_failures(path: str | Path, items: Sequence[Any], teachers: Sequence[Backend]) -> dict[str, tuple[int, str]]:
    """Teacher name -> (items without a caption from it, the last error) over ``items``, from the committee's
    JSONL records. A record with no caption, an empty one (a reasoning model that spent its whole token limit
    thinking returns empty content) or no record at all counts as a failure."""
    got: dict[tuple[str, str], Mapping[str, Any]] = {}
    with RecordWriter(path) as w:
        for r in w.records():
            key = (str(r.get("item_id")), str(r.get("teacher")))
            if key not in got or str(r.get("caption") or "").strip():
                got[key] = r
    out: dict[str, tuple[int, str]] = {}
    for t in teachers:
        failed, last = 0, ""
        for it in items:
            rec = got.get((str(it.id), t.name))
            if rec is None or not str(rec.get("caption") or "").strip():
                failed += 1
                last = str((rec or {}).get("error") or "empty caption") if rec is not None else "no record"
        out[t.name] = (failed, last)
    return out


def check_teacher_failures(failures: Mapping[str, tuple[int, str]], n_items: int, *, max_share: float,
                           policy: str = "error", field: str = "max_teacher_failure_share") -> list[str]:
    """Stop (``policy='error'``, ``TeacherFailureError``) or warn loudly (``'warn'``: logged and returned)
    when any teacher failed on more than ``max_share`` of the ``n_items`` items; returns the warnings."""
    if n_items == 0:
        return []
    bad = [(name, failed, last) for name, (failed, last) in failures.items() if failed / n_items > max_share]
    if not bad:
        return []
    what = "; ".join(f"{name} failed on {failed} of {n_items} items ({failed / n_items:.0%}), last error: {last[:200]}"
                     for name, failed, last in bad)
    fix = (f"fix the teacher (its key, quota, token limit: a reasoning model needs max_completion_tokens and a "
           f"reasoning budget, docs/backends.md), then rerun: the build resumes and retries only the failed captions; "
           f"or raise {field} (now {max_share:g}) to build from fewer teachers")
    if policy == "error":
        raise TeacherFailureError(field, max_share, f"the committee is short of a teacher: {what}", fix)
    import logging

    message = f"WARNING: rubrics built from an incomplete committee: {what}. Fix: {fix}"
    logging.getLogger(__name__).warning(message)  # the CLI's log handler prints it; summary.json keeps it
    return [message]


def _captions_by_item(records: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r in records:
        if r.get("caption"):
            out.setdefault(str(r["item_id"]), []).append(str(r["caption"]))
    return out


# ====================================================================== rubric writer
@dataclass
class RubricWriterSettings:
    """How a rubric writer is asked and checked, declared once for every model that writes rubrics: RubiCap's
    offline writer (``train rubicap``'s ``rubrics`` section, ``captionrl rubrics build``), MoCo's online
    Generator (``train moco``'s ``rubric`` section) and the records' writer teacher (``moco records``, whose
    judge teacher takes the same attempts). ``FIELD_PREFIX`` is the config section that holds them, so errors
    name the key a user writes.

    ``max_attempts`` is 3 everywhere: neither paper states a retry count, an attempt after the first is paid
    only when the one before it failed, and a rubric given up costs far more than a retry (RubiCap: the item
    leaves training; MoCo online: the group's G captions are unscored; records: the record is lost). The
    paper presets already asked for 3; the online Generator and the records had defaulted to 2.
    """

    FIELD_PREFIX: ClassVar[str] = ""

    max_attempts: int = help_field(3, "attempts at a valid rubric before it is given up (recorded unscored): attempt 1 greedy (MoCo's Generator: at rubric.temperature), retries sampled at retry_temperature with recorded seeds")
    retry_temperature: float = help_field(0.7, "sampling temperature of the retries (their seeds are recorded)")
    min_items: int = help_field(3, "fewest rubric items a valid rubric has")
    max_items: int = help_field(10, "most rubric items a valid rubric has")

    def __post_init__(self) -> None:
        def key(name: str) -> str:
            return f"{self.FIELD_PREFIX}.{name}" if self.FIELD_PREFIX else name

        if self.max_attempts < 1:
            raise ConfigError(key("max_attempts"), self.max_attempts, "must be >= 1", f"set {key('max_attempts')}: 3")
        if self.retry_temperature < 0:
            raise ConfigError(key("retry_temperature"), self.retry_temperature, "must be >= 0",
                              f"set {key('retry_temperature')}: 0.7")
        if not 1 <= self.min_items <= self.max_items:
            raise ConfigError(key("min_items"), self.min_items, f"must be 1..{key('max_items')} ({self.max_items})",
                              f"set {key('min_items')} <= {key('max_items')}")


@dataclass
class RubricResult:
    """What the writer produced for one item: a rubric, or ``None`` with the errors of every attempt."""

    rubric: list[RubricItem] | None
    attempts: int
    raws: list[str | None] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    prompt: str = ""


class RubricWriter:
    """Turns committee captions (+ the student's captions) into a validated rubric with an LLM/VLM.

    Attempt 1 is greedy; retries sample at ``retry_temperature`` with seeds ``seed + attempt`` (recorded),
    so a retry can produce a different, valid reply. ``with_image`` shows the image too (VLM writers).
    ``settings`` (``RubricWriterSettings``) holds the attempts and the rubric's size; the keywords of the same
    names override them one by one.
    """

    def __init__(
        self,
        backend: Backend,
        settings: RubricWriterSettings | None = None,
        *,
        max_new_tokens: int = 768,
        seed: int = 0,
        with_image: bool = False,
        structured_output: str = "none",
        **overrides: Any,
    ) -> None:
        unknown = set(overrides) - {f.name for f in dataclasses.fields(RubricWriterSettings)}
        if unknown:
            raise TypeError(f"RubricWriter got unexpected keyword(s) {sorted(unknown)}")
        base = settings if settings is not None else RubricWriterSettings()
        given = {f.name: getattr(base, f.name) for f in dataclasses.fields(RubricWriterSettings)}
        self.settings = RubricWriterSettings(**{**given, **overrides})  # validated once, by the dataclass
        self.backend = backend
        self.max_attempts = self.settings.max_attempts
        self.max_new_tokens = max_new_tokens
        self.retry_temperature = self.settings.retry_temperature
        self.seed = seed
        self.min_items = self.settings.min_items
        self.max_items = self.settings.max_items
        self.with_image = with_image
        self.structured = structured(rubric_schema(self.min_items, self.max_items), structured_output)
        """The request keywords that constrain the writer's reply to the rubric schema (server or in process)."""

    def prompt(self, teachers: Sequence[str], students: Sequence[str]) -> str:
        fmt = lambda cs: "\n".join(f"{i + 1}. {c.strip()}" for i, c in enumerate(cs)) or P.NO_STUDENT  # noqa: E731
        return P.WRITER_TEMPLATE.format(teachers=fmt(teachers), students=fmt(students),
                                        min_items=self.min_items, max_items=self.max_items)

    def write_batch(
        self, items: Sequence[Any], teachers: Sequence[Sequence[str]], students: Sequence[Sequence[str]]
    ) -> list[RubricResult]:
        """One rubric per item; attempts are batched across the items still lacking a valid rubric."""
        prompts = [self.prompt(t, s) for t, s in zip(teachers, students, strict=True)]
        results = [RubricResult(None, 0, prompt=p) for p in prompts]
        pending = [i for i, t in enumerate(teachers) if t]
        for i, t in enumerate(teachers):
            if not t:
                results[i].errors.append("no committee captions for this item")
        for attempt in range(self.max_attempts):
            if not pending:
                break
            temp = 0.0 if attempt == 0 else self.retry_temperature
            reqs = [ChatRequest(self._messages(items[i], prompts[i]), max_new_tokens=self.max_new_tokens,
                                temperature=temp, seed=self.seed + attempt, **self.structured)
                    for i in pending]
            still = []
            for i, gen in zip(pending, self.backend.generate(reqs), strict=True):
                res = results[i]
                res.attempts += 1
                res.raws.append(gen.text)
                if gen.text is None:
                    res.errors.append(f"attempt {attempt + 1}: backend error: {gen.error}")
                    still.append(i)
                    continue
                try:
                    rubric = parse_rubric_reply(gen.text, max_items=self.max_items)
                    if any(r.criterion == P.WRITER_EXAMPLE_CRITERION for r in rubric):
                        raise DataError("reply", P.WRITER_EXAMPLE_CRITERION, "copies the prompt's example item",
                                        "write criteria about this image's captions")
                    if len(rubric) < self.min_items:
                        raise DataError("reply", len(rubric), f"has fewer than {self.min_items} items",
                                        f"write at least {self.min_items} items")
                    res.rubric = rubric
                except (DataError, ValueError) as exc:
                    res.errors.append(f"attempt {attempt + 1}: {exc}")
                    still.append(i)
            pending = still
        return results

    def _messages(self, item: Any, prompt: str) -> list[dict[str, Any]]:
        content: Any = prompt
        if self.with_image:
            content = [{"type": "image", "image": item.load()}, {"type": "text", "text": prompt}]
        return [{"role": "system", "content": P.WRITER_SYSTEM}, {"role": "user", "content": content}]


def check_teacher_failure_policy(share: float, policy: str, prefix: str = "") -> None:
    """A teacher-failure share is a share, and the policy past it is ``error`` or ``warn`` (``prefix``: the config
    section holding them, e.g. ``rubrics.``, so errors name the key a user writes)."""
    if not 0 <= share <= 1:
        raise ConfigError(f"{prefix}max_teacher_failure_share", share, "must be a share between 0 and 1",
                          f"set {prefix}max_teacher_failure_share: 0.05")
    if policy not in TEACHER_FAILURE_POLICIES:
        raise ConfigError(f"{prefix}on_teacher_failure", policy, "unknown policy",
                          "use error (stop) or warn (build from fewer teachers, loudly)")


def build_rubrics(
    items: Sequence[Any],
    *,
    teachers: Sequence[Backend],
    writer: RubricWriter | None,
    out_dir: str | Path,
    student: Backend | None = None,
    instruction: str = IMAGE_CAPTION_INSTRUCTION,
    max_new_tokens: int = 256,
    seed: int = 0,
    progress: bool = True,
    image_text: str = "none",
    max_teacher_failure_share: float = 0.05,
    on_teacher_failure: str = "error",
    failure_field: str = "max_teacher_failure_share",
) -> dict[str, Any]:
    """Committee captions -> (student captions) -> rubrics, all JSONL in ``out_dir``; resumable.

    ``writer=None`` builds rubrics from the items' known facts (synthetic scenes) instead of a model.
    Writes ``committee.jsonl``, ``student.jsonl`` (if a student is given), ``rubrics.jsonl`` and
    ``summary.json``; returns the summary. A teacher without a caption for more than
    ``max_teacher_failure_share`` of the items stops the build before any rubric is written
    (``on_teacher_failure='error'``, ``TeacherFailureError``) or is reported loudly and in the summary
    (``'warn'``): the paper's rubrics come from the whole committee's consensus.
    """
    from tqdm.auto import tqdm

    check_teacher_failure_policy(max_teacher_failure_share, on_teacher_failure,
                                 failure_field.removesuffix("max_teacher_failure_share"))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    committee = committee_captions(items, teachers, out / "committee.jsonl", instruction=instruction,
                                   max_new_tokens=max_new_tokens, seed=seed, progress=progress,
                                   image_text=image_text) if teachers else {}
    failures = teacher_failures(out / "committee.jsonl", items, teachers) if teachers else {}
    warnings = check_teacher_failures(failures, len(items), max_share=max_teacher_failure_share,
                                      policy=on_teacher_failure, field=failure_field)
    students: dict[str, list[str]] = {}
    if student is not None:
        students = committee_captions(items, [student], out / "student.jsonl", instruction=instruction,
                                      max_new_tokens=max_new_tokens, seed=seed, progress=progress,
                                      image_text=image_text)
    store = RubricStore(out / "rubrics.jsonl")
    todo = [it for it in items if store.record(it.id) is None or store.record(it.id).get("rubric") is None]
    bar = tqdm(total=len(todo), desc="rubrics", disable=not progress)
    for start in range(0, len(todo), 8):
        chunk = todo[start : start + 8]
        if writer is None:
            for it in chunk:
                if not it.facts:
                    store.put(it.id, None, source="facts", error="item has no facts", attempts=0)
                else:
                    store.put(it.id, rubric_from_facts(it.facts), source="facts", error=None, attempts=0)
        else:
            results = writer.write_batch(chunk, [committee.get(it.id, []) for it in chunk],
                                         [students.get(it.id, []) for it in chunk])
            for it, res in zip(chunk, results, strict=True):
                store.put(it.id, res.rubric, source=f"writer:{writer.backend.name}", attempts=res.attempts,
                          error=None if res.rubric is not None else "; ".join(res.errors) or "no valid rubric",
                          raw=res.raws, prompt=res.prompt, seed=writer.seed)
        bar.update(len(chunk))
    bar.close()
    recs = [store.record(it.id) or {} for it in items]
    summary = {
        "protocol": "rubrics",
        "items": len(items),
        "rubrics": sum(r.get("rubric") is not None for r in recs),
        "unscored": sum(r.get("rubric") is None for r in recs),
        "mean_items": _mean([len(r["rubric"]) for r in recs if r.get("rubric")]),
        "committee": [t.name for t in teachers],
        "teacher_failures": {name: failed for name, (failed, _) in failures.items()},
        "warnings": warnings,
        "writer": writer.backend.name if writer else "facts",
        "student": student.name if student else None,
        "config": {"instruction": instruction, "max_new_tokens": max_new_tokens, "seed": seed,
                   "max_attempts": writer.max_attempts if writer else 0,
                   "max_teacher_failure_share": max_teacher_failure_share, "on_teacher_failure": on_teacher_failure},
    }
    write_json(out / "summary.json", summary)
    store.close()
    return summary


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


# ====================================================================== CLI: captionrl rubrics build
@dataclass(kw_only=True)
class RubricBuildConfig(RubricWriterSettings):
    """Settings of ``captionrl rubrics build`` (the writer's attempts and rubric size: ``RubricWriterSettings``)."""

    items: str = help_field(help="images: a folder, a JSONL manifest, scenes:N[:SEED], easy-vqa[:SPLIT[:LIMIT]] or skimage")
    out: str = help_field(help="output folder (rerun with the same folder to resume)")
    committee: list[str] = help_field([], "teacher backend specs (hf:embedded, hf:PATH, tiny-vlm, openai:URL#MODEL, vllm:MODEL)")
    writer: str = help_field("facts", "rubric writer backend spec, or 'facts' to build rubrics from known facts (scenes)")
    student: str | None = help_field(None, "optional student backend spec whose captions the writer reads")
    limit: int | None = help_field(None, "use only the first N items")
    max_new_tokens: int = help_field(256, "caption length for teachers and student")
    writer_max_new_tokens: int = help_field(768, "rubric reply length")
    writer_sees_image: bool = help_field(False, "give the image to a VLM writer too")
    seed: int = help_field(0, "seed of sampled retries (recorded)")
    on_error: str = help_field("raise", "unreadable images: raise (stop) or skip")
    max_teacher_failure_share: float = help_field(0.05, "largest share of the items a committee teacher may fail on (no caption, or an empty one) before on_teacher_failure applies")
    on_teacher_failure: str = help_field("error", "a teacher over max_teacher_failure_share: error (stop before writing rubrics; rerun resumes and retries the failed captions) or warn (build from fewer teachers, said loudly and in summary.json)")
    quiet: bool = help_field(False, "no progress bars")

    def __post_init__(self) -> None:
        from captionrl.backends import parse_backend_spec

        super().__post_init__()
        if self.on_error not in ("raise", "skip"):
            raise ConfigError("on_error", self.on_error, "unknown choice", "use raise or skip")
        check_teacher_failure_policy(self.max_teacher_failure_share, self.on_teacher_failure)
        specs = [*(("committee", s) for s in self.committee), *([("writer", self.writer)] if self.writer != "facts" else []),
                 *([("student", self.student)] if self.student else [])]
        for name, spec in specs:
            try:
                parse_backend_spec(spec)
            except ConfigError as exc:
                raise ConfigError(name, spec, f"is not a backend spec ({exc})",
                                  "write e.g. hf:embedded, tiny-vlm or openai:http://HOST:PORT/v1#MODEL") from exc


CONFIG = RubricBuildConfig


def run_command(cfg: RubricBuildConfig) -> int:
    from captionrl.backends import backend_from_spec
    from captionrl.domains.images import load_images

    items = list(load_images(cfg.items, on_error=cfg.on_error))
    if cfg.limit is not None:
        items = items[: cfg.limit]
    teachers = [backend_from_spec(s) for s in cfg.committee]
    writer = None
    if cfg.writer != "facts":
        writer = RubricWriter(backend_from_spec(cfg.writer), cfg, max_new_tokens=cfg.writer_max_new_tokens,
                              seed=cfg.seed, with_image=cfg.writer_sees_image)
    elif not all(it.facts for it in items):
        raise ConfigError("writer", "facts", "some items have no known facts",
                          "use scenes:N items, or give a --writer backend")
    if writer is not None and not teachers:
        raise ConfigError("committee", [], "a rubric writer needs committee captions", "pass --committee SPEC ...")
    student = backend_from_spec(cfg.student) if cfg.student else None
    summary = build_rubrics(items, teachers=teachers, writer=writer, out_dir=cfg.out, student=student,
                            max_new_tokens=cfg.max_new_tokens, seed=cfg.seed, progress=not cfg.quiet,
                            max_teacher_failure_share=cfg.max_teacher_failure_share,
                            on_teacher_failure=cfg.on_teacher_failure)
    print(json.dumps({k: summary[k] for k in ("items", "rubrics", "unscored", "mean_items")}))
    print(f"rubrics: {Path(cfg.out) / 'rubrics.jsonl'}")
    return 0
