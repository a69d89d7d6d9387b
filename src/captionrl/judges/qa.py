"""Caption-based question answering: a fixed text-only answerer sees only the caption.

Two uses of one answerer:
- evaluation (MoCo Rubric §A.3): each benchmark question is answered from a system's caption; accuracy
  per benchmark (``captionrl.eval.qa``).
- the answerability reward (CapRL, the baseline of LineupRL Table 4): ``QAJudge`` samples questions of
  the item *with replacement*, shuffles their options, adds a "cannot answer" option, and rewards the
  caption with the answerer's accuracy. Draws are seeded by ``(seed, item)`` so the G captions of one
  group face the same questions in the same option order, and the draws are recorded in every judgment.

Answers are read by letter scoring (``backend.choose``): one forward pass, no parsing, and the answerer
never sees the image.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from captionrl.backends.base import Backend, ChoiceResult, option_letters
from captionrl.config import help_field
from captionrl.errors import ConfigError, DataError
from captionrl.judges.base import Columns, require_columns, unscored
from captionrl.types import Judgment

CANNOT_ANSWER = "Cannot be answered from the description"

PROMPT = (
    "Question about {a_subject}: {question}\nOptions:\n{options}\n\n"
    "You cannot see the {subject}. All you know about it is this description:\n\"{caption}\"\n\n"
    "Answer the question using only the description. Answer with the letter of the correct option only."
)


@dataclass(frozen=True)
class MCQuestion:
    """A multiple-choice question; ``answer`` indexes ``options``."""

    question: str
    options: tuple[str, ...]
    answer: int
    qid: str = ""

    @property
    def answer_text(self) -> str:
        return self.options[self.answer]


def to_question(rec: Mapping[str, Any] | MCQuestion, where: str = "question") -> MCQuestion:
    """Validate a question record ``{question, options|choices, answer}``; the answer may be a letter,
    an index or the option text."""
    if isinstance(rec, MCQuestion):
        return rec
    if not isinstance(rec, Mapping):
        raise DataError(where, rec, "must be a mapping", 'write {"question": ..., "options": [...], "answer": ...}')
    q = rec.get("question")
    opts = rec.get("options", rec.get("choices"))
    ans = rec.get("answer")
    if not isinstance(q, str) or not q.strip():
        raise DataError(f"{where}.question", q, "is missing or empty", "give the question text")
    if not isinstance(opts, Sequence) or isinstance(opts, str) or not 2 <= len(opts) <= 25:
        raise DataError(f"{where}.options", opts, "needs a list of 2..25 options", "give the answer options as a list")
    options = tuple(str(o) for o in opts)
    index = _answer_index(ans, options)
    if index is None:
        raise DataError(f"{where}.answer", ans, f"matches none of the options {list(options)}",
                        "give the answer as the option's letter (A..), its 0-based index, or its exact text")
    qid = str(rec.get("qid", rec.get("question_id", "")))
    return MCQuestion(q.strip(), options, index, qid)


def _answer_index(ans: Any, options: tuple[str, ...]) -> int | None:
    if isinstance(ans, bool):
        return None
    if isinstance(ans, int):
        return ans if 0 <= ans < len(options) else None
    if not isinstance(ans, str):
        return None
    text = ans.strip()
    lowered = [o.strip().lower() for o in options]
    if text.lower() in lowered:
        return lowered.index(text.lower())
    if len(text) == 1 and text.isalpha():
        i = ord(text.upper()) - ord("A")
        return i if 0 <= i < len(options) else None
    return None


def render_prompt(question: MCQuestion, caption: str, subject: str = "image") -> list[dict[str, Any]]:
    """The answerer's prompt; ``subject`` names what was described (image; time series for LineupRL)."""
    labels = option_letters(len(question.options))
    options = "\n".join(f"{lab}. {o}" for lab, o in zip(labels, question.options, strict=True))
    article = "an" if subject[:1].lower() in "aeiou" else "a"
    body = PROMPT.format(question=question.question, options=options, caption=caption.strip() or "(no description)",
                         subject=subject, a_subject=f"{article} {subject}")
    return [{"role": "user", "content": body}]


@dataclass(frozen=True)
class Answer:
    """The answerer's choice for one (caption, question): ``correct`` is ``None`` when unscored."""

    choice: int | None
    correct: bool | None
    probs: dict[str, float] | None
    method: str
    error: str | None = None


class CaptionAnswerer:
    """The fixed text-only answerer: letter scoring over each question's options."""

    def __init__(self, backend: Backend, subject: str = "image") -> None:
        self.backend = backend
        self.subject = subject

    def answer(self, captions: Sequence[str], questions: Sequence[MCQuestion]) -> list[Answer]:
        """Answer ``questions[i]`` from ``captions[i]``; questions with the same option count share a call."""
        if len(captions) != len(questions):
            raise DataError("questions", len(questions), f"{len(captions)} captions", "pass one question per caption")
        by_k: dict[int, list[int]] = defaultdict(list)
        for i, q in enumerate(questions):
            by_k[len(q.options)].append(i)
        out: list[Answer | None] = [None] * len(captions)
        for k, idx in by_k.items():
            labels = option_letters(k)
            results: list[ChoiceResult] = self.backend.choose(
                [render_prompt(questions[i], captions[i], self.subject) for i in idx], labels
            )
            for i, r in zip(idx, results, strict=True):
                if r.probs is None:
                    out[i] = Answer(None, None, None, r.method, error=r.error or "no probabilities")
                    continue
                choice = labels.index(r.choice)  # type: ignore[arg-type]
                out[i] = Answer(choice, choice == questions[i].answer, r.probs, r.method)
        return [a for a in out if a is not None]


@dataclass
class QAConfig:
    """The answerability (CapRL) reward's sampling."""

    n_questions: int = help_field(4, "questions drawn per caption (with replacement)")
    seed: int = help_field(0, "seed of the question draws and option shuffles (combined with the item id)")
    cannot_answer: bool = help_field(True, "add a 'cannot be answered from the description' option to every question")
    shuffle_options: bool = help_field(True, "shuffle the options of every drawn question")
    subject: str = help_field("image", "what the captions describe, as the answerer's prompt names it (image, time series)")

    def __post_init__(self) -> None:
        if self.n_questions < 1:
            raise ConfigError("qa.n_questions", self.n_questions, "must be >= 1", "set n_questions: 4")


class QAJudge:
    """Answerability reward: accuracy of the fixed answerer on the item's questions, from the caption alone.

    Columns: ``questions`` (per row a list of question records) and optionally ``id`` (the item key that
    seeds the draws; without it the questions themselves are hashed).
    """

    name = "qa"

    def __init__(self, backend: Backend, cfg: QAConfig | None = None) -> None:
        self.cfg = cfg or QAConfig()
        self.answerer = CaptionAnswerer(backend, self.cfg.subject)

    def draws(self, questions: Sequence[MCQuestion], item_key: str) -> tuple[list[MCQuestion], list[dict[str, Any]], str]:
        """The seeded sample of questions (shuffled options, extra option) for one item, and its record."""
        seed_text = f"{self.cfg.seed}|{item_key}"
        rng = random.Random(seed_text)
        drawn, log = [], []
        for _ in range(self.cfg.n_questions):
            qi = rng.randrange(len(questions))
            q = questions[qi]
            perm = list(range(len(q.options)))
            if self.cfg.shuffle_options:
                rng.shuffle(perm)
            options = [q.options[p] for p in perm]
            if self.cfg.cannot_answer:
                options.append(CANNOT_ANSWER)
            drawn.append(MCQuestion(q.question, tuple(options), perm.index(q.answer), q.qid))
            log.append({"q": qi, "perm": perm})
        return drawn, log, seed_text

    def judge(self, captions: Sequence[str], columns: Columns) -> list[Judgment]:
        n = len(captions)
        require_columns(columns, ["questions"], n, self.name)
        flat_caps: list[str] = []
        flat_qs: list[MCQuestion] = []
        meta: list[tuple[list[dict[str, Any]], str]] = []
        for row in range(n):
            raw = columns["questions"][row]
            if not raw:
                raise DataError(f"questions[{row}]", raw, "no questions for this item",
                                "give every item at least one question (or drop it)")
            qs = [to_question(r, f"questions[{row}][{j}]") for j, r in enumerate(raw)]
            key = str(columns["id"][row]) if "id" in columns else _hash(raw)
            drawn, log, seed_text = self.draws(qs, key)
            flat_caps.extend([captions[row]] * len(drawn))
            flat_qs.extend(drawn)
            meta.append((log, seed_text))
        answers = self.answerer.answer(flat_caps, flat_qs)
        out: list[Judgment] = []
        m = self.cfg.n_questions
        for row in range(n):
            block = answers[row * m : (row + 1) * m]
            log, seed_text = meta[row]
            failed = [a for a in block if a.correct is None]
            if failed:
                out.append(unscored(f"answerer failed on {len(failed)}/{m} questions: {failed[0].error}",
                                    draws=log, seed=seed_text))
                continue
            acc = sum(bool(a.correct) for a in block) / m
            abstain = sum(a.choice == len(q.options) - 1 for a, q in zip(block, flat_qs[row * m :], strict=False)) / m
            out.append(Judgment(
                score=acc, decision=[a.choice for a in block], method=block[0].method,
                extra={"accuracy": acc, "cannot_answer_rate": abstain if self.cfg.cannot_answer else 0.0,
                       "draws": log, "seed": seed_text},
            ))
        return out


def _hash(obj: Any) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]
