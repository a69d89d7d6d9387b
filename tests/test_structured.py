"""Schema-constrained decoding in process (``backends.structured`` through the ``hf`` backend).

The claim under test: a *randomly initialised* model (the tiny Qwen3-VL fixture, which writes random
tokens) decoding under the rubric or judgment schema produces JSON that the recipes' own parsers accept,
every time, greedy and sampled, in mixed batches; and without the constraint it does not (so the
constraint, not luck, is what makes the replies parse).
"""

from __future__ import annotations

import json
import sys

import pytest

from captionrl.backends.base import ChatRequest
from captionrl.errors import BackendError
from captionrl.judges.online_rubric import parse_generator_reply
from captionrl.judges.roles import judge_messages, judgment_schema, rubric_schema, structured
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
def test_schemas_pin_what_the_parsers_check():
    rub = rubric_schema(2, 4)
    crit = rub["items"]["properties"]["criterion"]
    assert crit["pattern"].startswith("^[A-Za-z]") and crit["pattern"].endswith("{2,159}$")
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
    assert not S.xgrammar_available()


# ---------------------------------------------------------------------- the tiny random model
@pytest.mark.slow
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
def test_mixed_batch_constrains_only_the_rows_with_a_schema_and_caches_grammars(tiny):
    from captionrl.backends.structured import grammar_cache, model_vocab_size

    cache = grammar_cache(tiny.tokenizer, model_vocab_size(tiny.model))
    before = cache.compiled
    schema = judgment_schema(2)
    reqs = [ChatRequest(judge_messages(RUBRIC[:2], "A red circle."), max_new_tokens=judgment_budget(2), temperature=1.0,
                        seed=10 + i, **structured(schema)) for i in range(3)]
    free = ChatRequest(WRITER, max_new_tokens=24, temperature=1.0, seed=9)
    gens = tiny.generate([reqs[0], free, reqs[1], reqs[2]])  # one generate() call: rows differ in constraint
    for g in (gens[0], gens[2], gens[3]):
        parse_judge_reply(g.text, 2)
    with pytest.raises(ValueError):
        parse_judge_reply(gens[1].text, 2)  # the free row is the random model's own noise
    assert cache.compiled - before <= 1  # one schema, compiled at most once (here or by an earlier test)
    tiny.generate(reqs[:1])
    assert cache.compiled - before <= 1


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
