"""Caption-based QA (MoCo Rubric §A.3): a fixed text-only answerer sees only each system's caption.

Two question formats, one answerer backend:
- multiple choice (``choice``): the answerer's letter is read by scoring (``judges.qa``); accuracy.
- open-ended (``open``): the answerer writes a short answer (greedy, ``max_new_tokens``), scored by the
  benchmark's own rule (``judges.answer_metrics``): exact match, ANLS (DocVQA), relaxed accuracy
  (ChartQA) or VQA accuracy (TextVQA).

Question files (``--qa NAME=PATH``; the name is the benchmark's column) are either JSONL, one question a
line: ``{id | image_id, question, options | choices, answer, qid?}`` (choice) or ``{id, question,
answers | answer, metric?, qid?}`` (open), or a benchmark's own JSON file (TextVQA_0.5.1_val.json,
DocVQA val_v1.0.json, ChartQA test_*.json: ``domains.qa_benchmarks``), whose image files are checked
before any model loads. ``id`` names the image, matching the ``id`` of the caption files. ``format``
``auto`` takes each question as its file gives it; ``open`` also asks multiple-choice questions open
(the correct option's text is the reference, scored by exact match). One score per benchmark and metric
(``acc/B`` or e.g. ``anls/B``), averaged over those columns in ``accuracy``; an unscored answer (backend
failure) is excluded and counted, never scored 0. Offline default: easy-vqa test images (a shape and
colour each) with questions built from their QA pairs, and demo systems (reference, other item, generic,
empty captions) so the run checks the answerer itself: the reference caption must beat the others.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from captionrl.config import help_field
from captionrl.errors import ConfigError, DataError
from captionrl.eval.common import (
    Systems,
    backend_from_spec,
    check_spec,
    demo_systems,
    load_systems,
    offline_items,
)
from captionrl.eval.result import EvalResult, result_text, write_result
from captionrl.judges.answer_metrics import SHORT_NAMES
from captionrl.judges.open_qa import MAX_NEW_TOKENS, OpenAnswerer, OpenQuestion, to_open_question
from captionrl.judges.qa import CaptionAnswerer, MCQuestion, to_question
from captionrl.records import RecordWriter, check_id, read_jsonl

PROTOCOL = "qa"
KNOWN_BENCHMARKS = ("captionqa", "chartqa", "textvqa", "docvqa", "blink")
FORMATS = ("auto", "choice", "open")


# ---------------------------------------------------------------------- question files
def _parse_question(rec: Mapping[str, Any], where: str) -> MCQuestion | OpenQuestion:
    """A record with options is multiple choice; one without is open-ended."""
    if "options" in rec or "choices" in rec:
        return to_question(rec, where)
    return to_open_question(rec, where)


def load_qa_file(path: str | Path, benchmark: str, images: str | None = None) -> list[dict[str, Any]]:
    """Read a benchmark's questions: ``[{id, qid, question: MCQuestion | OpenQuestion, benchmark}]``.

    ``.json`` files are a benchmark's released layout (``domains.qa_benchmarks``; ``images`` is their
    image folder); anything else is JSONL, one question a line."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"qa.{benchmark}", str(path), "file not found",
                        "give a JSONL file with {id, question, options, answer} or {id, question, answers} lines, "
                        "or a benchmark's JSON file (TextVQA, DocVQA, ChartQA)")
    if p.suffix.lower() == ".json":
        from captionrl.domains.qa_benchmarks import load_benchmark

        return [{"id": r["id"], "qid": r["qid"], "image": r["image"], "benchmark": benchmark,
                 "question": to_open_question(r, f"{p.name}:qid {r['qid']}")}
                for r in load_benchmark(p, images=images, benchmark=benchmark)]
    if images is not None:
        raise ConfigError("qa_images", f"{benchmark}={images}", "only benchmark JSON files take an image folder",
                          "drop it (JSONL question files are joined to captions by id)")
    out = []
    for n, rec in enumerate(read_jsonl(p)):
        image_id = rec.get("id", rec.get("image_id"))
        if image_id is None:
            raise DataError(f"{p.name}:line {n + 1}.id", None, "no 'id' (or 'image_id')",
                            "name the image each question is about, matching the caption files' ids")
        check_id(image_id, f"{p.name}:line {n + 1}.id")
        q = _parse_question(rec, f"{p.name}:line {n + 1}")
        out.append({"id": str(image_id), "qid": q.qid or str(n), "question": q, "benchmark": benchmark})
    if not out:
        raise DataError(f"qa.{benchmark}", str(path), "holds no questions", "check the file")
    return out


def _name_path(spec: str, field: str, example: str) -> tuple[str, str]:
    if "=" not in spec:
        raise ConfigError(field, spec, "is not NAME=PATH",
                          f"write e.g. {example} (names like {', '.join(KNOWN_BENCHMARKS)})")
    name, path = spec.split("=", 1)
    return name, path


def parse_qa_specs(specs: Sequence[str], image_specs: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Every question of the ``NAME=PATH`` files; ``image_specs`` (``NAME=DIR``) name benchmark image folders."""
    names = [_name_path(s, "qa", "chartqa=data/chartqa.jsonl")[0] for s in specs]
    folders: dict[str, str] = {}
    for spec in image_specs:
        name, folder = _name_path(spec, "qa_images", "textvqa=data/textvqa/train_images")
        if name not in names:
            raise ConfigError("qa_images", spec, f"names no question file (given: {', '.join(names) or 'none'})",
                              "use the NAME of a --qa NAME=PATH entry")
        folders[name] = folder
    questions = []
    for spec in specs:
        name, path = _name_path(spec, "qa", "chartqa=data/chartqa.jsonl")
        questions.extend(load_qa_file(path, name, folders.get(name)))
    return questions


def item_questions(items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for it in items:
        for j, rec in enumerate(it["questions"]):
            q = _parse_question(rec, f"{it['id']}.questions[{j}]")
            out.append({"id": str(it["id"]), "qid": q.qid or str(j), "question": q,
                        "benchmark": it.get("benchmark", "default")})
    return out


def apply_format(questions: list[dict[str, Any]], fmt: str) -> list[dict[str, Any]]:
    """``open`` asks multiple-choice questions open (reference: the correct option's text, exact match);
    ``choice`` refuses open-ended questions (they have no options to choose from)."""
    if fmt == "choice":
        bad = next((q for q in questions if isinstance(q["question"], OpenQuestion)), None)
        if bad is not None:
            raise ConfigError("format", fmt, f"benchmark {bad['benchmark']!r} has open-ended questions (no options)",
                              "set format=open (or auto) to score written answers by the benchmark's metric")
        return questions
    if fmt == "open":
        return [{**q, "question": OpenQuestion(q["question"].question, (q["question"].answer_text,), "exact_match",
                                               q["question"].qid)}
                if isinstance(q["question"], MCQuestion) else q for q in questions]
    return questions


# ---------------------------------------------------------------------- the protocol
@dataclass
class QAEvalConfig:
    """The caption-based QA protocol's settings (saved into summary.json)."""

    captions: list[str] = help_field([], "caption files, one per system; empty: demo systems on offline data")
    qa: list[str] = help_field([], "question files NAME=PATH (JSONL {id, question, options, answer}); empty: offline data")
    out: str = help_field("runs/eval-qa", "output folder (rerun with the same folder to resume)")
    demo_items: int = help_field(12, "offline items when no question files are given")
    seed: int = help_field(0, "seed of the offline item selection and distractor options")
    limit: int | None = help_field(None, "at most this many questions per benchmark")
    batch: int = help_field(16, "questions per answerer call")
    answerer: str = help_field("hf:embedded", "answerer backend spec: hf:embedded, hf:PATH, openai:URL#MODEL, vllm:MODEL (+ ,key=value)")
    format: str = help_field("auto", "auto (as each file gives its questions), choice (multiple choice only) or open (written answers; multiple-choice questions asked open, exact match on the correct option)")
    qa_images: list[str] = help_field([], "image folders NAME=DIR for benchmark JSON files (default: where the benchmark keeps them beside its JSON)")
    max_new_tokens: int = help_field(MAX_NEW_TOKENS, "longest written answer (tokens) for open-ended questions (greedy)")
    few_shot: bool = help_field(True, "open-ended: show the answerer two fixed worked examples first (teaches a small model to reply with a bare answer)")

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise ConfigError("batch", self.batch, "must be at least 1", "set batch=16")
        if self.format not in FORMATS:
            raise ConfigError("format", self.format, "unknown question format", f"use one of {', '.join(FORMATS)}")
        if self.max_new_tokens < 1:
            raise ConfigError("max_new_tokens", self.max_new_tokens, "must be at least 1", f"set max_new_tokens={MAX_NEW_TOKENS}")
        check_spec("answerer", self.answerer)


CONFIG = QAEvalConfig


def run(cfg: QAEvalConfig, *, answerer: CaptionAnswerer | None = None, open_answerer: OpenAnswerer | None = None,
        systems: Systems | None = None) -> EvalResult:
    """Every system's captions answer every question; ``answerer`` (multiple choice), ``open_answerer``
    (written answers) and ``systems`` replace the configured ones. All questions and caption files are
    read and checked before the answerer backend is built (and it is built only if something is left)."""
    if cfg.qa:
        questions = parse_qa_specs(cfg.qa, cfg.qa_images)
        items = None
    else:
        if cfg.qa_images:
            raise ConfigError("qa_images", cfg.qa_images, "image folders need benchmark files",
                              "pass the benchmark JSON files too (--qa NAME=PATH)")
        items = offline_items(cfg.demo_items, seed=cfg.seed)
        questions = item_questions(items)
    questions = apply_format(questions, cfg.format)
    if systems is None:
        if cfg.captions:
            systems = load_systems(cfg.captions)
        elif items is not None:
            systems = demo_systems(items)
        else:
            raise ConfigError("captions", [], "question files need caption files", "pass captions (--captions FILE ...)")
    if cfg.limit is not None:
        seen: dict[str, int] = defaultdict(int)
        kept = []
        for q in questions:
            if seen[q["benchmark"]] < cfg.limit:
                kept.append(q)
                seen[q["benchmark"]] += 1
        questions = kept
    out = Path(cfg.out)
    missing = 0
    with RecordWriter(out / "records.jsonl") as writer:
        todo_mc: list[tuple[str, str, dict[str, Any], str]] = []
        todo_open: list[tuple[str, str, dict[str, Any], str]] = []
        for name, caps in systems.items():
            for q in questions:
                if q["id"] not in caps:
                    missing += 1
                    continue
                is_open = isinstance(q["question"], OpenQuestion)
                key = f"{name}|{q['benchmark']}|{q['id']}|{q['qid']}" + ("|open" if is_open else "")
                if not writer.has(key):
                    (todo_open if is_open else todo_mc).append((key, name, q, caps[q["id"]]["caption"]))
        backend: Any = None
        if todo_mc and answerer is None:
            backend = backend_from_spec(cfg.answerer)
            answerer = CaptionAnswerer(backend)
        if todo_open and open_answerer is None:
            backend = backend or (answerer.backend if answerer is not None else backend_from_spec(cfg.answerer))
            open_answerer = OpenAnswerer(backend, cfg.max_new_tokens, cfg.few_shot)
        if todo_mc:
            _answer_choice(todo_mc, answerer, writer, cfg.batch)  # type: ignore[arg-type]
        if todo_open:
            _answer_open(todo_open, open_answerer, writer, cfg.batch)  # type: ignore[arg-type]
        records = writer.records()
    rows, columns, benches, metrics = aggregate(records, list(systems))
    notes = [f"{sum(_score(r) is None for r in records)} answers unscored (excluded)",
             f"{missing} (system, question) pairs without a caption for the question's image"]
    if metrics:
        notes.append("accuracy: the mean over the benchmark columns, each by its own metric ("
                     + ", ".join(f"{c}: {m}" for c, m in metrics.items()) + ")")
    better: dict[str, str | None] = {c: "higher" for c in columns if c not in ("questions", "unscored")}
    better.update(questions=None, unscored="lower")
    used = answerer or open_answerer
    result = EvalResult(PROTOCOL, rows, columns, better=better, config=asdict(cfg), records=str(out / "records.jsonl"),
                        notes=notes, extra={"benchmarks": benches, "metrics": metrics,
                                            "answerer": getattr(used.backend, "name", "?") if used else cfg.answerer})
    return write_result(result, out)


Todo = list[tuple[str, str, dict[str, Any], str]]


def _answer_batches(todo: Todo, answerer: CaptionAnswerer | OpenAnswerer, writer: RecordWriter, batch: int,
                    desc: str, record: Callable[[dict[str, Any], Any], dict[str, Any]]) -> None:
    """Ask ``answerer`` ``batch`` questions at a time and write one record per answer: the keys every
    record shares, then ``record(question, answer)`` (what the question format adds)."""
    for start in tqdm(range(0, len(todo), batch), desc=desc, unit="batch"):
        chunk = todo[start : start + batch]
        answers = answerer.answer([t[3] for t in chunk], [t[2]["question"] for t in chunk])
        for (key, name, q, _cap), a in zip(chunk, answers, strict=True):
            writer.write({"key": key, "system": name, "benchmark": q["benchmark"], "id": q["id"], "qid": q["qid"],
                          **record(q, a)})


def _choice_record(q: dict[str, Any], a: Any) -> dict[str, Any]:
    mc: MCQuestion = q["question"]
    return {"format": "choice", "question": mc.question, "options": list(mc.options), "answer": mc.answer,
            "choice": a.choice, "correct": a.correct, "score": None if a.correct is None else float(a.correct),
            "probs": a.probs, "method": a.method, "error": a.error}


def _open_record(q: dict[str, Any], a: Any) -> dict[str, Any]:
    oq: OpenQuestion = q["question"]
    return {"format": "open", "question": oq.question, "answers": list(oq.answers), "metric": oq.metric,
            "prediction": a.prediction, "raw": a.raw, "score": a.score, "scores": a.scores, "error": a.error}


def _answer_choice(todo: Todo, answerer: CaptionAnswerer, writer: RecordWriter, batch: int) -> None:
    _answer_batches(todo, answerer, writer, batch, "qa", _choice_record)


def _answer_open(todo: Todo, answerer: OpenAnswerer, writer: RecordWriter, batch: int) -> None:
    _answer_batches(todo, answerer, writer, batch, "qa (open)", _open_record)


def _score(r: Mapping[str, Any]) -> float | None:
    """A record's score (records written before open questions existed carry only ``correct``)."""
    if "score" in r:
        return r["score"]
    return None if r["correct"] is None else float(bool(r["correct"]))


def _column(r: Mapping[str, Any]) -> tuple[str, str | None]:
    """The table column of a record (``acc/B`` for choice, e.g. ``anls/B`` for open) and its metric."""
    if r.get("format", "choice") == "open":
        return f"{SHORT_NAMES[r['metric']]}/{r['benchmark']}", r["metric"]
    return f"acc/{r['benchmark']}", None


def aggregate(records: Sequence[Mapping[str, Any]], systems: Sequence[str]
              ) -> tuple[list[dict[str, Any]], list[str], list[str], dict[str, str]]:
    """Rows (mean score per benchmark column, their mean as ``accuracy``), the columns, the benchmarks and
    the metric of each open-ended column."""
    tally: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0, 0]))
    benches: list[str] = []
    cols: list[str] = []
    metrics: dict[str, str] = {}
    for r in records:
        if r["benchmark"] not in benches:
            benches.append(r["benchmark"])
        col, metric = _column(r)
        if col not in cols:
            cols.append(col)
            if metric:
                metrics[col] = metric
        t = tally[r["system"]][col]
        score = _score(r)
        if score is None:
            t[2] += 1
        else:
            t[0] += score
            t[1] += 1
    rows = []
    for s in systems:
        row: dict[str, Any] = {"system": s}
        means = []
        for c in cols:
            total, n, _u = tally[s][c]
            row[c] = total / n if n else float("nan")
            if n:
                means.append(total / n)
        row["accuracy"] = sum(means) / len(means) if means else float("nan")
        row["questions"] = int(sum(tally[s][c][1] for c in cols))
        row["unscored"] = int(sum(tally[s][c][2] for c in cols))
        rows.append(row)
    rows.sort(key=lambda r: -(r["accuracy"] if r["accuracy"] == r["accuracy"] else -1.0))
    return rows, ["accuracy", *cols, "questions", "unscored"], benches, metrics


# ---------------------------------------------------------------------- CLI
def run_command(cfg: QAEvalConfig) -> int:
    print(result_text(run(cfg), cfg.out))
    return 0
