"""Entailment judge: real embedded LLM for the scoring path, a real (untrained-head) NLI folder for plumbing."""

from __future__ import annotations

import json

import pytest

from captionrl.backends.base import ChoiceResult
from captionrl.errors import ConfigError, DataError
from captionrl.eval import entailment as ent
from captionrl.judges.base import Judge
from captionrl.judges.entailment import EntailmentJudge

CAPTION = "The series starts at 10 and rises steadily to 20 at step 9. The maximum is 20 at step 9."
REFS = ["The series rises.", "The maximum is 20.", "The series falls sharply to 0."]


@pytest.mark.slow
def test_llm_judge_scores_share_of_references(embedded_backend):
    """P(entails) of each (caption, reference) is the model's probability of the first option for the
    premise-then-hypothesis question, and the scores are the share / mean of them.

    SmolLM2-135M cannot tell entailment from contradiction (measured: P(Yes) 0.40-0.49 and P(A) 0.87-0.88
    for references that hold, contradict the caption, or are about cooking), so no assertion here can be
    that the contradicting reference scores lower; what a wrong implementation breaks is which prompt is
    asked (premise and hypothesis swapped), which option is read (No for Yes), and which reference a value
    lands on. Each is checked against the model's own answer to the question built here from the template.
    """
    from captionrl.judges.entailment import LETTERS_TAIL, QUESTION, YESNO_TAIL

    for method, options, tail in (("yesno", ["Yes", "No"], YESNO_TAIL), ("letters", ["A", "B"], LETTERS_TAIL)):
        judge = EntailmentJudge(embedded_backend, method=method)
        assert isinstance(judge, Judge)
        (j,) = judge.judge([CAPTION], {"references": [REFS]})
        assert j.scored and j.method == method and j.extra["path"] == "logits"
        p = j.extra["p_entail"]
        asked = [[{"role": "user", "content": QUESTION.format(premise=CAPTION, hypothesis=r) + tail}] for r in REFS]
        expected = [r.probs[options[0]] for r in embedded_backend.choose(asked, options)]
        assert p == pytest.approx(expected, abs=1e-6), (method, p, expected)
        assert len(set(p)) == 3  # three different questions, three different answers
        assert j.score == pytest.approx(sum(x > 0.5 for x in p) / 3)
        assert j.extra["soft"] == pytest.approx(sum(p) / 3)
    (empty,) = EntailmentJudge(embedded_backend).judge([""], {"references": [REFS]})
    assert empty.score == 0.0


@pytest.mark.slow
def test_entail_run_writes_tables_and_resumes(tiny_llama, tmp_path):
    """The command's bookkeeping (tables, resume), not the model's judgment: the tiny random Llama answers."""
    from captionrl.backends.hf import HFBackend

    systems, refs = ent.demo_inputs(n_items=3)
    calls = []
    backend = HFBackend(tiny_llama, dtype="float32")

    class Counting:
        name = backend.name

        def choose(self, prompts, options):
            calls.append(len(prompts))
            return backend.choose(prompts, options)

    judge = EntailmentJudge(Counting())
    cfg = ent.EntailEvalConfig(out=str(tmp_path), quiet=True)
    s = ent.run(cfg, judge=judge, inputs=(systems, refs))
    assert s.protocol == "entailment" and {r["system"] for r in s.rows} == {"describer", "other window"}
    assert all(r["n_scored"] == 3 for r in s.rows)
    n_calls = len(calls)
    s2 = ent.run(cfg, judge=judge, inputs=(systems, refs))
    assert len(calls) == n_calls and s2.rows == s.rows  # resumed: nothing judged again


def test_backend_failure_is_unscored_not_zero():
    class Failing:
        name = "failing"

        def choose(self, prompts, options):
            return [ChoiceResult(None, "logits", error="server down") for _ in prompts]

    (j,) = EntailmentJudge(Failing()).judge([CAPTION], {"references": [REFS]})
    assert j.score is None and "server down" in j.error


def test_bad_references_and_settings():
    class Dummy:
        name = "dummy"

    judge = EntailmentJudge(Dummy())
    with pytest.raises(DataError, match="references"):
        judge.judge([CAPTION], {"refs": [REFS]})
    with pytest.raises(DataError, match="non-empty list"):
        judge.judge([CAPTION], {"references": [[]]})
    with pytest.raises(ConfigError, match="method"):
        EntailmentJudge(Dummy(), method="vibes")
    with pytest.raises(ConfigError, match="NLI"):
        EntailmentJudge(None, method="nli")


def _nli_folder(tmp_path, labels):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from captionrl.encoders import minilm_dir

    src = minilm_dir()
    torch.manual_seed(0)  # the same head every run
    model = AutoModelForSequenceClassification.from_pretrained(
        src, num_labels=len(labels), id2label=dict(enumerate(labels)), label2id={v: k for k, v in enumerate(labels)})
    # transformers initialises a new head near zero (all labels ~1/3): a wider one makes the labels, and the
    # two orders of a pair, differ enough for the checks below to tell them apart
    torch.nn.init.normal_(model.classifier.weight, std=1.0)
    model.save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(src).save_pretrained(tmp_path)
    return tmp_path


def test_nli_path_reads_the_entailment_label(tmp_path):
    """Plumbing only: MiniLM with an untrained 3-way head (no NLI model ships offline). The head is random,
    so no value is right or wrong; what a wrong implementation breaks is which label is read (the
    contradiction column for the entailment one), which text is the premise (caption and reference
    swapped), and which reference a value lands on, each checked against the folder's own softmax."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = _nli_folder(tmp_path / "nli", ["contradiction", "neutral", "entailment"])
    judge = EntailmentJudge(method="nli", nli_model=str(folder))
    assert judge.nli.entail_index == 2
    (j,) = judge.judge([CAPTION], {"references": [REFS]})
    assert j.scored and j.extra["path"] == "nli"
    tok, model = AutoTokenizer.from_pretrained(folder), AutoModelForSequenceClassification.from_pretrained(folder)

    def softmax(premises, hypotheses):
        with torch.inference_mode():
            return model.eval()(**tok(premises, hypotheses, padding=True, return_tensors="pt")).logits.softmax(-1)

    probs = softmax([CAPTION] * len(REFS), REFS)
    assert j.extra["p_entail"] == pytest.approx(probs[:, 2].tolist(), abs=1e-5)
    # the checks above can tell: another column, or the swapped pair, gives other values on this head
    assert probs[:, 0].tolist() != pytest.approx(probs[:, 2].tolist(), abs=5e-3)
    assert softmax(REFS, [CAPTION] * len(REFS))[:, 2].tolist() != pytest.approx(probs[:, 2].tolist(), abs=5e-3)
    assert j.score == pytest.approx(sum(p > 0.5 for p in j.extra["p_entail"]) / len(REFS))
    assert j.extra["soft"] == pytest.approx(float(probs[:, 2].mean()), abs=1e-5)
    bad = _nli_folder(tmp_path / "bad", ["a", "b"])
    with pytest.raises(ConfigError, match="entailment"):
        EntailmentJudge(method="nli", nli_model=str(bad))


def test_load_inputs_matches_ids(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps({"id": "1", "caption": "x", "references": ["r"]}) + "\n")
    (tmp_path / "refs.jsonl").write_text(json.dumps({"id": "2", "references": ["s"]}) + "\n")
    systems, refs = ent.load_inputs([str(tmp_path / "a.jsonl")], str(tmp_path / "refs.jsonl"))
    assert systems == {"a": {"1": "x"}} and refs == {"1": ["r"], "2": ["s"]}
    (tmp_path / "b.jsonl").write_text(json.dumps({"id": "1"}) + "\n")
    with pytest.raises(DataError, match="caption"):
        ent.load_inputs([str(tmp_path / "b.jsonl")], None)
