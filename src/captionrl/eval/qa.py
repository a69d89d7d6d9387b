"""Caption-based QA (MoCo Rubric §A.3): a fixed text-only answerer sees only each system's caption.

Question files are local JSONL copies of CaptionQA / ChartQA / TextVQA / DocVQA / BLINK-style records,
one question a line: ``{id | image_id, question, options | choices, answer, qid?}``; ``id`` names the
image, matching the ``id`` of the caption files. Pass them as ``--qa NAME=PATH`` (the name is the
benchmark's column). Accuracy per benchmark and averaged over benchmarks; an unscored answer (backend
failure) is excluded and counted. Offline default: easy-vqa test images (a shape and colour each) with
multiple-choice questions built from their QA pairs, and demo systems (reference, other item, generic,
empty captions) so the run checks the answerer itself: the reference caption must beat the others.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
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
from captionrl.eval.result import EvalResult, print_result, write_result
from captionrl.judges.qa import CaptionAnswerer, MCQuestion, to_question
from captionrl.records import RecordWriter, read_jsonl

PROTOCOL = "qa"
KNOWN_BENCHMARKS = ("captionqa", "chartqa", "textvqa", "docvqa", "blink")


# ---------------------------------------------------------------------- question files
def load_qa_file(path: str | Path, benchmark: str) -> list[dict[str, Any]]:
    """Read a benchmark's questions: ``[{id, qid, question: MCQuestion, benchmark}]``."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"qa.{benchmark}", str(path), "file not found",
                        "give a JSONL file with {id, question, options, answer} lines")
    out = []
    for n, rec in enumerate(read_jsonl(p)):
        image_id = rec.get("id", rec.get("image_id"))
        if image_id is None:
            raise DataError(f"{p.name}:line {n + 1}.id", None, "no 'id' (or 'image_id')",
                            "name the image each question is about, matching the caption files' ids")
        q = to_question(rec, f"{p.name}:line {n + 1}")
        out.append({"id": str(image_id), "qid": q.qid or str(n), "question": q, "benchmark": benchmark})
    if not out:
        raise DataError(f"qa.{benchmark}", str(path), "holds no questions", "check the file")
    return out


def parse_qa_specs(specs: Sequence[str]) -> list[dict[str, Any]]:
    questions = []
    for spec in specs:
        if "=" not in spec:
            raise ConfigError("qa", spec, "is not NAME=PATH",
                              f"write e.g. chartqa=data/chartqa.jsonl (names like {', '.join(KNOWN_BENCHMARKS)})")
        name, path = spec.split("=", 1)
        questions.extend(load_qa_file(path, name))
    return questions


def item_questions(items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for it in items:
        for j, rec in enumerate(it["questions"]):
            q = to_question(rec, f"{it['id']}.questions[{j}]")
            out.append({"id": str(it["id"]), "qid": q.qid or str(j), "question": q,
                        "benchmark": it.get("benchmark", "default")})
    return out


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

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise ConfigError("batch", self.batch, "must be at least 1", "set batch=16")
        check_spec("answerer", self.answerer)


CONFIG = QAEvalConfig


def run(cfg: QAEvalConfig, *, answerer: CaptionAnswerer | None = None, systems: Systems | None = None) -> EvalResult:
    """Every system's captions answer every question; ``answerer``/``systems`` replace the configured ones."""
    if cfg.qa:
        questions = parse_qa_specs(cfg.qa)
        items = None
    else:
        items = offline_items(cfg.demo_items, seed=cfg.seed)
        questions = item_questions(items)
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
    answerer = answerer or CaptionAnswerer(backend_from_spec(cfg.answerer))
    out = Path(cfg.out)
    missing = 0
    with RecordWriter(out / "records.jsonl") as writer:
        todo = []
        for name, caps in systems.items():
            for q in questions:
                if q["id"] not in caps:
                    missing += 1
                    continue
                key = f"{name}|{q['benchmark']}|{q['id']}|{q['qid']}"
                if not writer.has(key):
                    todo.append((key, name, q, caps[q["id"]]["caption"]))
        for start in tqdm(range(0, len(todo), cfg.batch), desc="qa", unit="batch", disable=not todo):
            chunk = todo[start : start + cfg.batch]
            qs: list[MCQuestion] = [t[2]["question"] for t in chunk]
            answers = answerer.answer([t[3] for t in chunk], qs)
            for (key, name, q, _cap), a in zip(chunk, answers, strict=True):
                writer.write({"key": key, "system": name, "benchmark": q["benchmark"], "id": q["id"], "qid": q["qid"],
                              "question": q["question"].question, "options": list(q["question"].options),
                              "answer": q["question"].answer, "choice": a.choice, "correct": a.correct,
                              "probs": a.probs, "method": a.method, "error": a.error})
        records = writer.records()
    rows, columns, benches = aggregate(records, list(systems))
    notes = [f"{sum(r['correct'] is None for r in records)} answers unscored (excluded)",
             f"{missing} (system, question) pairs without a caption for the question's image"]
    better: dict[str, str | None] = {c: "higher" for c in columns if c.startswith("acc")}
    better.update(questions=None, unscored="lower")
    result = EvalResult(PROTOCOL, rows, columns, better=better, config=asdict(cfg), records=str(out / "records.jsonl"),
                        notes=notes, extra={"benchmarks": benches, "answerer": getattr(answerer.backend, "name", "?")})
    return write_result(result, out)


def aggregate(records: Sequence[Mapping[str, Any]], systems: Sequence[str]) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    tally: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0, 0]))
    benches: list[str] = []
    for r in records:
        b = r["benchmark"]
        if b not in benches:
            benches.append(b)
        t = tally[r["system"]][b]
        if r["correct"] is None:
            t[2] += 1
        else:
            t[0] += int(bool(r["correct"]))
            t[1] += 1
    rows = []
    for s in systems:
        row: dict[str, Any] = {"system": s}
        accs = []
        for b in benches:
            c, n, _u = tally[s][b]
            row[f"acc/{b}"] = c / n if n else float("nan")
            if n:
                accs.append(c / n)
        row["accuracy"] = sum(accs) / len(accs) if accs else float("nan")
        row["questions"] = sum(tally[s][b][1] for b in benches)
        row["unscored"] = sum(tally[s][b][2] for b in benches)
        rows.append(row)
    rows.sort(key=lambda r: -(r["accuracy"] if r["accuracy"] == r["accuracy"] else -1.0))
    columns = ["accuracy", *[f"acc/{b}" for b in benches], "questions", "unscored"]
    return rows, columns, benches


# ---------------------------------------------------------------------- CLI
def run_command(cfg: QAEvalConfig) -> int:
    print_result(run(cfg), cfg.out)
    return 0
