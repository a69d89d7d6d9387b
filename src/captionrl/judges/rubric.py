"""RubiCap rubrics: teacher committee -> rubric writer -> rubric store -> rubric judge.

Pipeline (RubiCap, offline): N teacher backends caption each image (``committee_captions``); a rubric
writer (LLM or VLM) reads the committee's captions and the student's current captions, keeps the facts
the teachers agree on, targets the student's deficiencies, and emits weighted binary rubric items
``{criterion, test, weight in {1,2,3}}`` as JSON (``RubricWriter``). Replies are schema-checked; an
invalid reply is retried up to ``max_attempts`` times, then the item is recorded as *unscored* (rubric
``None``), never as an empty rubric. Rubrics live in a JSONL store keyed by item id (``RubricStore``).

The judge (``RubricJudge``) scores a caption against its rubric with a text-only model: one binary
decision per criterion, reward = sum(w * satisfied) / sum(w); reasons never enter the reward; a reply that
does not parse leaves the caption unscored (``None``). Three modes, recorded on every judgment:

- ``choose``: one forward pass per criterion reads p("yes") vs p("no") of the first reply token
  (``backend.choose``); decision ``p_yes >= threshold`` (hard) or ``p_yes`` itself (soft).
- ``generate``: one prompt per caption; the judge returns ``[{id, reason, decision}]`` JSON (servers,
  larger judges; the MoCo Rubric A.1.3 format).
- ``likelihood``: evidence = (log p(criterion | caption) - log p(criterion | neutral caption)) per word;
  decision ``evidence > threshold``. Small models that cannot answer yes/no reliably still notice that a
  caption states a criterion's fact; the threshold must be calibrated (``calibrate_threshold``).

Synthetic scenes know their facts, so ``rubric_from_facts`` builds an exact rubric without any writer.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from captionrl.backends.base import Backend, ChatRequest
from captionrl.errors import ConfigError, DataError
from captionrl.judges import prompts as P
from captionrl.judges.base import Columns, require_columns, unscored
from captionrl.records import RecordWriter, read_jsonl, write_json
from captionrl.types import Judgment

WEIGHTS = (1, 2, 3)

# ====================================================================== rubric items
@dataclass(frozen=True)
class RubricItem:
    """One binary check: ``criterion`` (the fact), ``test`` (how to decide), ``weight`` 1|2|3."""

    criterion: str
    test: str
    weight: int

    def to_dict(self) -> dict[str, Any]:
        return {"criterion": self.criterion, "test": self.test, "weight": self.weight}


def validate_rubric(obj: Any, *, max_items: int = 20, field_name: str = "rubric") -> list[RubricItem]:
    """Schema-check a rubric (a list of ``{criterion, test, weight}``, or ``{"rubric": [...]}``).

    Raises ``DataError`` naming the first violation; accepts a JSON string too.
    """
    if isinstance(obj, str):
        try:
            obj = json.loads(obj)
        except json.JSONDecodeError as exc:
            raise DataError(field_name, obj[:80], f"is not valid JSON ({exc.msg})", "store the rubric as a JSON list") from exc
    if isinstance(obj, Mapping) and isinstance(obj.get("rubric", obj.get("rubrics")), list):
        obj = obj.get("rubric", obj.get("rubrics"))
    if not isinstance(obj, list) or not obj:
        raise DataError(field_name, obj, "must be a non-empty list of rubric items",
                        'write [{"criterion": ..., "test": ..., "weight": 1|2|3}, ...]')
    if len(obj) > max_items:
        raise DataError(field_name, len(obj), f"has more than {max_items} items", f"keep at most {max_items} items")
    items: list[RubricItem] = []
    seen: set[str] = set()
    for i, raw in enumerate(obj):
        where = f"{field_name}[{i}]"
        if not isinstance(raw, Mapping):
            raise DataError(where, raw, "must be an object", 'write {"criterion": ..., "test": ..., "weight": 2}')
        extra = set(raw) - {"criterion", "test", "weight"}
        if extra:
            raise DataError(where, sorted(extra), "has unknown keys", "use only criterion, test and weight")
        crit, test, weight = raw.get("criterion"), raw.get("test"), raw.get("weight")
        if not isinstance(crit, str) or not crit.strip():
            raise DataError(f"{where}.criterion", crit, "must be a non-empty string", "state the fact to check")
        if not isinstance(test, str) or not test.strip():
            raise DataError(f"{where}.test", test, "must be a non-empty string", "say how to decide yes or no")
        if isinstance(weight, bool) or not isinstance(weight, (int, float, str)):
            raise DataError(f"{where}.weight", weight, "must be 1, 2 or 3", "use 3 critical, 2 important, 1 minor")
        try:
            w = float(weight)
        except ValueError as exc:
            raise DataError(f"{where}.weight", weight, "must be 1, 2 or 3", "use 3 critical, 2 important, 1 minor") from exc
        if w not in WEIGHTS:
            raise DataError(f"{where}.weight", weight, "must be 1, 2 or 3", "use 3 critical, 2 important, 1 minor")
        key = crit.strip().lower()
        if key in seen:
            raise DataError(f"{where}.criterion", crit, "repeats an earlier criterion", "remove duplicate items")
        seen.add(key)
        items.append(RubricItem(crit.strip(), test.strip(), int(w)))
    return items


def extract_json(text: str) -> Any:
    """The first JSON list or object in a model reply (inside ``` fences or bare); raises ValueError."""
    if text is None:
        raise ValueError("empty reply")
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    candidates = [fenced.group(1)] if fenced else []
    candidates.append(text)
    decoder = json.JSONDecoder()
    for cand in candidates:
        for m in re.finditer(r"[\[{]", cand):
            try:
                value, _ = decoder.raw_decode(cand[m.start():])
            except json.JSONDecodeError:
                continue
            return value
    raise ValueError("no JSON list or object in the reply")


def parse_rubric_reply(text: str, *, max_items: int = 20) -> list[RubricItem]:
    """A writer's reply -> validated rubric; raises ``DataError`` (schema) or ``ValueError`` (no JSON)."""
    return validate_rubric(extract_json(text), max_items=max_items, field_name="reply")


def rubric_weight_total(rubric: Sequence[RubricItem]) -> int:
    return sum(r.weight for r in rubric)


# ====================================================================== rubrics from known facts
FACT_WEIGHTS = {"shape": 3, "colour": 3, "count": 2, "position": 2, "text": 3}
"""Colour (which objects) and the written word are the critical facts; count and position important."""


def rubric_from_facts(scene_or_facts: Any) -> list[RubricItem]:
    """An exact rubric from a synthetic scene's facts (``Scene`` or its ``facts`` list): one item per fact."""
    from captionrl.domains.scenes import NUMBER_WORDS

    facts = getattr(scene_or_facts, "facts", scene_or_facts)
    items = []
    for f in facts:
        kind = f["kind"]
        if kind == "colour":
            crit = f"The {f['shape']}s are {f['value']}."
            test = f"Yes if the caption says the {f['shape']}s are {f['value']}; another colour or none is no."
        elif kind == "count":
            n = int(f["value"])
            crit = f"There are {NUMBER_WORDS.get(n, n)} {f['colour']} {f['shape']}s."
            test = f"Yes if the caption says there are exactly {n} {f['colour']} {f['shape']}s; another number is no."
        elif kind == "position":
            where = {"center": "in the center", "left": "on the left", "right": "on the right"}.get(
                f["value"], f"at the {f['value']}")
            crit = f"The {f['colour']} {f['shape']}s are {where}."
            test = f"Yes if the caption places the {f['colour']} {f['shape']}s {where}; another place is no."
        elif kind == "shape":  # easy-vqa: the one shape in the image
            crit = f"The image shows a {f['value']}."
            test = f"Yes if the caption names a {f['value']} as the shape; another shape or none is no."
        elif kind == "text":
            crit = f'The word "{f["value"]}" is written in the image.'
            test = f"Yes if the caption reports the written word {f['value']}; another word or none is no."
        else:
            raise DataError("facts.kind", kind, "unknown fact kind", "use shape, colour, count, position or text")
        items.append(RubricItem(crit, test, FACT_WEIGHTS[kind]))
    return items


# ====================================================================== rubric store
class RubricStore:
    """Rubrics keyed by item id in a JSONL file (``key`` = item id); ``None`` marks an unscored item."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._writer = RecordWriter(self.path)

    def put(self, item_id: str, rubric: Sequence[RubricItem] | None, **meta: Any) -> None:
        self._writer.write({
            "key": str(item_id), "item_id": str(item_id),
            "rubric": None if rubric is None else [r.to_dict() for r in rubric], **meta,
        })

    def get(self, item_id: str) -> list[RubricItem] | None:
        rec = self._writer.get(str(item_id))
        if rec is None or rec.get("rubric") is None:
            return None
        return validate_rubric(rec["rubric"], field_name=f"store[{item_id}].rubric")

    def record(self, item_id: str) -> dict[str, Any] | None:
        return self._writer.get(str(item_id))

    def __contains__(self, item_id: object) -> bool:
        return self._writer.has(str(item_id))

    def __len__(self) -> int:
        return len(self._writer.done_keys)

    def ids(self) -> list[str]:
        return sorted(self._writer.done_keys)

    def close(self) -> None:
        self._writer.close()


# ====================================================================== teacher committee
def caption_messages(image: Any, instruction: str = P.CAPTION_INSTRUCTION) -> list[dict[str, Any]]:
    """The caption request for one image (MoCo Rubric A.1.1 style), image part first."""
    return [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": instruction}]}]


def committee_captions(
    items: Sequence[Any],
    teachers: Sequence[Backend],
    out_path: str | Path,
    *,
    instruction: str = P.CAPTION_INSTRUCTION,
    samples: int = 1,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, list[str]]:
    """Caption every item with every teacher; JSONL records keyed ``item|teacher|k``, resumable.

    A failed generation is recorded with ``caption: null`` and its error, and retried on the next run.
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
                reqs = [ChatRequest(caption_messages(it.load(), instruction), max_new_tokens=max_new_tokens,
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
    return rec is not None and rec.get("caption") is not None


def _captions_by_item(records: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r in records:
        if r.get("caption"):
            out.setdefault(str(r["item_id"]), []).append(str(r["caption"]))
    return out


# ====================================================================== rubric writer
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
    """

    def __init__(
        self,
        backend: Backend,
        *,
        max_attempts: int = 3,
        max_new_tokens: int = 768,
        retry_temperature: float = 0.7,
        seed: int = 0,
        min_items: int = 3,
        max_items: int = 10,
        with_image: bool = False,
    ) -> None:
        if max_attempts < 1:
            raise ConfigError("max_attempts", max_attempts, "must be >= 1", "set max_attempts to 1 or more")
        if not 1 <= min_items <= max_items:
            raise ConfigError("min_items", min_items, f"must be 1..max_items ({max_items})", "set min_items <= max_items")
        self.backend = backend
        self.max_attempts = max_attempts
        self.max_new_tokens = max_new_tokens
        self.retry_temperature = retry_temperature
        self.seed = seed
        self.min_items = min_items
        self.max_items = max_items
        self.with_image = with_image

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
                                temperature=temp, seed=self.seed + attempt) for i in pending]
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


def build_rubrics(
    items: Sequence[Any],
    *,
    teachers: Sequence[Backend],
    writer: RubricWriter | None,
    out_dir: str | Path,
    student: Backend | None = None,
    instruction: str = P.CAPTION_INSTRUCTION,
    max_new_tokens: int = 256,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Committee captions -> (student captions) -> rubrics, all JSONL in ``out_dir``; resumable.

    ``writer=None`` builds rubrics from the items' known facts (synthetic scenes) instead of a model.
    Writes ``committee.jsonl``, ``student.jsonl`` (if a student is given), ``rubrics.jsonl`` and
    ``summary.json``; returns the summary.
    """
    from tqdm.auto import tqdm

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    committee = committee_captions(items, teachers, out / "committee.jsonl", instruction=instruction,
                                   max_new_tokens=max_new_tokens, seed=seed, progress=progress) if teachers else {}
    students: dict[str, list[str]] = {}
    if student is not None:
        students = committee_captions(items, [student], out / "student.jsonl", instruction=instruction,
                                      max_new_tokens=max_new_tokens, seed=seed, progress=progress)
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
        "writer": writer.backend.name if writer else "facts",
        "student": student.name if student else None,
        "config": {"instruction": instruction, "max_new_tokens": max_new_tokens, "seed": seed,
                   "max_attempts": writer.max_attempts if writer else 0},
    }
    write_json(out / "summary.json", summary)
    store.close()
    return summary


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


# ====================================================================== rubric judge
JudgeMode = Literal["choose", "generate", "likelihood"]

DEFAULT_THRESHOLDS = {"choose": 0.5, "generate": 0.5, "likelihood": 1.4}
"""Decision thresholds: p(yes) for ``choose``; PMI per word for ``likelihood``. The likelihood default was
calibrated with the embedded SmolLM2 on synthetic scenes of seed 1 (true vs contradicting captions);
recalibrate with ``calibrate_threshold`` for another judge model."""


class RubricJudge:
    """Scores captions against rubrics (the ``Judge`` protocol): reward = sum(w * satisfied) / sum(w).

    The rubric of row i comes from ``columns["rubric"][i]`` (list of items or JSON) or, failing that,
    from ``store`` via ``columns["item_id"][i]``. A missing or invalid rubric, a backend failure or an
    unparseable reply leaves that caption unscored (``score=None``), never 0.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        mode: JudgeMode = "choose",
        decision: Literal["hard", "soft"] = "hard",
        threshold: float | None = None,
        store: RubricStore | None = None,
        options: tuple[str, str] = ("yes", "no"),
        max_new_tokens: int = 512,
        name: str | None = None,
    ) -> None:
        if mode not in DEFAULT_THRESHOLDS:
            raise ConfigError("judge.mode", mode, "unknown rubric judge mode", "use choose, generate or likelihood")
        if decision not in ("hard", "soft"):
            raise ConfigError("judge.decision", decision, "unknown decision rule", "use hard or soft")
        if mode == "generate" and decision == "soft":
            raise ConfigError("judge.decision", decision, "generate mode returns binary decisions only",
                              "use decision=hard with mode=generate")
        self.backend = backend
        self.mode = mode
        self.decision = decision
        self.threshold = DEFAULT_THRESHOLDS[mode] if threshold is None else float(threshold)
        self.store = store
        self.options = options
        self.max_new_tokens = max_new_tokens
        self.name = name or f"rubric-{mode}"
        self._null_cache: dict[str, float | None] = {}

    # ------------------------------------------------------------------ protocol
    def judge(self, captions: Sequence[str], columns: Columns) -> list[Judgment]:
        n = len(captions)
        if "rubric" in columns:
            require_columns(columns, ["rubric"], n, self.name)
        elif self.store is not None:
            require_columns(columns, ["item_id"], n, self.name)
        else:
            require_columns(columns, ["rubric"], n, self.name)
        out: list[Judgment] = []
        for i, caption in enumerate(captions):
            rubric, err = self._rubric_for(columns, i)
            if rubric is None:
                out.append(unscored(err or "no rubric", method=self.mode))
                continue
            if not isinstance(caption, str) or not caption.strip():
                out.append(Judgment(score=0.0, decision=[False] * len(rubric), method=self.mode,
                                    reason="empty caption satisfies no criterion"))
                continue
            out.append(self.judge_one(caption, rubric))
        return out

    def _rubric_for(self, columns: Columns, i: int) -> tuple[list[RubricItem] | None, str | None]:
        raw = columns["rubric"][i] if "rubric" in columns else None
        if raw is None and self.store is not None and "item_id" in columns:
            item_id = str(columns["item_id"][i])
            rec = self.store.record(item_id)
            if rec is None:
                return None, f"no rubric for item {item_id!r} in {self.store.path}"
            raw = rec.get("rubric")
            if raw is None:
                return None, f"rubric of item {item_id!r} is unscored: {rec.get('error')}"
        if raw is None:
            return None, "row has no rubric"
        try:
            if raw and isinstance(raw, list) and isinstance(raw[0], RubricItem):
                return list(raw), None
            return validate_rubric(raw), None
        except DataError as exc:
            return None, f"invalid rubric: {exc}"

    def judge_one(self, caption: str, rubric: Sequence[RubricItem]) -> Judgment:
        if self.mode == "choose":
            values, extra, err = self._choose(caption, rubric)
        elif self.mode == "likelihood":
            values, extra, err = self._likelihood(caption, rubric)
        else:
            values, extra, err = self._generate(caption, rubric)
        if values is None:
            return unscored(err or "judge failed", method=self.mode, **extra)
        if self.mode == "generate":
            sat = [1.0 if v else 0.0 for v in values]
        elif self.decision == "soft":
            sat = [float(v) for v in values]
        else:
            sat = [1.0 if v >= self.threshold else 0.0 for v in values]
        total = rubric_weight_total(rubric)
        score = sum(r.weight * s for r, s in zip(rubric, sat, strict=True)) / total
        return Judgment(
            score=score, decision=[s >= 0.5 for s in sat], method=self.mode,
            extra={"values": values, "satisfied": sat, "weights": [r.weight for r in rubric],
                   "threshold": self.threshold, "decision_rule": self.decision, **extra},
        )

    # ------------------------------------------------------------------ modes
    def choose_prompt(self, caption: str, item: RubricItem) -> list[dict[str, Any]]:
        text = P.JUDGE_CHOOSE_TEMPLATE.format(caption=caption.strip(), criterion=item.criterion, test=item.test)
        return [{"role": "user", "content": text}]

    def _choose(self, caption: str, rubric: Sequence[RubricItem]) -> tuple[list[float] | None, dict, str | None]:
        results = self.backend.choose([self.choose_prompt(caption, r) for r in rubric], list(self.options))
        yes = self.options[0]
        probs = [None if r.probs is None else r.probs[yes] for r in results]
        extra = {"backend_method": results[0].method if results else None,
                 "mass": [r.mass for r in results]}
        if any(p is None for p in probs):
            errors = [r.error for r in results if r.probs is None]
            return None, extra, f"choose failed for {len(errors)} criteria: {errors[0]}"
        return [float(p) for p in probs if p is not None], extra, None

    def _likelihood(self, caption: str, rubric: Sequence[RubricItem]) -> tuple[list[float] | None, dict, str | None]:
        ctx = P.LIKELIHOOD_CONTEXT.format(caption=caption.strip())
        conts = [" " + r.criterion for r in rubric]
        missing = [c for c in conts if c not in self._null_cache]
        if missing:
            null_ctx = P.LIKELIHOOD_CONTEXT.format(caption=P.LIKELIHOOD_NULL_CAPTION)
            for c, v in zip(missing, self.backend.loglikelihood([(null_ctx, c) for c in missing]), strict=True):
                self._null_cache[c] = v
        lls = self.backend.loglikelihood([(ctx, c) for c in conts])
        nulls = [self._null_cache[c] for c in conts]
        if any(v is None for v in lls) or any(v is None for v in nulls):
            for c in conts:  # do not keep a failed baseline
                if self._null_cache.get(c) is None:
                    self._null_cache.pop(c, None)
            return None, {}, "loglikelihood failed"
        pmi = [(a - b) / max(1, len(c.split())) for a, b, c in zip(lls, nulls, conts, strict=True)]  # type: ignore[operator]
        values = pmi if self.decision == "hard" else [_sigmoid(v - self.threshold) for v in pmi]
        return values, {"pmi_per_word": pmi}, None

    def generate_prompt(self, caption: str, rubric: Sequence[RubricItem]) -> list[dict[str, Any]]:
        crits = "\n".join(f"{i + 1}. {r.criterion} (test: {r.test})" for i, r in enumerate(rubric))
        return [{"role": "user", "content": P.JUDGE_GENERATE_TEMPLATE.format(caption=caption.strip(), criteria=crits)}]

    def _generate(self, caption: str, rubric: Sequence[RubricItem]) -> tuple[list[bool] | None, dict, str | None]:
        gen = self.backend.generate([ChatRequest(self.generate_prompt(caption, rubric),
                                                 max_new_tokens=self.max_new_tokens)])[0]
        extra: dict[str, Any] = {"raw": gen.text}
        if gen.text is None:
            return None, extra, f"backend error: {gen.error}"
        try:
            decisions, reasons = parse_judge_reply(gen.text, len(rubric))
        except ValueError as exc:
            return None, extra, f"unparseable judge reply: {exc}"
        extra["reasons"] = reasons  # logged, never part of the reward
        return decisions, extra, None


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x > -60 else 0.0


_YES = {"yes", "y", "true", "satisfied", "pass", "1"}
_NO = {"no", "n", "false", "not satisfied", "unsatisfied", "fail", "0"}


def parse_judge_reply(text: str, n: int) -> tuple[list[bool], list[str]]:
    """``[{id, reason, decision}]`` (or ``{"judgments": [...]}``) -> (decisions, reasons); ValueError if not
    exactly one yes/no decision per criterion 1..n."""
    data = extract_json(text)
    if isinstance(data, Mapping):
        data = next((v for v in data.values() if isinstance(v, list)), None)
    if not isinstance(data, list):
        raise ValueError("reply is not a JSON list of decisions")
    decisions: dict[int, bool] = {}
    reasons: dict[int, str] = {}
    for pos, entry in enumerate(data):
        if not isinstance(entry, Mapping) or "decision" not in entry:
            raise ValueError(f"entry {pos} has no decision")
        idx = entry.get("id", pos + 1)
        try:
            idx = int(idx)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"entry {pos} has a bad id {idx!r}") from exc
        raw = entry["decision"]
        word = str(raw).strip().lower() if not isinstance(raw, bool) else ("true" if raw else "false")
        if word in _YES:
            decisions[idx] = True
        elif word in _NO:
            decisions[idx] = False
        else:
            raise ValueError(f"entry {pos} has decision {raw!r}, not yes/no")
        reasons[idx] = str(entry.get("reason", ""))
    if sorted(decisions) != list(range(1, n + 1)):
        raise ValueError(f"decisions for criteria {sorted(decisions)}, expected 1..{n}")
    return [decisions[i] for i in range(1, n + 1)], [reasons[i] for i in range(1, n + 1)]


# ====================================================================== calibration and recording
def calibrate_threshold(values: Sequence[float], labels: Sequence[bool]) -> tuple[float, float]:
    """The decision threshold that maximises accuracy on labelled criterion values; returns (threshold,
    accuracy). Thresholds are midpoints between sorted values, so the rule ``value >= t`` is unambiguous."""
    if len(values) != len(labels) or not values:
        raise DataError("labels", len(labels), f"need one label per value ({len(values)}), at least one",
                        "pass aligned values and labels")
    pts = sorted(set(values))
    cands = [pts[0] - 1.0] + [(a + b) / 2 for a, b in itertools.pairwise(pts)] + [pts[-1] + 1.0]
    best = (cands[0], -1.0)
    for t in cands:
        acc = sum((v >= t) == bool(y) for v, y in zip(values, labels, strict=True)) / len(values)
        if acc > best[1]:
            best = (t, acc)
    return best


def judge_records(
    judge: Any,
    rows: Sequence[Mapping[str, Any]],
    out_path: str | Path,
    *,
    caption_field: str = "caption",
    key: Callable[[Mapping[str, Any]], str] | None = None,
    batch_size: int = 8,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Judge ``rows`` (each a caption plus its columns) into a resumable JSONL; returns all records.

    The default key is ``item_id`` + a hash of the caption, so rerunning with the same file skips the
    rows already judged (unscored ones included: they are evidence, not gaps).
    """
    from tqdm.auto import tqdm

    keyf = key or (lambda r: f"{r.get('item_id', '')}|{_hash(str(r[caption_field]))}")
    with RecordWriter(out_path) as w:
        todo = [r for r in rows if not w.has(keyf(r))]
        bar = tqdm(total=len(todo), desc=f"judge {getattr(judge, 'name', '')}", disable=not progress)
        for start in range(0, len(todo), batch_size):
            chunk = todo[start : start + batch_size]
            cols = {k: [r.get(k) for r in chunk] for k in chunk[0] if k != caption_field}
            for r, j in zip(chunk, judge.judge([r[caption_field] for r in chunk], cols), strict=True):
                w.write({"key": keyf(r), "item_id": r.get("item_id"), "caption": r[caption_field],
                         "judge": getattr(judge, "name", ""), **j.to_record()})
            bar.update(len(chunk))
        bar.close()
        return [w.get(keyf(r)) or {} for r in rows]


def _hash(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:12]


# ====================================================================== CLI: captionrl rubrics build
def backend_from_spec(spec: str) -> Backend:
    """A backend from a command-line spec (``hf:embedded``, ``tiny-vlm``, ``openai:URL#MODEL``, ``vllm:MODEL``)."""
    from captionrl.backends import make_backend, parse_backend_spec

    return make_backend(parse_backend_spec(spec))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--items", required=True,
                   help="images: a folder, a JSONL manifest, scenes:N[:SEED], easy-vqa[:SPLIT[:LIMIT]] or skimage")
    p.add_argument("--committee", nargs="*", default=[],
                   help="teacher backend specs (hf:embedded, hf:PATH, tiny-vlm, openai:URL#MODEL, vllm:MODEL)")
    p.add_argument("--writer", default="facts",
                   help="rubric writer backend spec, or 'facts' to build rubrics from known facts (scenes)")
    p.add_argument("--student", default=None, help="optional student backend whose captions the writer reads")
    p.add_argument("--out", required=True, help="output folder (rerun with the same folder to resume)")
    p.add_argument("--limit", type=int, default=None, help="use only the first N items")
    p.add_argument("--max-attempts", type=int, default=3, help="writer attempts per item before it is unscored")
    p.add_argument("--max-new-tokens", type=int, default=256, help="caption length for teachers and student")
    p.add_argument("--writer-max-new-tokens", type=int, default=768, help="rubric reply length")
    p.add_argument("--writer-sees-image", action="store_true", help="give the image to a VLM writer too")
    p.add_argument("--seed", type=int, default=0, help="seed of sampled retries (recorded)")
    p.add_argument("--on-error", choices=["raise", "skip"], default="raise", help="unreadable images: stop or skip")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def main(args: argparse.Namespace) -> int:
    from captionrl.domains.images import load_images

    items = list(load_images(args.items, on_error=args.on_error))
    if args.limit is not None:
        items = items[: args.limit]
    teachers = [backend_from_spec(s) for s in args.committee]
    writer = None
    if args.writer != "facts":
        writer = RubricWriter(backend_from_spec(args.writer), max_attempts=args.max_attempts,
                              max_new_tokens=args.writer_max_new_tokens, seed=args.seed,
                              with_image=args.writer_sees_image)
    elif not all(it.facts for it in items):
        raise ConfigError("writer", "facts", "some items have no known facts",
                          "use scenes:N items, or give a --writer backend")
    if writer is not None and not teachers:
        raise ConfigError("committee", [], "a rubric writer needs committee captions", "pass --committee SPEC ...")
    student = backend_from_spec(args.student) if args.student else None
    summary = build_rubrics(items, teachers=teachers, writer=writer, out_dir=args.out, student=student,
                            max_new_tokens=args.max_new_tokens, seed=args.seed, progress=not args.quiet)
    print(json.dumps({k: summary[k] for k in ("items", "rubrics", "unscored", "mean_items")}))
    print(f"rubrics: {Path(args.out) / 'rubrics.jsonl'}")
    return 0


def load_store_rubrics(path: str | Path) -> dict[str, list[RubricItem] | None]:
    """Every rubric of a store file (item id -> rubric or None), for trainers that want a plain dict."""
    out: dict[str, list[RubricItem] | None] = {}
    for rec in read_jsonl(path):
        out[str(rec["key"])] = validate_rubric(rec["rubric"]) if rec.get("rubric") is not None else None
    return out
