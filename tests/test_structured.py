"""Schema-constrained decoding in process (``backends.structured`` through the ``hf`` backend).

The claim under test: a *randomly initialised* model (the tiny Qwen3-VL fixture, which writes random
tokens) decoding under the rubric or judgment schema produces JSON that the recipes' own parsers accept,
every time, greedy and sampled, in mixed batches; and without the constraint it does not (so the
constraint, not luck, is what makes the replies parse).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from captionrl.backends.base import ChatRequest
from captionrl.errors import BackendError
from captionrl.judges.online_rubric import parse_generator_reply
from captionrl.judges.roles import MAX_REPEAT, judge_messages, judgment_schema, rubric_schema, structured
from captionrl.judges.rubric import parse_judge_reply

WRITER = [{"role": "user", "content": "Write a grading rubric for captions of an image of two red circles."}]
RUBRIC = [{"criterion": "The caption counts two circles", "test": "Yes if it says two circles", "weight": 3},
          {"criterion": "The circles are red", "test": "Yes if it names red", "weight": 2},
          {"criterion": "The background is white", "test": "Yes if a white background is named", "weight": 1}]


def rubric_budget(max_items: int, max_chars: int = 160) -> int:
    """Tokens that always fit a complete rubric: every token of plain text carries at least one character."""
    return max_items * (2 * max_chars + len('{"criterion": "", "test": "", "weight": 1}, ')) + 2


def judgment_budget(n: int, max_chars: int = 100) -> int:
    return n * (max_chars + len('{"id": 10, "reason": "", "decision": "yes"}, ')) + 2


@pytest.fixture(scope="module")
def tiny():
    """The tiny random Qwen3-VL as an in-process backend (built offline, cached for the session)."""
    from captionrl.backends.hf import HFBackend

    backend = HFBackend("tiny-qwen3-vl", dtype="float32", batch_size=8)
    backend._ensure_loaded()
    return backend


# ---------------------------------------------------------------------- fast: no model
@pytest.mark.gpu_pins
def test_schemas_pin_what_the_parsers_check():
    rub = rubric_schema(2, 4)
    crit = rub["items"]["properties"]["criterion"]
    assert crit["pattern"].startswith("^[A-Za-z]")
    lengths = [n for n in range(170) if re.fullmatch(crit["pattern"], "a" * n)]
    assert lengths == list(range(3, 161))  # 3..160 characters
    # every repetition within xgrammar 0.2.7's limit (the GPU install's version: roles.MAX_REPEAT)
    assert max(int(hi) for hi in re.findall(r"\{\d+,(\d+)\}", crit["pattern"])) <= MAX_REPEAT
    jud = judgment_schema(3)
    assert [p["properties"]["id"]["const"] for p in jud["prefixItems"]] == [1, 2, 3] and jud["items"] is False
    assert list(jud["prefixItems"][0]["properties"]) == ["id", "reason", "decision"]  # reason before decision
    kw = structured(rub, "json_object")
    assert kw["json_schema"] is rub and kw["response_format"] == {"type": "json_object", "schema": rub}
    assert structured(rub)["response_format"] is None  # servers are asked only when a style is set


def test_missing_grammar_library_is_a_named_error_not_an_unscored_reply(monkeypatch):
    from captionrl.backends import structured as S

    monkeypatch.setitem(sys.modules, "xgrammar", None)  # import fails as on a machine without it
    with pytest.raises(BackendError, match=r"backend\.constrain=True.*xgrammar.*Fix: pip install xgrammar"):
        S.require_xgrammar()


# ---------------------------------------------------------------------- the tiny random model
@pytest.mark.slow
@pytest.mark.gpu_pins
def test_random_model_writes_parseable_rubrics_every_time_under_the_schema(tiny):
    schema = rubric_schema(2, 3)
    reqs = [ChatRequest(WRITER, max_new_tokens=rubric_budget(3), temperature=t, seed=s, **structured(schema))
            for t, s in [(0.0, None), (1.0, 1), (1.0, 2), (0.7, 3), (1.3, 4)]]
    gens = tiny.generate(reqs)
    for i, g in enumerate(gens):
        assert g.error is None and g.finish_reason == "stop", g
        data = json.loads(g.text)  # strict JSON: no raw control characters
        assert 2 <= len(data) <= 3 and all(list(d) == ["criterion", "test", "weight"] for d in data)
        assert all(d["weight"] in (1, 2, 3) and d["criterion"][0].isalpha() and d["test"][0].isalpha() for d in data)
        if i == 0:
            # Greedy decoding of random weights loops ("LINLINLIN..."), so its items may repeat one criterion:
            # schema-valid, and rejected by the parser's one rule a JSON schema cannot state (the
            # online rubric then retries with sampling, as a real Generator's repeat would be).
            try:
                parse_generator_reply(g.text, 2, 3)
            except ValueError as exc:
                assert "repeats an earlier criterion" in str(exc)
            continue
        assert len(parse_generator_reply(g.text, 2, 3)) == len(data)


@pytest.mark.slow
@pytest.mark.gpu_pins
def test_random_model_writes_one_decision_per_item_in_order_every_time(tiny):
    reqs = [ChatRequest(judge_messages(RUBRIC[:n], "Two red circles on white."), max_new_tokens=judgment_budget(n),
                        temperature=t, seed=s, **structured(judgment_schema(n)))
            for n, t, s in [(1, 0.0, None), (3, 0.0, None), (3, 1.0, 5), (2, 1.0, 6), (3, 1.5, 7)]]
    for (n, *_), g in zip([(1,), (3,), (3,), (2,), (3,)], tiny.generate(reqs), strict=True):
        assert g.finish_reason == "stop", g
        decisions, reasons = parse_judge_reply(g.text, n)
        assert len(decisions) == len(reasons) == n
        assert [d["id"] for d in json.loads(g.text)] == list(range(1, n + 1))


@pytest.mark.slow
def test_mixed_batch_constrains_each_row_to_its_own_schema_and_caches_grammars(tiny, monkeypatch):
    from captionrl.backends.structured import grammar_cache, model_vocab_size

    cache = grammar_cache(tiny.tokenizer, model_vocab_size(tiny.model))
    before = cache.compiled
    batches: list[int] = []
    generate = tiny.model.generate

    def counting(*a, **kw):
        batches.append(int(kw["input_ids"].shape[0]))
        return generate(*a, **kw)

    monkeypatch.setattr(tiny.model, "generate", counting)
    budget = judgment_budget(3)  # same settings for every row, so the four share one generate() call
    reqs = [ChatRequest(judge_messages(RUBRIC[:2], "A red circle."), max_new_tokens=budget, **structured(judgment_schema(2))),
            ChatRequest(WRITER, max_new_tokens=budget),
            ChatRequest(judge_messages(RUBRIC, "Two red circles."), max_new_tokens=budget, **structured(judgment_schema(3))),
            ChatRequest(judge_messages(RUBRIC[:2], "A blue square."), max_new_tokens=budget, **structured(judgment_schema(2)))]
    gens = tiny.generate(reqs)
    assert batches == [4]
    for g, n in ((gens[0], 2), (gens[2], 3), (gens[3], 2)):
        assert len(parse_judge_reply(g.text, n)[0]) == n
    with pytest.raises(ValueError):
        parse_judge_reply(gens[1].text, 2)  # the free row is the random model's own noise
    assert cache.compiled - before <= 2  # two schemas, each compiled at most once (here or by an earlier test)
    compiled = cache.compiled
    tiny.generate(reqs[:1])
    assert cache.compiled == compiled and batches == [4, 1]  # the second call reuses the compiled grammar


@pytest.mark.slow
def test_without_the_constraint_the_random_model_writes_no_valid_reply(tiny):
    """The control: the same requests on the same weights with constrain off fail the parsers."""
    from captionrl.backends.hf import HFBackend

    free = HFBackend.from_model(tiny.model, tiny._processor, name="free", constrain=False)
    reqs = [ChatRequest(WRITER, max_new_tokens=64, temperature=t, seed=s, **structured(rubric_schema(2, 3)))
            for t, s in [(0.0, None), (1.0, 1), (1.0, 2)]]
    for g in free.generate(reqs):
        with pytest.raises(ValueError):
            parse_generator_reply(g.text, 2, 3)


# ---------------------------------------------------------------------- the recipes' roles in process
@pytest.mark.slow
def test_rubicap_writer_and_generate_judge_in_process_produce_records_the_recipe_accepts(tiny, tmp_path):
    """RubiCap's ``rubrics build`` (committee captions -> writer) and its generate-mode rubric reward, both
    on the random model: every stored rubric validates, every caption is scored by the reward's formula."""
    from captionrl.domains.image_data import ImageDataConfig, load_image_items
    from captionrl.judges.rubric import RubricJudge, RubricStore
    from captionrl.judges.rubric_build import RubricWriter, build_rubrics

    items = load_image_items(ImageDataConfig(source="scenes", n=2, image_size=96), seed=0).items
    writer = RubricWriter(tiny, max_attempts=3, max_new_tokens=rubric_budget(3), min_items=2, max_items=3,
                          with_image=True)
    assert writer.structured["json_schema"]["maxItems"] == 3 and writer.structured["response_format"] is None
    # a random teacher may caption nothing: the writer and the judge are what this test reads
    summary = build_rubrics(items, teachers=[tiny], writer=writer, out_dir=tmp_path / "rubrics", max_new_tokens=16,
                            progress=False, on_teacher_failure="warn")
    store = RubricStore(tmp_path / "rubrics" / "rubrics.jsonl")
    assert len(store) == 2 and all(store.get(str(it.id)) is not None for it in items), summary  # all parsed

    judge = RubricJudge(tiny, mode="generate", store=store, max_new_tokens=judgment_budget(3))
    caps = ["Two red circles on a white background.", "A blue square."]
    got = judge.judge(caps, {"item_id": [str(it.id) for it in items]})
    for j, it in zip(got, items, strict=True):
        assert j.scored, j.error
        rubric = store.get(str(it.id))
        decisions = [d["decision"] == "yes" for d in json.loads(j.extra["raw"])]
        assert j.score == pytest.approx(sum(r.weight for r, d in zip(rubric, decisions, strict=True) if d)
                                        / sum(r.weight for r in rubric))


@pytest.mark.slow
def test_moco_records_in_process_writer_and_judge_are_accepted_by_train_moco_sft(tiny, tmp_path):
    """``moco records`` with the random model as teacher, writer and judge (language-only: the image's text
    rendering), then the multi-role SFT rows built from them: nothing rejected, nothing dropped."""
    from captionrl.config import load_config
    from captionrl.records import read_jsonl
    from captionrl.train.moco_records import MocoRecordsConfig, build_records
    from captionrl.train.moco_sft import RoleRecords, build_multirole_rows

    spec = {"kind": "hf", "model": "tiny-qwen3-vl", "dtype": "float32"}
    cfg = load_config(MocoRecordsConfig, None, [
        f"out_dir={tmp_path / 'rec'}", "data.n_train=2", "data.image_size=96", "samples=2", "max_attempts=3",
        f"teachers=[{json.dumps(spec)}]", f"writer={json.dumps(spec)}", "image_text=references", "n_candidates=2",
        "min_items=2", "max_items=3", "caption_max_new_tokens=16", f"writer_max_new_tokens={rubric_budget(3)}",
        f"judge_max_new_tokens={judgment_budget(3)}"])
    s = build_records(cfg, [tiny], tiny, tiny)
    assert s["records"] == {"captions": 4, "rubrics": 2, "judgments": 4} and s["rejected_this_run"] == {}, s
    out = Path(cfg.out_dir)
    for r in read_jsonl(out / "rubrics.jsonl"):
        assert parse_generator_reply(r["raws"][-1], 2, 3)[0].to_dict() == r["rubric"][0]
    rows = build_multirole_rows(RoleRecords.from_files(out / "captions.jsonl", out / "rubrics.jsonl", out / "judgments.jsonl"))
    assert [r["role"] for r in rows].count("judge") == 4 and len(rows) == 4 + 2 + 4
