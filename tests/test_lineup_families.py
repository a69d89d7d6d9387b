"""Table 4's RL baselines as ``train lineup`` reward families: answerability on verified series questions and
a 1-10 LLM-as-judge grade, one switch (``reward.family``) away from LineupRL's identification reward.

Config checks load no model. The training tests run one RLOO step on the embedded SmolLM2 (policy and
frozen answerer/judge) with 2 windows of 16 values and 8-token captions, and check that the rewards TRL
logged come from the family's own judge: every sample record names the family, and re-judging the logged
captions with that judge gives the recorded base scores.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from captionrl.config import load_config
from captionrl.errors import ConfigError
from captionrl.judges.qa import to_question
from captionrl.judges.series_qa import (
    SeriesQuestionMaker,
    SeriesQuestionsConfig,
    parse_llm_questions,
    rule_questions,
)
from captionrl.train import lineup
from captionrl.train.lineup import LineupConfig

SMALL = [
    "policy.input=numbers", "data.window=16", "data.n_train=2", "data.n_val=0", "data.n_test=0",
    "data.series=[nile,sunspots]", "reward.k=2", "train.algorithm=rloo", "train.num_generations=2",
    "train.per_device_train_batch_size=4", "train.max_completion_length=8", "train.max_steps=1", "train.save_steps=1",
    "train.beta=0.0", "train.report_to=[]", "train.threads=1", "train.use_cpu=true", "train.bf16=false",
    "train.gradient_checkpointing=false", "eval.enabled=false", "train.preflight_items=2",
    "train.force_preflight=true",  # the embedded stand-in cannot tell honest from probes; the table is still written
]


# ---------------------------------------------------------------------- config (no model)
@pytest.mark.parametrize(("override", "field"), [
    ("reward.family=judg", "reward.family"),
    ("reward.answerability.generator=vlm", "reward.answerability.generator"),
    ("reward.answerability.min_verified=0", "reward.answerability.n_generated/min_verified"),
    ("reward.answerability.n_questions=0", "reward.answerability.n_questions"),
    ("reward.judge.mode=rank", "reward.judge.mode"),
    ("reward.judge.grade=10", "reward.judge.grade"),
])
def test_family_settings_are_validated_on_load(override, field, monkeypatch):
    monkeypatch.setenv("CAPTIONRL_FORBID_MODEL_CALLS", "1")
    with pytest.raises(ConfigError) as err:
        load_config(LineupConfig, None, [override])
    assert err.value.field == field and err.value.fix


def test_families_switch_by_one_key():
    for family in ("identification", "answerability", "judge"):
        assert load_config(LineupConfig, None, [f"reward.family={family}"]).reward.family == family
    assert LineupConfig().reward.family == "identification"  # LineupRL stays the default
    assert lineup.preflight_keys(load_config(LineupConfig, None, ["reward.family=judge"]).reward)[:3] == (
        "reward.family", "reward.judge.mode", "reward.judge.show_series")


def test_rule_questions_have_the_right_answers():
    v = [1.0, 2.0, 9.0, 4.0, 3.0, 2.0, 1.5, 0.5]
    qs = {q.qid: q for q in rule_questions(v, precision=1)}
    assert qs["direction"].answer_text == "It ends about where it starts"  # 0.5 below the start, range 8.5
    assert qs["argmax"].answer_text == "the second quarter" and qs["argmin"].answer_text == "the last quarter"
    assert qs["max"].answer_text == "9.0" and qs["min"].answer_text == "0.5" and qs["first"].answer_text == "1.0"
    assert all(len(set(q.options)) == len(q.options) >= 3 for q in qs.values())
    rising = {q.qid: q for q in rule_questions(np.arange(10.0))}
    assert rising["direction"].answer_text == "It rises overall"


def test_llm_question_replies_are_parsed_and_bad_lines_counted():
    reply = ('Here you go:\n{"question": "Where is the peak?", "options": ["start", "end"], "answer": "B"}\n'
             '{"question": "Trend?", "options": ["up"], "answer": "A"}\n{not json}\n')
    qs, bad = parse_llm_questions(reply, "q")
    assert [q.answer_text for q in qs] == ["end"] and bad == 2


class _Oracle:
    """An answerer (parse path only) that reads the values it is shown: right with them, 'A' without."""

    def choose(self, prompts, options):
        from captionrl.backends.base import ChoiceResult

        out = []
        for p in prompts:
            text = p[0]["content"]
            truth = self.truth[text.split("\n")[0]]
            lines = [line for line in text.splitlines() if line[:2] in {f"{o}." for o in options}]
            pick = next((o for o, line in zip(options, lines, strict=False) if line[3:] == truth), "A")
            pick = pick if "values, in order" in text else "A"
            out.append(ChoiceResult({o: float(o == pick) for o in options}, "logits"))
        return out


def test_verification_keeps_answerable_questions_and_drops_guessable_ones():
    row = {"item_id": "x", "series": [1.0, 3.0, 2.0, 5.0], "series_text": "1.00, 3.00, 2.00, 5.00"}
    oracle = _Oracle()
    qs = rule_questions(row["series"])
    oracle.truth = {f"Question about a time series: {q.question}": q.answer_text for q in qs}
    maker = SeriesQuestionMaker(oracle, SeriesQuestionsConfig(n_generated=7, min_verified=1), seed=0)  # type: ignore[arg-type]
    checks = maker.verify([row], [qs])[0]
    assert all(c["with_values"] for c in checks)  # the oracle reads the values: every key is right
    kept = [c["kept"] for c in checks]
    assert kept == [c["blind"] is False for c in checks] and 0 < sum(kept) < len(kept)  # blind 'A' guesses drop


# ---------------------------------------------------------------------- one real step per family
def _samples(out):
    from captionrl.train.run.logging import load_samples

    return load_samples(out)


@pytest.mark.slow
def test_answerability_family_trains_on_verified_questions(tmp_path, embedded_backend, tiny_llama):
    """The real verifier writes and answers the questions; the policy is the tiny random Llama (its captions
    need only be re-scored to the logged reward, not be good)."""
    from captionrl.judges.qa import QAConfig, QAJudge

    out = tmp_path / "answ"
    cfg = load_config(LineupConfig, None, [*SMALL, f"policy.model={tiny_llama}",
                                           "reward.family=answerability", "reward.answerability.n_generated=7",
                                           "reward.answerability.min_verified=1", "reward.answerability.blind_check=false",
                                           "reward.answerability.n_questions=2", f"train.out_dir={out}"])
    result = lineup.run(cfg, verifier=embedded_backend)
    assert result["reward_family"] == "answerability" and result["steps"] == 1
    qrecs = {r["item_id"]: r for r in map(json.loads, (out / "questions.jsonl").read_text().splitlines())}
    assert len(qrecs) == 2 and all(len(r["generated"]) == 7 for r in qrecs.values())
    for r in qrecs.values():  # kept = answered right from the values; the summary counts them
        assert [c["kept"] for c in r["checks"]] == [bool(c["with_values"]) for c in r["checks"]]
    assert result["questions"]["train"]["verified"] == sum(len(r["verified"]) for r in qrecs.values())
    samples = _samples(out)
    assert len(samples) == 4 and {s["family"] for s in samples} == {"answerability"}
    assert all("identification" not in s for s in samples)
    judge = QAJudge(embedded_backend, QAConfig(n_questions=2, seed=cfg.seed, subject="time series"))
    again = judge.judge([s["caption"] for s in samples], {"questions": [qrecs[s["item_id"]]["verified"] for s in samples]})
    assert [j.score for j in again] == pytest.approx([s["base"] for s in samples], abs=1e-6)
    assert all(s["accuracy"] in (0.0, 0.5, 1.0) for s in samples)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("answerability/accuracy" in m for m in metrics)
    assert (out / "preflight.json").exists()  # the preflight ran under this family's reward
    for r in qrecs.values():
        for q in r["verified"]:
            to_question(q)  # the column's questions read back as the reward reads them


@pytest.mark.long  # an LLM judge's grade as the reward: test_rubicap_rewards.py's judge family in the default tier
@pytest.mark.slow
def test_judge_family_trains_on_grades_of_the_caption(tmp_path, embedded_backend):
    from captionrl.judges.scalar import ScalarConfig, ScalarJudge

    out = tmp_path / "judge"
    cfg = load_config(LineupConfig, None, [*SMALL, "reward.family=judge", "reward.judge.mode=choose",
                                           f"train.out_dir={out}"])
    result = lineup.run(cfg, verifier=embedded_backend)
    assert result["reward_family"] == "judge"
    samples = _samples(out)
    assert len(samples) == 4 and {s["family"] for s in samples} == {"judge"}
    assert all(1.0 <= s["expected_grade"] <= 9.0 for s in samples)
    from captionrl.domains.lineup_data import build_lineup_data

    rows = {r["item_id"]: r for r in build_lineup_data(cfg.data, cfg.reward.k, cfg.seed).rows["train"]}
    judge = ScalarJudge(embedded_backend, ScalarConfig(mode="choose", use_reference=False, subject="a time series",
                                                        context_column="series_text"))
    again = judge.judge([s["caption"] for s in samples], {"series_text": [rows[s["item_id"]]["series_text"] for s in samples]})
    assert [j.score for j in again] == pytest.approx([s["base"] for s in samples], abs=1e-4)
    prompt = judge.messages("x", None, "choose", rows[samples[0]["item_id"]]["series_text"])[0]["content"]
    assert rows[samples[0]["item_id"]]["series_text"] in prompt  # the judge saw the values it grades against
    assert json.loads((out / "preflight.json").read_text())["rows"]  # the preflight table was written


# ---------------------------------------------------------------------- SFT on a teacher's chart captions
def test_sft_series_rows_ask_what_lineup_asks():
    """A series record becomes LineupRL's prompt: the chart (placeholder + image column) for a VLM policy,
    the printed numbers for a language-only one; with the configured instruction."""
    from captionrl.domains.lineup_data import add_charts
    from captionrl.domains.timeseries import render_chart
    from captionrl.train.sft import build_distill_rows

    values = [1.0, 2.5, 2.0, 4.0, 3.5, 5.0]
    rec = {"id": "a", "series": values, "caption": "It climbs to 5."}
    chart, = build_distill_rows([rec], with_images=True, chart=True, instruction="Be brief.")
    want = add_charts([{"series": values}], "Be brief.")[0]["prompt"][0]["content"]
    assert chart["prompt"][0]["content"] == [{"type": "image"}, {"type": "text", "text": want}]
    assert np.array_equal(np.asarray(chart["images"][0]), np.asarray(render_chart(np.asarray(values))))
    numbers, = build_distill_rows([rec], with_images=True, chart=False, instruction="Be brief.")
    assert numbers["images"] == [] and "1.00, 2.50, 2.00" in numbers["prompt"][0]["content"]
    from captionrl.errors import DataError

    with pytest.raises(DataError, match=r"data\[0\]\.series"):
        build_distill_rows([{"series": [1.0, float("nan"), 2.0], "caption": "c"}])


@pytest.mark.slow
def test_sft_on_chart_captions_trains_a_vlm_policy(tmp_path):
    """``train sft`` with the tiny Qwen2.5-VL policy on series records: the rows it trained on carry the chart."""
    from captionrl.records import read_jsonl
    from captionrl.train.sft import SFTRunConfig, run

    data = tmp_path / "teacher.jsonl"
    data.write_text("".join(json.dumps({"id": f"s{i}", "series": list(np.sin(np.arange(16) / (2 + i))),
                                        "caption": f"A wave, item {i}."}) + "\n" for i in range(2)))
    cfg = load_config(SFTRunConfig, None, [
        f"data.path={data}", "policy.model=tiny-qwen2.5-vl", "data.instruction=Be brief.",
        f"train.out_dir={tmp_path / 'sft'}", "train.max_steps=1", "train.per_device_train_batch_size=2",
        "train.max_length=256", "train.report_to=[]", "train.save_steps=1"])
    result = run(cfg)
    assert result["steps"] == 1 and result["train_loss"] > 0
    rows = list(read_jsonl(tmp_path / "sft" / "data.jsonl"))
    assert len(rows) == 2 and all(r["prompt"][0]["content"][0] == {"type": "image"} for r in rows)
    assert all(r["prompt"][0]["content"][1]["text"].endswith("Be brief.") for r in rows)
    with pytest.raises(ConfigError, match="language-only"):
        run(load_config(SFTRunConfig, None, [f"data.path={data}", "policy.input=chart",
                                             f"train.out_dir={tmp_path / 'llm'}", "train.max_steps=1"]))
