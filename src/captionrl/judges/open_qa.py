"""Open-ended caption QA: a fixed text-only answerer writes a short answer from the caption alone.

The open-ended counterpart of ``captionrl.judges.qa`` (which reads letters of multiple-choice options):
TextVQA / DocVQA / ChartQA questions have no options, so the answerer generates (greedy, a few tokens)
and the answer is scored by the benchmark's own rule (``captionrl.judges.answer_metrics``). The answerer
never sees the image, so the score measures what the caption tells a reader. A failed model call leaves
the answer unscored (``score=None``), never 0; an empty or wrong answer is a real answer and scores 0.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from captionrl.backends.base import Backend, ChatRequest
from captionrl.errors import DataError
from captionrl.judges.answer_metrics import all_scores, check_metric, score_answer

OPEN_PROMPT = (
    "Description of an image: \"{caption}\"\n"
    "Question: {question}\n"
    "Answer with a single word or phrase."
)
SHOTS = (
    ("A blue kite flies over a sandy beach.", "What colour is the kite?", "blue"),
    ("A shop window with the word SALE painted in large letters.", "What word is on the window?", "SALE"),
)
"""Worked examples shown as earlier chat turns (``few_shot``): the same for every system and question, so
they bias no system, and they teach a small answerer the reply form (a bare answer, not a sentence that
exact-match scoring would reject): with the embedded SmolLM2-135M they turn most answers that captions
state into exact matches, and leave captions that do not state the answers at 0."""
MAX_NEW_TOKENS = 16

_PREFIX = re.compile(r"^\s*(?:the\s+)?(?:final\s+)?answer\s*(?:is)?\s*[:\-]?\s*", re.IGNORECASE)
_QUOTED = re.compile(r'"([^"]+)"')


@dataclass(frozen=True)
class OpenQuestion:
    """An open-ended question with its reference answers and the metric its benchmark scores by."""

    question: str
    answers: tuple[str, ...]
    metric: str = "exact_match"
    qid: str = ""


def to_open_question(rec: Mapping[str, Any] | OpenQuestion, where: str = "question",
                     default_metric: str = "exact_match") -> OpenQuestion:
    """Validate ``{question, answers: [..] | answer, metric?, qid?}`` (answers may be numbers)."""
    if isinstance(rec, OpenQuestion):
        return rec
    if not isinstance(rec, Mapping):
        raise DataError(where, rec, "must be a mapping", 'write {"question": ..., "answers": [...]}')
    q = rec.get("question")
    if not isinstance(q, str) or not q.strip():
        raise DataError(f"{where}.question", q, "is missing or empty", "give the question text")
    raw = rec.get("answers", rec.get("answer"))
    if isinstance(raw, (str, int, float)) and not isinstance(raw, bool):
        raw = [raw]
    if (not isinstance(raw, Sequence) or not raw
            or not all(isinstance(a, (str, int, float)) and not isinstance(a, bool) for a in raw)):
        raise DataError(f"{where}.answers", raw, "needs one or more reference answers (text or numbers)",
                        'write "answers": ["..."] (or "answer": "...")')
    answers = tuple(str(a).strip() for a in raw)
    metric = check_metric(str(rec.get("metric", default_metric)), f"{where}.metric")
    qid = str(rec.get("qid", rec.get("question_id", "")))
    return OpenQuestion(q.strip(), answers, metric, qid)


def render_open_prompt(question: OpenQuestion, caption: str, few_shot: bool = True) -> list[dict[str, Any]]:
    """The answerer's chat: optional worked examples (``SHOTS``) as earlier turns, then the question."""
    messages: list[dict[str, Any]] = []
    for cap, q, a in SHOTS if few_shot else ():
        messages += [{"role": "user", "content": OPEN_PROMPT.format(question=q, caption=cap)},
                     {"role": "assistant", "content": a}]
    body = OPEN_PROMPT.format(question=question.question, caption=caption.strip() or "(no description)")
    return [*messages, {"role": "user", "content": body}]


def clean_answer(text: str) -> str:
    """The answer part of a reply: its first non-empty line, without an "Answer:" lead, the one quoted span
    of a sentence that quotes its answer (``The answer is "exit".``), and without a final period."""
    line = next((ln for ln in text.strip().splitlines() if ln.strip()), "")
    line = _PREFIX.sub("", line).strip()
    quoted = _QUOTED.findall(line)
    if len(quoted) == 1:
        line = quoted[0]
    line = line.strip().strip('"').strip()
    return line[:-1].rstrip() if line.endswith(".") else line


@dataclass(frozen=True)
class OpenAnswer:
    """One written answer: ``score`` by the question's metric, ``None`` (with ``error``) when unscored."""

    prediction: str | None
    score: float | None
    raw: str | None = None
    scores: dict[str, float] = field(default_factory=dict)
    error: str | None = None


class OpenAnswerer:
    """The fixed text-only answerer for open-ended questions: greedy, short generations."""

    def __init__(self, backend: Backend, max_new_tokens: int = MAX_NEW_TOKENS, few_shot: bool = True) -> None:
        self.backend = backend
        self.max_new_tokens = max_new_tokens
        self.few_shot = few_shot

    def answer(self, captions: Sequence[str], questions: Sequence[OpenQuestion]) -> list[OpenAnswer]:
        """Answer ``questions[i]`` from ``captions[i]`` in one batched generate call."""
        if len(captions) != len(questions):
            raise DataError("questions", len(questions), f"{len(captions)} captions", "pass one question per caption")
        requests = [ChatRequest(render_open_prompt(q, c, self.few_shot), max_new_tokens=self.max_new_tokens, temperature=0.0)
                    for c, q in zip(captions, questions, strict=True)]
        out = []
        for q, gen in zip(questions, self.backend.generate(requests), strict=True):
            if gen.text is None:
                out.append(OpenAnswer(None, None, None, error=gen.error or "no text"))
                continue
            pred = clean_answer(gen.text)
            out.append(OpenAnswer(pred, score_answer(q.metric, pred, q.answers), gen.text,
                                  all_scores(pred, q.answers)))
        return out
