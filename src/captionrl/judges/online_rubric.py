"""Online, candidate-conditioned rubrics (MoCo Rubric §3.3, appendix A.1.2-A.1.3).

For every GRPO group (the G captions the Policy sampled for one image) the Generator writes a rubric from
the image, two reference captions and a *random subset of 4* of the G current captions; that one rubric
then scores all G captions, with a text-only Judge that returns a reason and a binary decision per
criterion (``RubricJudge``'s scoring: reward = sum(w * satisfied) / sum(w); reasons never enter it).
The subset exposes how the current candidates differ while the references anchor quality.

Why a group, not a caption, is the unit: the rubric is shared by the group, so its advantages compare
captions under the same yardstick. TRL hands a reward function the G completions of a group next to
each other (TRL 1.16's reward contract), so groups are the runs of equal ``item_id`` (cut into ``group_size`` chunks when
the same item occurs twice in a row).

Each Generator request carries the rubric JSON schema (``judges.roles.rubric_schema``), so an in-process
Generator decodes under it (``backends.structured``) and its reply is complete JSON of the right shape;
the parser still checks what a schema cannot state (no repeated criterion, no copied example item).

Failure handling (an outage is never a 0): a Generator reply that fails the rubric schema is
retried (attempt 1 greedy unless ``rubric.temperature`` > 0, retries sampled with recorded seeds); if every attempt fails, every caption
of the group is *unscored* (``Judgment(score=None)``), unless ``fallback="facts"`` is chosen, which
builds the rubric from the item's known facts (synthetic scenes) and records ``source="facts-fallback"``
on the group, so a run never passes fact rubrics off as generated ones.

Which parameters serve the Generator and the Judge is not this module's business: it asks a
``RoleServer`` for a backend per role (``fixed_roles`` for plain backends; ``captionrl.train.moco``
serves both roles from the momentum model). Both roles of one call read the same parameter version.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np

from captionrl.backends.base import Backend, ChatRequest
from captionrl.config import help_field
from captionrl.domains.scenes import rubric_from_facts
from captionrl.errors import ConfigError, DataError
from captionrl.judges import prompts as P
from captionrl.judges.base import Columns, require_columns, unscored
from captionrl.judges.roles import generator_messages, judge_messages, rubric_schema, structured
from captionrl.judges.rubric import RubricJudge, RubricJudgeSettings, extract_json, validate_rubric
from captionrl.judges.rubric_build import RubricWriterSettings
from captionrl.records import RecordWriter
from captionrl.types import Judgment, RubricItem

FALLBACKS = ("none", "facts")
ROLES = ("generator", "judge")
_PLACEHOLDER = re.compile(r"^[\W_]*$")  # "...", "-", "" : a copied template, not a criterion


@dataclass
class OnlineRubricConfig(RubricWriterSettings):
    """How the Generator writes one rubric per group (paper §3.3, A.1.2). The attempts, retry temperature and
    rubric size are every rubric writer's (``judges.rubric_build.RubricWriterSettings``): when every attempt
    fails, the group is unscored (or takes the facts fallback)."""

    FIELD_PREFIX: ClassVar[str] = "rubric"

    n_candidates: int = help_field(4, "Policy captions of the group shown to the Generator (a seeded random subset; the paper: 4 of 16)")
    group_size: int | None = help_field(None, "G: captions per group; splits a run of the same item into groups (null: one group per run of equal item_id)")
    with_image: bool = help_field(True, "show the image to the Generator (VLM); false: language-only Generator reading image_text")
    temperature: float = help_field(0.0, "sampling temperature of the first attempt (0: greedy, as the paper's Generator; > 0 samples with a recorded seed)")
    max_new_tokens: int = help_field(512, "longest Generator reply, in tokens")
    fallback: str = help_field("none", "when every attempt fails: none (the paper: the group is unscored) or facts (rubric from the item's known facts, recorded as source=facts-fallback; synthetic scenes only)")
    seed: int = help_field(0, "seed of the candidate subsets and of sampled retries")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_candidates < 1:
            raise ConfigError("rubric.n_candidates", self.n_candidates, "must be >= 1", "set rubric.n_candidates: 4")
        if self.group_size is not None and self.group_size < 1:
            raise ConfigError("rubric.group_size", self.group_size, "must be >= 1 or null", "set it to G (train.num_generations)")
        if self.temperature < 0:
            raise ConfigError("rubric.temperature", self.temperature, "must be >= 0", "set rubric.temperature: 0 (greedy)")
        if self.fallback not in FALLBACKS:
            raise ConfigError("rubric.fallback", self.fallback, "unknown fallback", "use none or facts")


# ---------------------------------------------------------------------- roles
class RoleServer(Protocol):
    """Gives the backend that plays ``role`` (generator | judge) for the duration of a ``with`` block."""

    def __call__(self, role: str) -> contextlib.AbstractContextManager[Backend]: ...


def fixed_roles(generator: Backend, judge: Backend | None = None) -> RoleServer:
    """Plain backends for the two roles (evaluation, tests); ``judge`` defaults to the generator."""
    backends = {"generator": generator, "judge": judge or generator}

    @contextlib.contextmanager
    def serve(role: str) -> Iterator[Backend]:
        if role not in backends:
            raise ConfigError("role", role, "unknown role", f"use one of {', '.join(ROLES)}")
        yield backends[role]

    return serve


class MocoRubricJudge(RubricJudge):
    """``RubricJudge`` whose ``generate`` prompt is the shared-SFT Judge prompt (A.1.3,
    ``judges.roles.judge_messages``), so an SFT-trained Judge is asked exactly what it learnt."""

    def generate_prompt(self, caption: str, rubric: Sequence[RubricItem]) -> list[dict[str, Any]]:
        return judge_messages([r.to_dict() for r in rubric], caption.strip())


def moco_judge_factory(settings: RubricJudgeSettings) -> Callable[[Backend], RubricJudge]:
    """Builds MoCo's Judge (``MocoRubricJudge``, named ``moco-judge-<mode>``) under ``settings`` on a served
    Judge backend: the online rubric reward's ``judge_factory``, and EvoLM's fixed Judge."""
    return lambda backend: settings.rubric_judge(backend, name=f"moco-judge-{settings.mode}",
                                                 judge_class=MocoRubricJudge)


# ---------------------------------------------------------------------- pure helpers
def group_spans(item_ids: Sequence[Any], group_size: int | None = None) -> list[tuple[int, int]]:
    """``[start, end)`` of each group: runs of equal ``item_id``, cut into ``group_size`` chunks."""
    spans: list[tuple[int, int]] = []
    start = 0
    n = len(item_ids)
    while start < n:
        end = start + 1
        while end < n and str(item_ids[end]) == str(item_ids[start]):
            end += 1
        if group_size:
            spans.extend((s, min(s + group_size, end)) for s in range(start, end, group_size))
        else:
            spans.append((start, end))
        start = end
    return spans


def stable_int(text: str) -> int:
    """A process-independent 32-bit integer of ``text`` (Python's ``hash`` is salted per process)."""
    return int.from_bytes(hashlib.sha1(text.encode()).digest()[:4], "big")


def subset_seed(seed: int, step: int, item_id: str, occurrence: int) -> list[int]:
    """The seed material of one group's candidate subset (recorded with the group)."""
    return [int(seed), int(step), stable_int(str(item_id)), int(occurrence)]


def choose_subset(group_len: int, k: int, seed_material: Sequence[int]) -> list[int]:
    """``min(k, group_len)`` distinct caption positions of the group, sorted; same seed, same subset."""
    rng = np.random.default_rng(list(seed_material))
    take = min(k, group_len)
    return sorted(int(i) for i in rng.choice(group_len, size=take, replace=False))


def parse_generator_reply(text: str | None, min_items: int, max_items: int) -> list[RubricItem]:
    """A Generator reply -> a validated rubric; raises ``DataError`` naming the problem with the reply.

    Every rejection of the reply is a ``DataError`` (no reply, no JSON, the schema, a faked rubric), so a
    caller can tell the parser's verdict on the Generator's text (a verifiable format failure) from the
    parser itself failing (any other exception: ours, never scored as the Generator's fault). Beyond the
    rubric schema, it rejects the two ways small models fake a rubric: copying the prompt's example item,
    and placeholder criteria such as ``"..."`` (the JSON template of the instruction).
    """
    if text is None or not text.strip():
        raise DataError("reply", text, "is empty", "write the rubric as a JSON list of items")
    try:
        obj = extract_json(text)
    except ValueError as exc:
        raise DataError("reply", text[:80], f"holds no rubric ({exc})",
                        'write [{"criterion": ..., "test": ..., "weight": 1|2|3}, ...]') from None
    rubric = validate_rubric(obj, max_items=max_items, field_name="reply")
    for i, r in enumerate(rubric):
        if r.criterion == P.WRITER_EXAMPLE_CRITERION:
            raise DataError(f"reply[{i}].criterion", r.criterion, "copies the prompt's example item",
                            "write criteria about this image's captions")
        if _PLACEHOLDER.match(r.criterion) or _PLACEHOLDER.match(r.test):
            raise DataError(f"reply[{i}]", r.to_dict(), "is a placeholder copied from the instruction",
                            "state a checkable fact")
    if len(rubric) < min_items:
        raise DataError("reply", len(rubric), f"has fewer than {min_items} items", f"write at least {min_items} items")
    return rubric


def generator_request_messages(references: Sequence[str], candidates: Sequence[str], image: Any = None,
                               image_text: str | None = None, *, with_image: bool = True) -> list[dict[str, Any]]:
    """The Generator prompt of the shared SFT (``judges.roles.generator_messages``) with the image attached."""
    msgs = generator_messages(list(references), list(candidates), image_text=image_text,
                              with_images=with_image and image is not None)
    if with_image and image is not None:
        content = [dict(p) for p in msgs[0]["content"]]
        for part in content:
            if part.get("type") == "image":
                part["image"] = image
        msgs = [{"role": msgs[0]["role"], "content": content}]
    return msgs


def _references(value: Any) -> list[str]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return [value]
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [str(v) for v in value if str(v).strip()]
    return []


def _facts(value: Any) -> list[dict[str, Any]] | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise DataError("facts", value[:80], f"is not valid JSON ({exc.msg})",
                            "store the item's facts as a JSON list of objects") from None
    if isinstance(value, Sequence) and value and all(isinstance(f, Mapping) for f in value):
        return [dict(f) for f in value]
    return None


# ---------------------------------------------------------------------- the judge
@dataclass
class GroupResult:
    """One group's rubric and its evidence (one ``rubrics.jsonl`` record per group)."""

    item_id: str
    step: int
    occurrence: int
    span: tuple[int, int]
    subset: list[int]
    subset_seed: list[int]
    rubric: list[RubricItem] | None = None
    source: str = "generator"
    attempts: int = 0
    raws: list[str | None] = dataclasses.field(default_factory=list)
    errors: list[str] = dataclasses.field(default_factory=list)
    seeds: list[int | None] = dataclasses.field(default_factory=list)
    scores: list[float | None] = dataclasses.field(default_factory=list)

    def to_record(self) -> dict[str, Any]:
        return {
            "key": f"{self.step}|{self.item_id}|{self.occurrence}", "step": self.step, "item_id": self.item_id,
            "occurrence": self.occurrence, "span": list(self.span), "subset": self.subset,
            "subset_seed": self.subset_seed, "source": self.source if self.rubric is not None else "unscored",
            "rubric": None if self.rubric is None else [r.to_dict() for r in self.rubric],
            "attempts": self.attempts, "raws": self.raws, "errors": self.errors, "retry_seeds": self.seeds,
            "scores": self.scores,
        }


class OnlineRubricJudge:
    """The ``Judge`` protocol over groups: Generator rubric per group, then the Judge scores every caption.

    Columns: ``item_id`` and ``references`` (list of captions, or JSON) always; ``image`` when the
    Generator sees the image; ``image_text`` for a language-only Generator; ``facts`` with
    ``fallback="facts"``; an optional ``step`` column seeds the subsets (else a call counter).

    Args:
        roles: backend per role (``fixed_roles`` or the momentum server of ``train.moco``).
        cfg: subset size, attempts, fallback, seed.
        judge_factory: builds the criterion judge on the served Judge backend (default: ``MocoRubricJudge``
            in ``choose`` mode); called per call because the served parameters change during training.
        records: optional writer of one record per group (rubric, subset, raws, scores).
    """

    def __init__(self, roles: RoleServer, cfg: OnlineRubricConfig | None = None, *,
                 judge_factory: Callable[[Backend], RubricJudge] | None = None,
                 records: RecordWriter | None = None, name: str = "online-rubric") -> None:
        self.roles = roles
        self.cfg = cfg or OnlineRubricConfig()
        self.judge_factory = judge_factory or (lambda b: MocoRubricJudge(b, mode="choose"))
        self.records = records
        self.name = name
        self.calls = 0
        self.last_groups: list[GroupResult] = []

    # ------------------------------------------------------------------ protocol
    def judge(self, captions: Sequence[str], columns: Columns) -> list[Judgment]:
        n = len(captions)
        needed = ["item_id", "references"]
        if self.cfg.fallback == "facts":
            needed.append("facts")
        require_columns(columns, needed, n, self.name)
        if self.cfg.with_image:
            require_columns(columns, ["image"], n, self.name)
        step = int(columns["step"][0]) if "step" in columns and n else self.calls
        self.calls += 1
        groups = self._groups(captions, columns, step)
        self._write_rubrics(groups, captions, columns)
        judgments = self._score(groups, captions)
        for g in groups:
            g.scores = [judgments[i].score for i in range(*g.span)]
        self.last_groups = groups
        if self.records is not None:
            self.records.write_many([g.to_record() for g in groups])
        return judgments

    def _groups(self, captions: Sequence[str], columns: Columns, step: int) -> list[GroupResult]:
        seen: dict[str, int] = {}
        out = []
        for start, end in group_spans(columns["item_id"], self.cfg.group_size):
            item = str(columns["item_id"][start])
            occ = seen.get(item, 0)
            seen[item] = occ + 1
            material = subset_seed(self.cfg.seed, step, item, occ)
            subset = [start + i for i in choose_subset(end - start, self.cfg.n_candidates, material)]
            out.append(GroupResult(item, step, occ, (start, end), subset, material))
        return out

    def _write_rubrics(self, groups: list[GroupResult], captions: Sequence[str], columns: Columns) -> None:
        """Generator attempts, batched over the groups still lacking a valid rubric."""
        cfg = self.cfg
        prompts = {}
        for g in groups:
            i = g.span[0]
            image = columns["image"][i] if cfg.with_image else None
            image_text = columns["image_text"][i] if "image_text" in columns else None
            prompts[id(g)] = generator_request_messages(
                _references(columns["references"][i]), [captions[j] for j in g.subset], image, image_text,
                with_image=cfg.with_image)
        pending = list(groups)
        schema = structured(rubric_schema(cfg.min_items, cfg.max_items))  # in-process Generators decode under it
        with self.roles("generator") as backend:
            for attempt in range(cfg.max_attempts):
                if not pending:
                    break
                temp = cfg.temperature if attempt == 0 else cfg.retry_temperature
                seeds = [None if temp == 0 else stable_int(f"{g.subset_seed}|{attempt}") for g in pending]
                reqs = [ChatRequest(prompts[id(g)], max_new_tokens=cfg.max_new_tokens, temperature=temp, seed=s, **schema)
                        for g, s in zip(pending, seeds, strict=True)]
                gens = backend.generate(reqs)
                still = []
                for g, gen, s in zip(pending, gens, seeds, strict=True):
                    g.attempts += 1
                    g.raws.append(gen.text)
                    g.seeds.append(s)
                    if gen.text is None:
                        g.errors.append(f"attempt {attempt + 1}: backend error: {gen.error}")
                        still.append(g)
                        continue
                    try:
                        g.rubric = parse_generator_reply(gen.text, cfg.min_items, cfg.max_items)
                        g.source = f"generator:{backend.name}"
                    except (DataError, ValueError) as exc:
                        g.errors.append(f"attempt {attempt + 1}: {exc}")
                        still.append(g)
                pending = still
        for g in pending:
            if cfg.fallback == "facts":
                facts = _facts(columns["facts"][g.span[0]])
                if facts:
                    g.rubric = rubric_from_facts(facts)
                    g.source = "facts-fallback"
                else:
                    g.errors.append("fallback: the item has no facts")

    def _score(self, groups: list[GroupResult], captions: Sequence[str]) -> list[Judgment]:
        out: list[Judgment | None] = [None] * len(captions)
        idx: list[int] = []
        rubrics: list[list[RubricItem]] = []
        for g in groups:
            if g.rubric is None:
                err = "no valid rubric: " + ("; ".join(g.errors[-2:]) or "generator failed")
                for i in range(*g.span):
                    out[i] = unscored(err, method="online-rubric", rubric_source="unscored", group=g.span[0])
                continue
            for i in range(*g.span):
                idx.append(i)
                rubrics.append(g.rubric)
        if idx:
            with self.roles("judge") as backend:
                judge = self.judge_factory(backend)
                got = judge.judge([captions[i] for i in idx], {"rubric": rubrics})
            for i, j, rub in zip(idx, got, rubrics, strict=True):
                g = next(g for g in groups if g.span[0] <= i < g.span[1])
                extra = {**j.extra, "rubric_source": g.source, "rubric_size": len(rub), "group": g.span[0]}
                out[i] = dataclasses.replace(j, extra=extra)
        return [j for j in out if j is not None]


# ---------------------------------------------------------------------- diagnostics
def rubric_stats(groups: Sequence[GroupResult]) -> dict[str, float]:
    """Per-call diagnostics (logged every step): rubric size and weight mix, how groups got their rubric,
    unscored groups and zero-std groups among the scored ones (TRL counts an unscored group as non-zero std)."""
    n = len(groups)
    if not n:
        return {}
    valid = [g for g in groups if g.rubric is not None]
    weights = [r.weight for g in valid for r in g.rubric or []]
    out: dict[str, float] = {
        "rubric/groups": float(n),
        "rubric/generator_valid_frac": sum(g.source.startswith("generator") and g.rubric is not None
                                           for g in groups) / n,
        "rubric/fallback_frac": sum(g.source == "facts-fallback" for g in groups) / n,
        "rubric/unscored_groups_frac": sum(g.rubric is None for g in groups) / n,
        "rubric/attempts": float(np.mean([g.attempts for g in groups])),
    }
    if valid:
        out["rubric/size"] = float(np.mean([len(g.rubric or []) for g in valid]))
        for w in (1, 2, 3):
            out[f"rubric/weight{w}_frac"] = weights.count(w) / len(weights)
        stds = []
        for g in valid:
            vals = [s for s in g.scores if s is not None]
            if len(vals) > 1:
                stds.append(float(np.std(vals)) < 1e-9)
        if stds:
            out["rubric/zero_std_frac_scored"] = sum(stds) / len(stds)
    return out
