"""Online rubrics: grouping of TRL's adjacent completions, seeded candidate subsets, the Generator's retries,
unscored groups (never 0), the facts fallback recorded as such, and real models on both roles."""

from __future__ import annotations

import json

import pytest

from captionrl.backends.base import Generation
from captionrl.domains.scenes import make_scene, rubric_from_facts
from captionrl.errors import ConfigError, DataError
from captionrl.judges.online_rubric import (
    OnlineRubricConfig,
    OnlineRubricJudge,
    choose_subset,
    fixed_roles,
    group_spans,
    parse_generator_reply,
    rubric_stats,
    subset_seed,
)
from captionrl.records import RecordWriter, read_jsonl

VALID = json.dumps([
    {"criterion": "The squares are green.", "test": "Yes if the caption says green squares.", "weight": 3},
    {"criterion": "There is one square.", "test": "Yes if the caption says exactly one square.", "weight": 2},
    {"criterion": "The square is on the left.", "test": "Yes if the caption places it on the left.", "weight": 1},
])


class ScriptedGenerator:
    """Replies from a script, one per request, and keeps the requests (a fake for parse/error paths)."""

    name = "scripted"

    def __init__(self, replies):
        self.replies = list(replies)
        self.requests = []

    def generate(self, requests):
        self.requests.extend(requests)
        return [Generation(text=self.replies.pop(0)) if self.replies else Generation(None, error="script ended")
                for _ in requests]


class NoCalls:
    name = "no-calls"

    def __getattr__(self, item):
        raise AssertionError(f"the judge must not be called for an unscored group ({item})")


def columns(n_groups: int, g: int, *, facts: bool = False):
    scenes = [make_scene(i, 0, size=96) for i in range(n_groups)]
    cols = {"item_id": [s.id for s in scenes for _ in range(g)],
            "references": [[s.reference_caption, "second"] for s in scenes for _ in range(g)],
            "image": [s.render() for s in scenes for _ in range(g)]}
    if facts:
        cols["facts"] = [json.dumps(s.facts) for s in scenes for _ in range(g)]
    return scenes, cols


def test_group_spans_follow_adjacent_runs_and_split_repeats():
    assert group_spans(["a"] * 4 + ["b"] * 4) == [(0, 4), (4, 8)]
    assert group_spans(["a"] * 8, group_size=4) == [(0, 4), (4, 8)]  # the same image twice in a row
    assert group_spans(["a", "a", "b", "b", "a", "a"]) == [(0, 2), (2, 4), (4, 6)]
    assert group_spans([]) == []


def test_subsets_are_seeded_distinct_and_vary_with_the_step():
    a = choose_subset(16, 4, subset_seed(0, 3, "img", 0))
    assert a == choose_subset(16, 4, subset_seed(0, 3, "img", 0))
    assert len(set(a)) == 4 and a == sorted(a) and all(0 <= i < 16 for i in a)
    others = {tuple(choose_subset(16, 4, subset_seed(0, s, "img", 0))) for s in range(10)}
    assert len(others) > 1, "a new step must draw new subsets"
    assert choose_subset(3, 4, subset_seed(0, 0, "x", 0)) == [0, 1, 2]


def test_parse_rejects_placeholders_example_and_short_rubrics():
    assert len(parse_generator_reply(VALID, 3, 10)) == 3
    placeholder = '[{"criterion": "...", "test": "...", "weight": 1}]'
    with pytest.raises(DataError, match="placeholder"):
        parse_generator_reply(placeholder, 1, 10)
    with pytest.raises(DataError, match="fewer than 4"):
        parse_generator_reply(VALID, 4, 10)
    with pytest.raises(ValueError, match="no JSON"):
        parse_generator_reply("The image is nice.", 1, 10)
    with pytest.raises(ConfigError):
        OnlineRubricConfig(fallback="zero")


def test_invalid_generator_replies_are_retried_then_the_group_is_unscored(tmp_path):
    _, cols = columns(2, 4)
    captions = [f"caption {i}" for i in range(8)]
    # attempt 1: both groups fail; attempt 2: group 1 valid, group 2 fails again
    gen = ScriptedGenerator(["no json here", "still no json", VALID, "[]"])
    with RecordWriter(tmp_path / "r.jsonl") as w:
        judge = OnlineRubricJudge(fixed_roles(gen, NoCalls()), OnlineRubricConfig(max_attempts=2, seed=7),
                                  judge_factory=lambda b: LengthJudge(), records=w)
        out = judge.judge(captions, {**cols, "step": [5] * 8})
    assert [j.score for j in out[4:]] == [None] * 4, "a failed rubric leaves the group unscored, never 0"
    assert all("no valid rubric" in j.error for j in out[4:])
    assert all(j.scored for j in out[:4])
    recs = list(read_jsonl(tmp_path / "r.jsonl"))
    assert [r["attempts"] for r in recs] == [2, 2]
    assert recs[0]["source"] == "generator:scripted" and recs[1]["source"] == "unscored"
    assert recs[1]["retry_seeds"][0] is None and isinstance(recs[1]["retry_seeds"][1], int)
    assert recs[0]["subset_seed"] == subset_seed(7, 5, cols["item_id"][0], 0)
    assert [r.temperature for r in gen.requests] == [0.0, 0.0, 0.7, 0.7]
    stats = rubric_stats(judge.last_groups)
    assert stats["rubric/unscored_groups_frac"] == 0.5 and stats["rubric/generator_valid_frac"] == 0.5


class LengthJudge:
    """Scores by caption length (deterministic) so the test can see which rubric scored what."""

    def judge(self, captions, cols):
        from captionrl.types import Judgment

        return [Judgment(score=len(c) / 100, extra={"n": len(r)}) for c, r in zip(captions, cols["rubric"], strict=True)]


def test_generator_sees_exactly_the_recorded_subset_and_the_rubric_scores_all_g():
    _, cols = columns(1, 8)
    captions = [f"candidate number {i} says something" for i in range(8)]
    gen = ScriptedGenerator([VALID])
    judge = OnlineRubricJudge(fixed_roles(gen), OnlineRubricConfig(n_candidates=4, seed=1),
                              judge_factory=lambda b: LengthJudge())
    out = judge.judge(captions, {**cols, "step": [2] * 8})
    group = judge.last_groups[0]
    parts = gen.requests[0].messages[0]["content"]
    assert parts[0]["type"] == "image" and parts[0]["image"] is cols["image"][0], "the Generator sees the image"
    prompt = parts[1]["text"]
    shown = [c for c in captions if c in prompt]
    assert shown == [captions[i] for i in group.subset] and len(shown) == 4
    assert "Reference caption 1" in prompt and "Reference caption 2" in prompt
    assert len(out) == 8 and all(j.extra["rubric_size"] == 3 for j in out)


def test_facts_fallback_is_recorded_as_such():
    scenes, cols = columns(1, 4, facts=True)
    judge = OnlineRubricJudge(fixed_roles(ScriptedGenerator(["nope"])),
                              OnlineRubricConfig(max_attempts=1, fallback="facts"),
                              judge_factory=lambda b: LengthJudge())
    out = judge.judge(["a", "b", "c", "d"], cols)
    assert all(j.scored and j.extra["rubric_source"] == "facts-fallback" for j in out)
    assert judge.last_groups[0].rubric == rubric_from_facts(scenes[0])
    assert judge.last_groups[0].to_record()["source"] == "facts-fallback"


@pytest.mark.slow
def test_real_models_tiny_vlm_generator_unscored_and_embedded_judge_scores_facts(embedded_backend, tmp_path):
    """Real models on both roles: the untrained tiny VLM cannot write a rubric (its groups are unscored,
    replies kept); with the facts fallback the embedded SmolLM2 judges, and the true caption beats the
    contradicting one of the same scene."""
    from captionrl.backends.hf import HFBackend
    from captionrl.judges.online_rubric import MocoRubricJudge
    from captionrl.tiny_models.vlm import tiny_vlm_dir

    vlm = HFBackend(str(tiny_vlm_dir()))
    scene = make_scene(1, 1, size=96)
    cols = {"item_id": [scene.id] * 4, "references": [[scene.reference_caption, "x"]] * 4,
            "image": [scene.render()] * 4, "facts": [json.dumps(scene.facts)] * 4}
    captions = [scene.reference_caption, scene.contradicting_caption, scene.reference_caption,
                scene.contradicting_caption]
    cfg = OnlineRubricConfig(max_attempts=2, max_new_tokens=16, seed=0)
    unscored = OnlineRubricJudge(fixed_roles(vlm, NoCalls()), cfg).judge(captions, cols)
    assert all(j.score is None for j in unscored)
    factory = lambda b: MocoRubricJudge(b, mode="likelihood")  # noqa: E731
    fb = OnlineRubricJudge(fixed_roles(vlm, embedded_backend), OnlineRubricConfig(
        max_attempts=1, max_new_tokens=16, fallback="facts"), judge_factory=factory)
    got = fb.judge(captions, cols)
    group = fb.last_groups[0]
    assert group.raws and group.raws[0], "the Generator's real reply is kept as evidence"
    assert group.source == "facts-fallback"
    assert all(j.scored for j in got)
    assert got[0].score > got[1].score
