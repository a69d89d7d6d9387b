"""RubiCap rubrics: the schema, the JSONL store, rubrics from known facts, and the rubric judge.

A rubric is a list of weighted binary items ``{criterion, test, weight in {1,2,3}}``, schema-checked by
``validate_rubric``. Rubrics live in a JSONL store keyed by item id (``RubricStore``); an item whose writer
failed is stored as *unscored* (``None``). Building rubrics with a teacher committee and a writer model is
``captionrl.judges.rubric_build`` (``captionrl rubrics build``).

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

Synthetic scenes know their facts, so ``captionrl.domains.scenes.rubric_from_facts`` builds an exact rubric
without any writer; ``RubricItem`` itself is a plain value type of ``captionrl.types``.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from captionrl.backends.base import Backend, ChatRequest
from captionrl.config import help_field
from captionrl.errors import ConfigError, DataError
from captionrl.judges import prompts as P
from captionrl.judges.base import Columns, backend_error, require_columns, unscored
from captionrl.records import RecordWriter
from captionrl.types import Judgment, RubricItem

WEIGHTS = (1, 2, 3)

# ====================================================================== rubric items
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


# ====================================================================== rubric judge
JudgeMode = Literal["choose", "generate", "likelihood"]

DEFAULT_THRESHOLDS = {"choose": 0.5, "generate": 0.5, "likelihood": 1.4}
"""Decision thresholds: p(yes) for ``choose``; PMI per word for ``likelihood``. The likelihood default was
calibrated with the embedded SmolLM2 on synthetic scenes of seed 1 (true vs contradicting captions);
recalibrate with ``calibrate_threshold`` for another judge model."""


@dataclass
class RubricJudgeSettings:
    """How a rubric judge decides each criterion: the settings RubiCap's reward and MoCo's Judge share.
    ``FIELD_PREFIX`` is the config section that holds them, so errors name the field a user writes."""

    FIELD_PREFIX: ClassVar[str] = "judge"

    mode: str = help_field("likelihood", "choose (p(yes) of one reply token), generate (JSON decisions; servers, larger judges) or likelihood (PMI of the criterion after the caption; small judges such as SmolLM2)")
    decision: str = help_field("hard", "hard (each criterion 0/1, the paper) or soft (p(yes), or a sigmoid of the likelihood evidence: a denser signal for weak judges)")
    threshold: float | None = help_field(None, "decision threshold (null = the mode's default: choose 0.5, likelihood 1.4 PMI per word, calibrated for SmolLM2)")
    max_new_tokens: int = help_field(512, "generate mode: judge reply length")
    structured_output: str = help_field("none", "generate mode: ask the server to constrain each reply to the judgment JSON schema: none, json_schema (OpenAI/vLLM) or json_object (llama.cpp); in-process (hf) judges always decode under it; replies are parsed the same either way")
    temperature: float = help_field(0.0, "generate mode: sampling temperature of the judge's reply (0 = greedy); each sample's seed derives from the caption and rubric and is recorded in the judgment")

    def __post_init__(self) -> None:
        from captionrl.judges.roles import STRUCTURED_OUTPUTS

        f = self.FIELD_PREFIX
        if self.structured_output not in STRUCTURED_OUTPUTS:
            raise ConfigError(f"{f}.structured_output", self.structured_output, "unknown style",
                              f"use one of {', '.join(STRUCTURED_OUTPUTS)}")
        check_decision_rule(self.mode, self.decision, f)
        if self.temperature < 0:
            raise ConfigError(f"{f}.temperature", self.temperature, "must be >= 0", "use 0 (greedy) or e.g. 1.0")

    def rubric_judge(self, backend: Backend, *, store: RubricStore | None = None, name: str | None = None,
                     judge_class: type[RubricJudge] | None = None) -> RubricJudge:
        """The rubric judge these settings describe, on ``backend``: the one place a judge is built from them
        (the rubric reward family, RubiCap's end-of-run check, MoCo's Judge with ``judge_class``
        ``MocoRubricJudge``)."""
        return (judge_class or RubricJudge)(
            backend, mode=self.mode, decision=self.decision, threshold=self.threshold,  # type: ignore[arg-type]
            max_new_tokens=self.max_new_tokens, structured_output=self.structured_output,
            temperature=self.temperature, store=store, name=name)


def check_decision_rule(mode: str, decision: str, prefix: str = "judge") -> None:
    """A known mode and decision rule, and one the mode can give (generate replies are yes/no, never a
    probability); errors name ``<prefix>.mode`` / ``<prefix>.decision``."""
    if mode not in DEFAULT_THRESHOLDS:
        raise ConfigError(f"{prefix}.mode", mode, "unknown rubric judge mode", "use choose, generate or likelihood")
    if decision not in ("hard", "soft"):
        raise ConfigError(f"{prefix}.decision", decision, "unknown decision rule", "use hard or soft")
    if mode == "generate" and decision == "soft":
        raise ConfigError(f"{prefix}.decision", decision, "generate mode returns binary decisions only",
                          f"use {prefix}.decision: hard with {prefix}.mode: generate")


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
        structured_output: str = "none",
        temperature: float = 0.0,
    ) -> None:
        check_decision_rule(mode, decision)
        self.backend = backend
        self.mode = mode
        self.decision = decision
        self.threshold = DEFAULT_THRESHOLDS[mode] if threshold is None else float(threshold)
        self.store = store
        self.options = options
        self.max_new_tokens = max_new_tokens
        self.structured_output = structured_output
        self.temperature = float(temperature)
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
            return None, {}, f"loglikelihood failed: {backend_error(self.backend, 'no log-likelihood')}"
        pmi = [(a - b) / max(1, len(c.split())) for a, b, c in zip(lls, nulls, conts, strict=True)]  # type: ignore[operator]
        values = pmi if self.decision == "hard" else [_sigmoid(v - self.threshold) for v in pmi]
        return values, {"pmi_per_word": pmi}, None

    def generate_prompt(self, caption: str, rubric: Sequence[RubricItem]) -> list[dict[str, Any]]:
        crits = "\n".join(f"{i + 1}. {r.criterion} (test: {r.test})" for i, r in enumerate(rubric))
        return [{"role": "user", "content": P.JUDGE_GENERATE_TEMPLATE.format(caption=caption.strip(), criteria=crits)}]

    def _generate(self, caption: str, rubric: Sequence[RubricItem]) -> tuple[list[bool] | None, dict, str | None]:
        from captionrl.judges.roles import judgment_schema, structured

        prompt = self.generate_prompt(caption, rubric)
        seed = zlib.crc32(json.dumps(prompt).encode()) if self.temperature > 0 else None  # same question, same sample
        gen = self.backend.generate([ChatRequest(prompt, max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                                                 seed=seed, **structured(judgment_schema(len(rubric)), self.structured_output))])[0]
        extra: dict[str, Any] = {"raw": gen.text, **({"seed": seed} if seed is not None else {})}
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


# ====================================================================== calibration
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
