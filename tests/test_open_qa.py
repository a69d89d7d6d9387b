"""Open-ended caption QA: the benchmarks' answer metrics (values worked by hand from their definitions),
the loaders of local TextVQA / DocVQA / ChartQA copies, and `eval qa` with written answers."""

from __future__ import annotations

import json
import math

import pytest
from PIL import Image

from captionrl.backends.base import Generation
from captionrl.domains.qa_benchmarks import load_benchmark
from captionrl.errors import ConfigError, DataError
from captionrl.eval.qa import QAEvalConfig, run
from captionrl.judges.answer_metrics import (
    anls,
    exact_match,
    levenshtein,
    normalise_answer,
    relaxed_accuracy,
    score_answer,
    vqa_accuracy,
)
from captionrl.judges.open_qa import OpenAnswerer, OpenQuestion, clean_answer, to_open_question


# ---------------------------------------------------------------------- metrics
def test_normalisation_and_exact_match():
    assert normalise_answer("The Red car.") == "red car"
    assert normalise_answer("Three") == "3"
    assert normalise_answer("1,000 dollars") == "1000 dollars"
    assert normalise_answer("3.5%") == "3.5"
    assert normalise_answer("Coca-Cola") == "coca cola"
    assert exact_match("Two", ["2"]) == 1.0
    assert exact_match("a dog", ["the dog"]) == 1.0
    assert exact_match("cat", ["dog", "cats"]) == 0.0
    assert exact_match("cats", ["dog", "cats"]) == 1.0  # any reference


def test_anls_docvqa_definition():
    assert levenshtein("kitten", "sitting") == 3
    assert anls("helo", ["hello"]) == pytest.approx(1 - 1 / 5)  # NL = 1/5
    assert anls("abc", ["abcd"]) == pytest.approx(0.75)  # NL = 1/4
    assert anls("ab", ["abcd"]) == 0.0  # NL = 0.5 is not below the 0.5 threshold
    assert anls("xyz", ["abc"]) == 0.0
    assert anls("helo", ["xyz", "hello"]) == pytest.approx(0.8)  # max over references
    assert anls("  Hello   World ", ["hello world"]) == 1.0  # case and spacing do not count
    assert anls("", [""]) == 1.0


def test_relaxed_accuracy_chartqa_definition():
    assert relaxed_accuracy("10.4", ["10"]) == 1.0  # 4% off
    assert relaxed_accuracy("105", ["100"]) == 1.0  # exactly 5%
    assert relaxed_accuracy("10.6", ["10"]) == 0.0  # 6% off
    assert relaxed_accuracy("12%", ["0.12"]) == 1.0  # a percent sign divides by 100
    assert relaxed_accuracy("0", ["0"]) == 1.0  # zero reference: text match
    assert relaxed_accuracy("0.01", ["0"]) == 0.0
    assert relaxed_accuracy("Yes", ["yes"]) == 1.0
    assert relaxed_accuracy("yes", ["no"]) == 0.0
    assert relaxed_accuracy("ten", ["10"]) == 0.0  # no number words: the benchmark's rule, not ours


def test_vqa_accuracy_textvqa_definition():
    # min(#humans / 3, 1), averaged over the 10 leave-one-out sets of 9 humans (the official scorer)
    others = [f"x{i}" for i in range(10)]
    for k, want in [(0, 0.0), (1, 0.3), (2, 0.6), (3, 0.9), (4, 1.0), (10, 1.0)]:
        refs = ["exit"] * k + others[: 10 - k]
        assert vqa_accuracy("exit", refs) == pytest.approx(want), k
    assert vqa_accuracy("Two.", ["2", "2", "2", *others[:7]]) == pytest.approx(0.9)  # normalised
    with pytest.raises(DataError, match="answers"):
        vqa_accuracy("x", [])
    with pytest.raises(DataError, match="metric"):
        score_answer("bleu", "x", ["x"])


def test_answer_cleaning_and_question_validation():
    assert clean_answer("Answer: 42.") == "42"
    assert clean_answer('The answer is "exit".') == "exit"
    assert clean_answer("red\nBecause the caption says so.") == "red"
    q = to_open_question({"question": "How many?", "answer": 3, "metric": "relaxed_accuracy", "qid": 7})
    assert q == OpenQuestion("How many?", ("3",), "relaxed_accuracy", "7")
    with pytest.raises(DataError, match="answers"):
        to_open_question({"question": "q?", "answers": []})
    with pytest.raises(DataError, match="metric"):
        to_open_question({"question": "q?", "answers": ["a"], "metric": "rouge"})


class Flaky:
    """Error-path fake: answers "42" except for captions containing FAIL, where the call fails."""

    name = "fake:flaky"

    def generate(self, requests):
        return [Generation(None, error="server down") if "FAIL" in r.messages[-1]["content"] else Generation("42.")
                for r in requests]


def test_failed_answer_is_unscored_not_zero():
    out = OpenAnswerer(Flaky()).answer(["A sign: 42.", "FAIL"], [OpenQuestion("n?", ("42",))] * 2)
    assert out[0].score == 1.0 and out[0].prediction == "42"
    assert out[1].score is None and out[1].error == "server down"


# ---------------------------------------------------------------------- loaders
def _image(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), "white").save(path)


def _textvqa(root, rows=None, *, images=True):
    rows = rows or [
        {"question_id": 1, "image_id": "a1", "question": "What word is on the door?", "answers": ["exit"] * 9 + ["exit sign"]},
        {"question_id": 2, "image_id": "b2", "question": "What is the number?", "answers": ["42"] * 10},
    ]
    if images:
        for r in rows:
            _image(root / "train_images" / f"{r['image_id']}.jpg")
    root.mkdir(parents=True, exist_ok=True)
    p = root / "TextVQA_0.5.1_val.json"
    p.write_text(json.dumps({"dataset_type": "val", "dataset_name": "textvqa", "data": rows}))
    return p


def test_loaders_read_each_layout(tmp_path):
    tv = load_benchmark(_textvqa(tmp_path / "tv"))
    assert [r["id"] for r in tv] == ["a1", "b2"] and tv[0]["metric"] == "vqa_accuracy"
    assert tv[0]["answers"][-1] == "exit sign" and tv[0]["image"].endswith("train_images/a1.jpg")
    assert tv[1]["qid"] == "2" and tv[0]["benchmark"] == "textvqa"

    dv = tmp_path / "docvqa"
    _image(dv / "documents" / "pybv0228_81.png")
    (dv / "val_v1.0.json").write_text(json.dumps({"dataset_name": "docvqa", "dataset_split": "val", "data": [
        {"questionId": 49153, "question": "What is the ratio?", "image": "documents/pybv0228_81.png",
         "docId": 14465, "answers": ["0.28", "0.28 ratio"]}]}))
    (d,) = load_benchmark(dv / "val_v1.0.json")
    assert (d["id"], d["qid"], d["metric"], d["answers"]) == ("pybv0228_81", "49153", "anls", ["0.28", "0.28 ratio"])

    cq = tmp_path / "chartqa" / "test"
    _image(cq / "png" / "41699051005347.png")
    _image(cq / "png" / "multi_col_1.png")
    (cq / "test_human.json").write_text(json.dumps([
        {"imgname": "41699051005347.png", "query": "What is the peak value?", "label": "20"},
        {"imgname": "multi_col_1.png", "query": "Which year is highest?", "label": 2019}]))
    ch = load_benchmark(cq / "test_human.json", benchmark="chartqa-human")
    assert [(r["id"], r["answers"], r["metric"]) for r in ch] == [
        ("41699051005347", ["20"], "relaxed_accuracy"), ("multi_col_1", ["2019"], "relaxed_accuracy")]
    assert ch[0]["benchmark"] == "chartqa-human"


def test_loaders_name_file_row_and_fix(tmp_path):
    with pytest.raises(DataError, match=r"not a TextVQA, DocVQA or ChartQA layout.*Fix"):
        p = tmp_path / "other.json"
        p.write_text(json.dumps({"data": [{"qid": 1, "q": "?"}]}))
        load_benchmark(p)
    rows = [{"question_id": 1, "image_id": "a1", "question": "q?", "answers": ["x"]},
            {"question_id": 2, "image_id": "b2", "question": "q?"}]
    with pytest.raises(DataError, match=r"TextVQA_0.5.1_val.json:row 2.*lacks 'answers'"):
        load_benchmark(_textvqa(tmp_path / "keys", rows))
    with pytest.raises(DataError, match=r"row 1\.image.*a1\.jpg.*not found \(and 1 more rows\).*Fix: unpack"):
        load_benchmark(_textvqa(tmp_path / "noimg", images=False), images=tmp_path)
    bad = tmp_path / "broken.json"
    bad.write_text('{"data": [')
    with pytest.raises(DataError, match=r"broken.json:line 1.*not valid JSON"):
        load_benchmark(bad)


def test_eval_checks_data_before_the_answerer_loads(tmp_path):
    caps = tmp_path / "caps.jsonl"
    caps.write_text('{"id": "a1", "caption": "A door marked exit."}\n')
    qfile = _textvqa(tmp_path / "tv", images=False)
    (tmp_path / "tv" / "train_images").mkdir()  # the release's folder, but the images were not unpacked
    # an unreachable answerer would fail when built; the data error comes first
    cfg = QAEvalConfig(captions=[str(caps)], qa=[f"textvqa={qfile}"], out=str(tmp_path / "o"),
                       answerer="openai:http://127.0.0.1:9/v1#nobody")
    with pytest.raises(DataError, match="image file not found"):
        run(cfg)
    with pytest.raises(ConfigError, match="format"):
        run(QAEvalConfig(captions=[str(caps)], qa=[f"textvqa={_textvqa(tmp_path / 'ok')}"], format="choice",
                         out=str(tmp_path / "o2")))


def test_eval_open_unscored_answers_are_excluded(tmp_path):
    qfile = tmp_path / "bench.jsonl"
    qfile.write_text('{"id": "i1", "question": "n?", "answers": ["42"]}\n{"id": "i2", "question": "n?", "answers": ["42"]}\n'
                     '{"id": "i1", "question": "Colour?", "options": ["red", "42"], "answer": "42"}\n')
    caps = tmp_path / "sys.jsonl"
    caps.write_text('{"id": "i1", "caption": "A sign: 42."}\n{"id": "i2", "caption": "FAIL"}\n')
    res = run(QAEvalConfig(captions=[str(caps)], qa=[f"bench={qfile}"], format="open", out=str(tmp_path / "o")),
              open_answerer=OpenAnswerer(Flaky()))
    (row,) = res.rows
    # format=open asks the multiple-choice question open too: exact match on the correct option's text
    assert row["em/bench"] == 1.0 and row["questions"] == 2 and row["unscored"] == 1
    assert res.extra["metrics"] == {"em/bench": "exact_match"}
    assert "em/bench" in (tmp_path / "o" / "table.md").read_text()


# ---------------------------------------------------------------------- end to end, real answerer
@pytest.mark.slow
def test_eval_open_textvqa_with_embedded_answerer(tmp_path, embedded_backend):
    """Captions that state the answers must score above captions that do not, by the benchmark's metric."""
    rows = [
        {"question_id": 1, "image_id": "door", "question": "What word is written on the door?",
         "answers": ["exit"] * 8 + ["exit sign", "EXIT"]},
        {"question_id": 2, "image_id": "sign", "question": "What is the number on the sign?", "answers": ["42"] * 10},
        {"question_id": 3, "image_id": "bottle", "question": "What brand is the bottle?",
         "answers": ["coca cola"] * 7 + ["coke"] * 3},
    ]
    qfile = _textvqa(tmp_path / "tv", rows)
    stated = {"door": "A door with the word exit written on it.", "sign": "A road sign with the number 42 on it.",
              "bottle": "A coca cola bottle on a table."}
    unstated = {"door": "A hallway with a door.", "sign": "A road at dusk.", "bottle": "A bottle on a table."}
    files = []
    for name, caps in (("stated", stated), ("unstated", unstated)):
        f = tmp_path / f"{name}.jsonl"
        f.write_text("".join(json.dumps({"id": k, "caption": v}) + "\n" for k, v in caps.items()))
        files.append(str(f))
    res = run(QAEvalConfig(captions=files, qa=[f"textvqa={qfile}"], out=str(tmp_path / "o")),
              open_answerer=OpenAnswerer(embedded_backend))
    rows_by = {r["system"]: r for r in res.rows}
    good, bad = rows_by["stated"]["vqa_acc/textvqa"], rows_by["unstated"]["vqa_acc/textvqa"]
    assert rows_by["stated"]["unscored"] == rows_by["unstated"]["unscored"] == 0
    assert not math.isnan(good) and good >= 2 / 3 and bad <= 1 / 3 and good - bad >= 0.5, (good, bad)
    records = [json.loads(line) for line in (tmp_path / "o" / "records.jsonl").read_text().splitlines()]
    assert all(r["format"] == "open" and r["metric"] == "vqa_accuracy" and r["raw"] for r in records)
