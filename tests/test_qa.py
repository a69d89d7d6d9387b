"""Caption-based QA: question validation, seeded CapRL draws, and the protocol's answer bookkeeping."""

from __future__ import annotations

import re

import pytest

from captionrl.backends.base import ChoiceResult, option_letters
from captionrl.errors import DataError
from captionrl.eval.common import easy_vqa_items
from captionrl.eval.qa import QAEvalConfig, item_questions, load_qa_file, run
from captionrl.judges.qa import CANNOT_ANSWER, CaptionAnswerer, QAConfig, QAJudge, render_prompt, to_question


class Reader:
    """A text-only answerer that picks the option whose text occurs in the description, else abstains
    ("cannot be answered") when offered, else answers A. Wrong answer-key bookkeeping would show."""

    name = "fake:reader"

    def choose(self, prompts, options):
        out = []
        for p in prompts:
            text = p[0]["content"]
            desc = text.split('description:\n"', 1)[1].rsplit('"', 1)[0].lower().replace("(no description)", "")
            opts = re.findall(r"^([A-Z])\. (.*)$", text, re.MULTILINE)
            pick = next((lab for lab, o in opts if re.search(rf"\b{re.escape(o.lower())}\b", desc)), None)
            if pick is None:
                pick = next((lab for lab, o in opts if o == CANNOT_ANSWER), "A")
            out.append(ChoiceResult({o: float(o == pick) for o in options}, "logits", mass=1.0))
        return out


def test_to_question_accepts_letter_index_text_and_rejects_bad():
    for ans in ("B", 1, "blue", "Blue"):
        assert to_question({"question": "q?", "options": ["red", "blue"], "answer": ans}).answer == 1
    assert to_question({"question": "q?", "choices": ["x", "y", "z"], "answer": "z"}).answer == 2
    with pytest.raises(DataError, match="answer"):
        to_question({"question": "q?", "options": ["red", "blue"], "answer": "green"})
    with pytest.raises(DataError, match="options"):
        to_question({"question": "q?", "options": "red", "answer": "red"})
    with pytest.raises(DataError, match="question"):
        to_question({"options": ["a", "b"], "answer": "a"})


def test_caprl_draws_are_seeded_recorded_and_shuffled():
    qs = [to_question(q) for q in easy_vqa_items(1, seed=3)[0]["questions"]]
    judge = QAJudge(Reader(), QAConfig(n_questions=6, seed=7))
    d1, log1, seed1 = judge.draws(qs, "item-1")
    d2, log2, _ = judge.draws(qs, "item-1")
    _d3, log3, _ = judge.draws(qs, "item-2")
    assert log1 == log2 and d1 == d2 and seed1 == "7|item-1"
    assert log1 != log3
    for q, entry in zip(d1, log1, strict=True):
        src = qs[entry["q"]]
        assert q.options[-1] == CANNOT_ANSWER and len(q.options) == len(src.options) + 1
        assert q.answer_text == src.answer_text  # the key follows the shuffle
    # with replacement: 6 draws from this item's questions may repeat, and draw indices are in range
    assert all(0 <= e["q"] < len(qs) for e in log1)


def test_caprl_reward_reads_captions():
    item = easy_vqa_items(1, seed=3)[0]
    cols = {"id": [item["id"]] * 3, "questions": [item["questions"]] * 3}
    caps = [item["reference"], "", "Something unrelated."]
    out = QAJudge(Reader(), QAConfig(n_questions=20, seed=0)).judge(caps, cols)
    # yes/no questions cannot be read from the caption by this reader; shape/colour ones can
    assert out[0].score > out[1].score
    assert out[1].score == out[2].score == 0.0
    assert out[1].extra["cannot_answer_rate"] == 1.0
    assert out[0].extra["draws"] == out[1].extra["draws"]  # one group, same questions


def test_protocol_accuracy_per_benchmark_and_question_files(tmp_path):
    result = run(QAEvalConfig(out=str(tmp_path / "a"), demo_items=4), answerer=CaptionAnswerer(Reader()))
    rows = {r["system"]: r for r in result.rows}
    assert rows["reference"]["accuracy"] > rows["other_item"]["accuracy"]
    assert rows["reference"]["accuracy"] > rows["empty"]["accuracy"]
    assert set(result.extra["benchmarks"]) >= {"easy-vqa"}
    assert result.protocol == "qa" and (tmp_path / "a" / "table.md").exists()
    # local question files (BLINK-style records) join the caption files by id
    qfile = tmp_path / "chartqa.jsonl"
    qfile.write_text('{"id": "c1", "question": "What is the peak?", "options": ["10", "20"], "answer": "B"}\n')
    cap = tmp_path / "sys.jsonl"
    cap.write_text('{"id": "c1", "caption": "The bars peak at 20 in May."}\n')
    s2 = run(QAEvalConfig(captions=[str(cap)], qa=[f"chartqa={qfile}"], out=str(tmp_path / "b")),
             answerer=CaptionAnswerer(Reader()))
    assert s2.rows[0]["acc/chartqa"] == 1.0
    with pytest.raises(DataError, match="id"):
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"question": "q", "options": ["a", "b"], "answer": "a"}\n')
        load_qa_file(bad, "textvqa")


@pytest.mark.slow
def test_embedded_answerer(embedded_backend):
    qs = item_questions(easy_vqa_items(2, seed=0))[:6]
    answers = CaptionAnswerer(embedded_backend).answer(["A blue circle."] * len(qs), [q["question"] for q in qs])
    assert len(answers) == len(qs)
    for a, q in zip(answers, qs, strict=True):
        assert a.method == "logits" and a.correct is not None
        assert len(a.probs) == len(q["question"].options) and abs(sum(a.probs.values()) - 1) < 1e-6
        # the model's own letter probabilities for the prompt built here: the right caption and question
        # asked, the chosen letter the likeliest one, and graded against this question's key
        letters = option_letters(len(q["question"].options))
        (own,) = embedded_backend.choose([render_prompt(q["question"], "A blue circle.")], letters)
        assert a.probs == pytest.approx(own.probs, abs=1e-4)  # batched vs alone: padding
        assert a.choice == max(range(len(letters)), key=lambda i: own.probs[letters[i]])
        assert a.correct == (a.choice == q["question"].answer)
    assert {a.correct for a in answers} == {True, False}  # both gradings occur: a constant would fail
