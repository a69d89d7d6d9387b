"""Verified questions about a series: the data of the answerability baseline (LineupRL Table 4, after CapRL).

The baseline rewards a caption with a frozen LLM's accuracy on the series' questions answered from the
caption alone (``judges.qa.QAJudge``). Its questions are made here in two steps, as the paper's:

1. **generation**: ``rules`` writes multiple-choice questions from the values in code (overall direction,
   the quarter of the maximum and of the minimum, the approximate first, last, maximum and minimum value),
   so every answer is exact; ``llm`` asks the frozen model to write them from the printed values (its
   replies are parsed line by line as JSON; a malformed question is dropped and counted).
2. **verification** by the frozen answerer: a question is kept only if the answerer picks the right option
   when it reads the series' values (the question is answerable and its key is right) and, with
   ``blind_check``, does *not* pick it with no description at all (the question is not a guess).
   Options are shuffled (seeded per item and question) before each check, so a model's letter bias cannot
   pass a question.

A series enters the training set only with at least ``min_verified`` verified questions (the paper: two),
so the answerability model trains on fewer series; what was kept and dropped is recorded per item.

A request that *failed* (the writer's or the answerer's backend returned an error) is not a series with no
questions: ``Made.error`` and a check's ``error`` say so, and the caller must not persist such an item, so
that the next run retries it instead of dropping the series for good after one outage.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from captionrl.backends.base import Backend, ChatRequest
from captionrl.config import help_field
from captionrl.errors import ConfigError, DataError
from captionrl.judges.qa import CaptionAnswerer, MCQuestion, to_question

logger = logging.getLogger(__name__)

GENERATORS = ("rules", "llm")

LLM_PROMPT = (
    "Here is a time series of {n} values, in order:\n{values}\n\n"
    "Write {k} multiple-choice questions about this series that a good description of its chart would let a "
    "reader answer (trend, where the peaks and troughs are, approximate key values). Give each question 4 "
    "options, exactly one correct. Reply with one JSON object per line and nothing else, like:\n"
    '{{"question": "Where is the maximum?", "options": ["start", "middle", "end", "nowhere"], "answer": "A"}}'
)


@dataclass
class SeriesQuestionsConfig:
    """How the answerability baseline's questions are written and verified."""

    generator: str = help_field("rules", "rules (exact questions computed from the values) or llm (the frozen model writes them from the printed values)")
    n_generated: int = help_field(6, "questions written per series (rules: the first n of its templates)")
    verify: bool = help_field(True, "keep only questions the frozen answerer gets right from the series' values")
    blind_check: bool = help_field(True, "also drop questions the answerer gets right with no description at all (guessable)")
    min_verified: int = help_field(2, "series with fewer verified questions leave the training set (the paper: 2)")
    max_new_tokens: int = help_field(400, "llm generator: tokens for the reply")

    def __post_init__(self) -> None:
        if self.generator not in GENERATORS:
            raise ConfigError("reward.answerability.generator", self.generator, "unknown question generator",
                              "use rules or llm")
        if self.n_generated < 1 or self.min_verified < 1 or self.min_verified > self.n_generated:
            raise ConfigError("reward.answerability.n_generated/min_verified", (self.n_generated, self.min_verified),
                              "need 1 <= min_verified <= n_generated", "set e.g. n_generated: 6, min_verified: 2")


# ---------------------------------------------------------------------- generation
def _fmt(x: float, precision: int) -> str:
    return f"{x:.{precision}f}"


def _value_options(true: float, spread: float, precision: int) -> list[str]:
    """The true value first, then three distractors a clear step away (distinct at ``precision``)."""
    step = spread if spread > 0 else max(abs(true), 1.0)
    opts = [_fmt(true, precision)]
    for m in (0.5, -0.5, 1.0, -1.0, 1.5, -1.5, 2.0):
        text = _fmt(true + m * step, precision)
        if text not in opts:
            opts.append(text)
        if len(opts) == 4:
            break
    return opts


QUARTERS = ("the first quarter", "the second quarter", "the third quarter", "the last quarter")


def rule_questions(values: Sequence[float], precision: int = 2) -> list[MCQuestion]:
    """Questions whose answers are computed from ``values`` (answer index 0; the checks shuffle options)."""
    v = np.asarray(values, dtype=float)
    n = len(v)
    spread = float(v.max() - v.min())
    change = float(v[-1] - v[0])
    direction = ("It ends about where it starts" if abs(change) < 0.15 * spread or spread == 0
                 else "It rises overall" if change > 0 else "It falls overall")
    dir_opts = [direction, *[o for o in ("It rises overall", "It falls overall", "It ends about where it starts")
                             if o != direction]]

    def quarter(i: int) -> list[str]:
        q = QUARTERS[min(3, i * 4 // n)]
        return [q, *[x for x in QUARTERS if x != q]]

    def q(text: str, options: list[str], tag: str) -> MCQuestion:
        return MCQuestion(text, tuple(options), 0, qid=tag)

    return [
        q("What is the overall direction of the series from its first to its last value?", dir_opts, "direction"),
        q("In which part of the series is its maximum?", quarter(int(v.argmax())), "argmax"),
        q("In which part of the series is its minimum?", quarter(int(v.argmin())), "argmin"),
        q("About what is the maximum value?", _value_options(float(v.max()), spread, precision), "max"),
        q("About what is the minimum value?", _value_options(float(v.min()), spread, precision), "min"),
        q("About what is the last value?", _value_options(float(v[-1]), spread, precision), "last"),
        q("About what is the first value?", _value_options(float(v[0]), spread, precision), "first"),
    ]


def parse_llm_questions(text: str | None, where: str) -> tuple[list[MCQuestion], int]:
    """Questions in a model's reply (one JSON object per line); returns (valid questions, malformed lines)."""
    out: list[MCQuestion] = []
    bad = 0
    for j, line in enumerate((text or "").splitlines()):
        line = line.strip().strip(",")
        if not line.startswith("{"):
            continue
        try:
            out.append(to_question(json.loads(line), f"{where}[{j}]"))
        except (json.JSONDecodeError, DataError):
            bad += 1
    return out, bad


# ---------------------------------------------------------------------- verification
def _shuffled(q: MCQuestion, rng: random.Random) -> MCQuestion:
    perm = list(range(len(q.options)))
    rng.shuffle(perm)
    return MCQuestion(q.question, tuple(q.options[p] for p in perm), perm.index(q.answer), q.qid)


def values_description(series_text: str) -> str:
    """What the verification step shows the answerer in place of a caption: the values themselves."""
    return f"The series' values, in order: {series_text}"


class Made(NamedTuple):
    """One series' generated questions: the valid ones, the malformed count, and the request's error
    (``None`` when the writer answered; set when the request failed: the questions are unknown, not none)."""

    questions: list[MCQuestion]
    malformed: int
    error: str | None = None


class SeriesQuestionMaker:
    """Writes and verifies each series' questions with one frozen model (the reward's answerer)."""

    def __init__(self, backend: Backend, cfg: SeriesQuestionsConfig, seed: int = 0, precision: int = 2) -> None:
        self.backend = backend
        self.cfg = cfg
        self.seed = seed
        self.precision = precision
        self.answerer = CaptionAnswerer(backend, subject="time series")

    def generate(self, rows: Sequence[dict[str, Any]]) -> list[Made]:
        """A ``Made`` per row (columns ``item_id``, ``series``, ``series_text``)."""
        if self.cfg.generator == "rules":
            return [Made(rule_questions(r["series"], self.precision)[: self.cfg.n_generated], 0) for r in rows]
        reqs = [ChatRequest([{"role": "user", "content": LLM_PROMPT.format(n=len(r["series"]), values=r["series_text"],
                                                                          k=self.cfg.n_generated)}],
                            max_new_tokens=self.cfg.max_new_tokens, temperature=0.0, seed=self.seed) for r in rows]
        out = []
        for r, g in zip(rows, self.backend.generate(reqs), strict=True):
            if g.text is None:  # the request failed: not "zero questions"
                out.append(Made([], 0, error=f"question generation failed: {g.error or 'no reply'}"))
                continue
            qs, bad = parse_llm_questions(g.text, f"questions[{r['item_id']}]")
            out.append(Made(qs[: self.cfg.n_generated], bad))
        return out

    def verify(self, rows: Sequence[dict[str, Any]], questions: Sequence[Sequence[MCQuestion]]) -> list[list[dict[str, Any]]]:
        """Per row, one check record per question: ``with_values`` / ``blind`` correctness (None: unscored)
        and ``kept``. A question the answerer could not score is not kept, and its record carries the
        answerer's ``error`` (a failed check, to retry; not a failed question)."""
        flat: list[tuple[int, int, MCQuestion, MCQuestion]] = []
        for i, (r, qs) in enumerate(zip(rows, questions, strict=True)):
            for j, q in enumerate(qs):
                rng = random.Random(f"{self.seed}|{r['item_id']}|{j}")
                flat.append((i, j, _shuffled(q, rng), _shuffled(q, rng)))
        checks: list[list[dict[str, Any]]] = [[{} for _ in qs] for qs in questions]
        if not self.cfg.verify:
            for i, qs in enumerate(questions):
                checks[i] = [{"with_values": None, "blind": None, "kept": True} for _ in qs]
            return checks
        seen = self.answerer.answer([values_description(rows[i]["series_text"]) for i, *_ in flat], [a for *_, a, _ in flat])
        blind = (self.answerer.answer([""] * len(flat), [b for *_, b in flat]) if self.cfg.blind_check
                 else [None] * len(flat))
        for (i, j, *_), s, b in zip(flat, seen, blind, strict=True):
            b_ok = None if b is None else b.correct
            kept = s.correct is True and (not self.cfg.blind_check or b_ok is False)
            checks[i][j] = {"with_values": s.correct, "blind": b_ok, "kept": kept}
            error = s.error if s.correct is None else (b.error if b is not None and b_ok is None else None)
            if error:
                checks[i][j]["error"] = error
        return checks


def question_record(q: MCQuestion) -> dict[str, Any]:
    """A question as the ``questions`` column holds it (``judges.qa.to_question`` reads it back)."""
    return {"question": q.question, "options": list(q.options), "answer": q.answer, "qid": q.qid}


def attach_questions(rows: dict[str, list[dict[str, Any]]], cfg: SeriesQuestionsConfig, backend: Backend,
                     out: Any, *, seed: int = 0, precision: int = 2,
                     batch: int = 16) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    """The answerability family's data: verified questions for every train and val series.

    Returns ``(rows, stats)``: new rows per split, each with a ``questions`` column; series with fewer than
    ``min_verified`` verified questions leave their split (``rows`` itself is not changed). Questions are
    written to ``out/questions.jsonl`` (resumable: a rerun reuses every item's questions) with the counts in
    ``questions_summary.json``. An item whose generation or verification request failed is not written (an
    outage is not "no questions"): it sits out this run and the next run retries it."""
    from pathlib import Path

    from captionrl.records import RecordWriter, write_json

    out = Path(out)
    maker = SeriesQuestionMaker(backend, cfg, seed=seed, precision=precision)
    stats: dict[str, Any] = {"generator": cfg.generator, "verify": cfg.verify, "blind_check": cfg.blind_check,
                             "min_verified": cfg.min_verified}
    failed: dict[str, str] = {}  # item -> error of a request that failed: not persisted, retried next run
    result = {split: list(split_rows) for split, split_rows in rows.items()}
    with RecordWriter(out / "questions.jsonl", key_field="item_id") as writer:
        for split in ("train", "val"):
            split_rows = rows.get(split) or []
            todo = [r for r in split_rows if not writer.has(r["item_id"])]
            for start in range(0, len(todo), batch):
                chunk = todo[start: start + batch]
                made = maker.generate(chunk)
                checks = maker.verify(chunk, [m.questions for m in made])
                for r, m, ch in zip(chunk, made, checks, strict=True):
                    error = m.error or next((c["error"] for c in ch if c.get("error")), None)
                    if error:
                        failed[r["item_id"]] = error
                        continue
                    writer.write({"item_id": r["item_id"], "split": split,
                                  "generated": [question_record(q) for q in m.questions], "malformed": m.malformed,
                                  "checks": ch,
                                  "verified": [question_record(q) for q, c in zip(m.questions, ch, strict=True) if c["kept"]]})
            recs = {rec["item_id"]: rec for rec in writer.records()}
            written = [r for r in split_rows if r["item_id"] in recs]  # failed ones sit this run out (retried next run)
            kept = [{**r, "questions": recs[r["item_id"]]["verified"]} for r in written
                    if len(recs[r["item_id"]]["verified"]) >= cfg.min_verified]
            stats[split] = {"series": len(split_rows), "kept": len(kept),
                            "generated": sum(len(recs[r["item_id"]]["generated"]) for r in written),
                            "verified": sum(len(recs[r["item_id"]]["verified"]) for r in written),
                            "malformed": sum(recs[r["item_id"]]["malformed"] for r in written)}
            result[split] = kept
    stats["failed"] = {"series": len(failed), "last_error": next(reversed(failed.values()), None)}
    write_json(out / "questions_summary.json", stats)
    if failed:
        logger.warning(f"answerability questions: {len(failed)} series not written because a request failed "
                       f"({stats['failed']['last_error']}); the next run retries them")
    if "train" in stats:
        logger.info(f"answerability questions: train {stats['train']['kept']}/{stats['train']['series']} series kept "
                    f"({stats['train']['verified']}/{stats['train']['generated']} questions verified)")
    if not result.get("train"):
        raise DataError("reward.answerability.min_verified", cfg.min_verified,
                        f"no training series has {cfg.min_verified} verified questions ({stats.get('train')}; "
                        f"{len(failed)} series failed: {stats['failed']['last_error']})",
                        "lower reward.answerability.min_verified, raise n_generated, set blind_check: false, or use a "
                        "stronger verifier (see questions.jsonl in the run folder)")
    return result, stats
