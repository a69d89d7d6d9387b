"""Rewards for OpenRLHF 0.11 and verl, replayed as their own clients call them (docs/engines.md).

Each replay runs against a real reward service on 127.0.0.1 (uvicorn in a thread); the verifier is a real
llama.cpp server (``tests/servers.py``) that is killed and restarted mid-run. The clients' code paths are
copied from the engines' sources (versions in docs/engines.md): OpenRLHF's ``_post_request`` (5 tries, 1 s
apart, then ``None``) and ``torch.tensor([value])`` conversions; verl's reward loop (one call per sample,
``compute_score`` in a thread pool or ``compute_score_async`` awaited, ``torch.tensor(scores)`` and
extra-info arrays keyed by the first sample). Fakes appear only for the policy's unit checks.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from captionrl.adapters.engine import encode_label
from captionrl.errors import BackendError, ConfigError, DataError
from captionrl.judges.ngram import CorpusRequired
from captionrl.rewards.spec import RewardSpec
from captionrl.serve.failure import (
    FailurePolicy,
    UnscorableCaption,
    VerifierOutage,
    classify,
    settle,
)
from captionrl.types import Judgment
from servers import requires_llama_cpp
from test_serve import Service, service_factory  # noqa: F401  (the service in a thread; its fixture)

RISING = [float(v) for v in range(1, 13)]
FALLING = RISING[::-1]
PROMPT = "Describe the time series.\n"
REFS = [["a red circle above a blue square", "a red ball over a blue box"],
        ["two green triangles on the left", "green triangles at the left edge"],
        ["a yellow star in the middle of a black sky"],
        ["an orange cat sleeping on a sofa"],
        ["a white boat on a calm lake at dawn"],
        ["three people walking a dog in the park"]]


def strict_json(text: str) -> Any:
    """Parse a reply, failing on NaN/Infinity (what an engine would turn into a poisoned tensor)."""
    def refuse(token: str) -> Any:
        raise AssertionError(f"reply carries non-finite {token}: {text[:300]}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def reference_file(tmp_path: Path) -> Path:
    p = tmp_path / "train_refs.jsonl"
    p.write_text("".join(json.dumps({"references": r}) + "\n" for r in REFS))
    return p


# ------------------------------------------------------------------------------------ the policy itself
def test_policy_classifies_and_never_returns_a_non_finite_reward():
    down = Judgment(score=None, error="verifier failed on 2/2 rotations: failed after 1 attempt(s): connection "
                                      "error from http://127.0.0.1:9/v1 (ConnectError: refused)")
    no_grade = Judgment(score=None, error="no grade 1-10 in the reply")
    assert [classify(j) for j in (Judgment(score=0.3), down, no_grade, Judgment(score=math.inf))] == [
        "scored", "outage", "unscorable", "unscorable"]
    with pytest.raises(VerifierOutage, match="refusing to invent a reward"):
        settle([Judgment(score=0.3), down], FailurePolicy(unscored_reward=0.0))
    with pytest.raises(UnscorableCaption, match="unscored_reward"):
        settle([no_grade], FailurePolicy())
    got = settle([Judgment(score=0.3), no_grade, Judgment(score=math.nan)], FailurePolicy(unscored_reward=-1.0))
    assert [(s.reward, s.scored) for s in got] == [(0.3, True), (-1.0, False), (-1.0, False)]
    assert got[1].error == "no grade 1-10 in the reply"
    for bad in (math.nan, math.inf):
        with pytest.raises(ConfigError, match="unscored_reward"):
            FailurePolicy(unscored_reward=bad)


def test_a_likelihood_verifier_outage_is_classified_as_an_outage():
    """The likelihood judges used to drop the backend's error ("verifier returned no log-likelihood"), so
    an unreachable verifier looked like an unscorable caption and would have been given unscored_reward."""
    from captionrl.backends.openai_http import OpenAIBackend
    from captionrl.judges.identification import IdentificationJudge, IdentifyConfig
    from captionrl.judges.rubric import RubricJudge

    backend = OpenAIBackend("http://127.0.0.1:9/v1", model="m", max_retries=0, progress=False)
    ident = IdentificationJudge(backend, IdentifyConfig(mode="likelihood", k=2)).judge(
        ["It rises."], {"candidates": [[[1.0, 2.0], [2.0, 1.0]]]})[0]
    rubric = RubricJudge(backend, mode="likelihood").judge(
        ["A red circle."], {"rubric": [[{"criterion": "A red circle", "test": "Is it red?", "weight": 1}]]})[0]
    for j in (ident, rubric):
        assert classify(j) == "outage" and "connection error" in (j.error or ""), j.error


def test_removed_nan_settings_say_what_replaces_them(monkeypatch):
    from captionrl.adapters import engine
    from captionrl.serve.config import RewardServiceConfig

    with pytest.raises(ConfigError, match="unscored_reward"):
        RewardServiceConfig(reward=RewardSpec(family="cider"), failure_value="nan")
    with pytest.raises(ConfigError, match="unscored_reward"):
        RewardServiceConfig(reward=RewardSpec(family="cider"), unscored_reward=math.nan)
    monkeypatch.setenv(engine.REMOVED_ENV, "nan")
    with pytest.raises(ConfigError, match=engine.UNSCORED_ENV):
        engine.failure_policy()


def test_an_unscorable_caption_gets_the_chosen_value_or_a_422(tmp_path: Path):
    """A judge that answered but gave no score (a parse path: a stand-in judge): with no unscored_reward the
    request is refused (422 naming it); with one, the caption gets it, flagged, counted and recorded; a
    judge's non-finite score is treated the same way. No reply holds NaN or inf."""
    from starlette.testclient import TestClient

    from captionrl.serve.app import create_app
    from captionrl.serve.config import RewardServiceConfig

    class NoGrade:
        name = "no-grade"

        def judge(self, captions, columns):
            return [Judgment(score=None, error="no grade 1-10 in the reply"), Judgment(score=math.inf),
                    Judgment(score=0.7, extra={"accuracy": math.nan})][: len(captions)]

    body = {"query": ["a", "b", "c"], "labels": [{"reference": "r"}] * 3}
    with TestClient(create_app(RewardServiceConfig(reward=RewardSpec(family="judge"), batch_window_ms=0, records=None), NoGrade())) as c:
        reply = c.post("/reward", json=body)
        assert reply.status_code == 422 and strict_json(reply.text)["error"]["field"] == "unscored_reward"
        assert "no grade" in reply.json()["error"]["fix"] and c.get("/health").json()["refused"] == 1
    records = tmp_path / "r.jsonl"
    cfg = RewardServiceConfig(reward=RewardSpec(family="answerability"), batch_window_ms=0, records=str(records), unscored_reward=0.25)
    questions = [{"question": "q?", "options": ["a", "b"], "answer": "a"}]
    body = {"query": ["a", "b", "c"], "labels": [{"questions": questions}] * 3}
    with TestClient(create_app(cfg, NoGrade())) as c:
        got = strict_json(c.post("/reward", json=body).text)
        assert got["rewards"] == [0.25, 0.25, 0.7] and got["scored"] == [False, False, True]
        assert got["extra_logs"] == {"unscored": [1.0, 1.0, 0.0], "accuracy": [0.25, 0.25, 0.7],
                                     "cannot_answer_rate": [0.25, 0.25, 0.7]}
        assert got["errors"][:2] == ["no grade 1-10 in the reply", "non-finite score inf"]
        assert c.get("/health").json()["unscored"] == 2
    (rec,) = [json.loads(line) for line in records.read_text().splitlines()]
    assert rec["scored"] == [False, False, True] and rec["errors"][0] == "no grade 1-10 in the reply"


# ------------------------------------------------------------------------------------ labels
def test_malformed_labels_are_400_naming_field_and_fix(tmp_path: Path, reference_file: Path):
    """Every reward family: JSON that does not parse, a wrong type, a missing column -> 400, never a score.
    (The labels are checked before any judge call, so the LLM judges' verifier is never reached.)"""
    from starlette.testclient import TestClient

    from captionrl.serve.app import create_app
    from captionrl.serve.config import RewardServiceConfig, build_judge

    nowhere = {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1", "max_retries": 0}
    cases = {
        "cider": [("not json {", "labels[0]"), ('{"references": []}', "labels[0].references"),
                  ('{"refs": ["a"]}', "labels[0].references"), (5, "labels[0].references")],
        "identification": [('{"candidates": [[1, 2], "x"]}', "labels[0].candidates[1]"),
                           ({"candidates": [[1, 2]]}, "labels[0].candidates"), ({}, "labels[0].candidates")],
        "rubric": [({"rubric": [{"criterion": "", "test": "t", "weight": 1}]}, "labels[0].rubric[0].criterion")],
        "answerability": [({"questions": [{"question": "q?", "options": ["a", "b"], "answer": "c"}]},
                           "labels[0].questions[0].answer")],
        "judge": [('{"reference": 3}', "labels[0].reference")],
    }
    for reward, bad in cases.items():
        fields: dict[str, Any] = {"reward": {"family": reward}, "records": None, "batch_window_ms": 0,
                                  "verifier": nowhere}
        if reward == "cider":
            fields["reward"]["cider"] = {"references": str(reference_file)}
        from captionrl.config import from_dict

        cfg = from_dict(RewardServiceConfig, fields)
        with TestClient(create_app(cfg, build_judge(cfg))) as client:
            for label, field in bad:
                reply = client.post("/reward", json={"query": [PROMPT + "a caption"], "prompts": [PROMPT],
                                                     "labels": [label]})
                assert reply.status_code == 400, (reward, label, reply.text)
                err = strict_json(reply.text)["error"]
                assert err["field"] == field and err["problem"] and err["fix"], (reward, err)
            reply = client.post("/reward", json={"query": ["no prompt here"], "prompts": [PROMPT], "labels": [None]})
            assert reply.status_code == 400 and strict_json(reply.text)["error"]["field"] == "query[0]"


def test_the_eos_text_openrlhf_decodes_is_not_judged(service_factory, reference_file):  # noqa: F811
    """OpenRLHF 0.11 decodes prompt + response with skip_special_tokens=False: the response's EOS arrives as
    text, and CIDEr-D would count its tokens ("im", "end") as words of the caption."""
    from captionrl.serve.text import strip_end

    assert strip_end("A cat.<|im_end|>", ["<|im_end|>"]) == "A cat."
    assert strip_end("A cat. </s> <|im_end|>\n", ["<|im_end|>", "</s>"]) == "A cat."
    assert strip_end("A cat. ", ["</s>"]) == "A cat. "
    svc = service_factory(reward={"family": "cider", "cider": {"references": str(reference_file)}}, records=None)
    label = json.dumps({"references": REFS[0]})
    plain, with_eos = (strict_json(svc.post({"query": [PROMPT + c], "prompts": [PROMPT], "labels": [label]}).text)
                       for c in (REFS[0][0], REFS[0][0] + "<|im_end|>"))
    assert with_eos["rewards"] == plain["rewards"]


# ------------------------------------------------------------------------------------ CIDEr-D
def test_cider_refuses_to_start_without_training_references(monkeypatch, tmp_path: Path):
    from captionrl.adapters import engine
    from captionrl.adapters.verl import compute_score
    from captionrl.serve.config import RewardServiceConfig, build_judge

    with pytest.raises(CorpusRequired) as info:
        build_judge(RewardServiceConfig(reward=RewardSpec(family="cider")))
    assert info.value.field == "reward.cider.references" and "prepared folder" in info.value.fix
    yaml = tmp_path / "reward.yaml"
    yaml.write_text("reward:\n  family: cider\n")
    monkeypatch.setenv("CAPTIONRL_REWARD_CONFIG", str(yaml))
    engine.setup.cache_clear()
    engine.reward.cache_clear()
    try:
        with pytest.raises(CorpusRequired):
            compute_score("caps", "a red circle", json.dumps({"references": ["a red circle"]}))
    finally:
        engine.setup.cache_clear()
        engine.reward.cache_clear()


def _prepared_folder(tmp_path: Path) -> Path:
    """A real ``captionrl data prepare`` folder (JSONL source) whose train items carry captions."""
    import numpy as np

    from captionrl.domains.prepare import PrepareConfig, prepare

    src = tmp_path / "items.jsonl"
    rng = np.random.default_rng(0)
    with src.open("w") as f:
        for i in range(24):
            split = "train" if i < 12 else "val" if i < 18 else "test"
            f.write(json.dumps({"id": f"x{i}", "series": rng.normal(size=16).cumsum().round(2).tolist(),
                                "caption": REFS[i % len(REFS)][0] + f" number {i}", "split": split}) + "\n")
    out = tmp_path / "prepared"
    prepare(PrepareConfig(source="jsonl", path=str(src), out=str(out), quiet=True))
    return out


def test_cider_single_sample_requests_rank_the_reference_first(service_factory, tmp_path, reference_file):  # noqa: F811
    """One sample per request, as OpenRLHF 0.11 and verl send them: with the training references fitted
    once, a reference-equal caption outscores an unrelated one (it was 0 for both before)."""
    from captionrl.judges.ngram import load_reference_sets

    folder_sets = load_reference_sets(_prepared_folder(tmp_path))
    assert len(folder_sets) == 12 and folder_sets[0][0].endswith("number 0")
    for source in (reference_file, tmp_path / "prepared"):
        svc = service_factory(reward={"family": "cider", "cider": {"references": str(source)}}, records=None)
        label = json.dumps({"references": REFS[0]})
        same = strict_json(svc.post({"query": [PROMPT + REFS[0][0]], "prompts": [PROMPT], "labels": [label]}).text)
        other = strict_json(svc.post({"query": [PROMPT + "an orange cat on a sofa"], "prompts": [PROMPT],
                                      "labels": [label]}).text)
        assert same["scored"] == [True] and same["rewards"][0] > 1.0 > other["rewards"][0] >= 0.0, (same, other)
        assert svc.health()["captions"] == 2


def test_training_fits_cider_once_on_its_own_rows(reference_file):
    from captionrl.train.rubicap import RubicapConfig, make_reward

    cfg = RubicapConfig()
    cfg.reward.family = "cider"
    rows = [{"references": r} for r in REFS]
    judge = make_reward(cfg, None, rows).base
    df = dict(judge.scorer.df)
    assert judge.scorer.n_docs == len(REFS)
    first = judge.judge([REFS[0][0]], {"references": [REFS[0]]})[0].score
    judge.judge(["x y z"] * 3, {"references": [REFS[1]] * 3})  # another batch: nothing refits
    assert dict(judge.scorer.df) == df and judge.judge([REFS[0][0]], {"references": [REFS[0]]})[0].score == first
    cfg.reward.cider.references = str(reference_file)
    assert make_reward(cfg, None, rows[:2]).base.scorer.n_docs == len(REFS)  # the file wins over the rows


# ------------------------------------------------------------------------------------ client replays
def openrlhf_convert(info: dict[str, Any]) -> dict[str, Any]:
    """OpenRLHF 0.11's handling of one reply (agent.py ``execute`` + samples_generator.py
    ``_process_response_into_experience``): scores fall back to rewards, everything via torch.tensor."""
    import torch

    score = info.get("scores")
    if score is None:
        score = info.get("rewards")
    logs = {k: torch.tensor([v]) for k, v in (info.get("extra_logs") or {}).items()}
    return {"rewards": torch.tensor([info.get("rewards")]), "scores": torch.tensor([score]), "info": logs}


async def openrlhf_post(client: httpx.AsyncClient, url: str, data: dict[str, Any], replies: list[str],
                        try_max_times: int = 5) -> dict[str, Any] | None:
    """OpenRLHF 0.11's ``_post_request``: raise_for_status, 5 tries 1 s apart, then the reward stays None."""
    for _ in range(try_max_times):
        try:
            response = await client.post(url, json=data, timeout=180)
            replies.append(response.text)
            response.raise_for_status()
            return strict_json(response.text)
        except httpx.HTTPError:
            pass
        await asyncio.sleep(1)
    return None


def openrlhf_samples(captions: list[str]) -> list[dict[str, Any]]:
    """One OpenRLHF request per sample: ``{"query": [q], "prompts": [p], "labels": [l]}``."""
    label = json.dumps({"reference": "A red circle above a blue square."})
    # OpenRLHF decodes with skip_special_tokens=False: the response ends in its EOS text
    return [{"query": [PROMPT + c + "<|im_end|>"], "prompts": [PROMPT], "labels": [label]} for c in captions]


def group_advantages(rewards: list[Any], n: int) -> Any:
    """OpenRLHF's group_norm over the concatenated rewards (experience_maker.py): no mask anywhere."""
    import torch

    r = torch.cat(rewards, dim=0).reshape(-1, n)
    return (r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + 1e-9)


def kill_then_restart(svc: Service, server: Any, after_served: int, down_s: float) -> threading.Thread:
    """Kill the verifier (SIGKILL) once it served ``after_served`` requests, restart it ``down_s`` later."""
    def run() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and sum(r["served"] for r in svc.health()["replicas"]) < after_served:
            time.sleep(0.02)
        server.kill()
        time.sleep(down_s)
        server.start()

    t = threading.Thread(target=run)
    t.start()
    return t


def verifier_service(service_factory, server, tmp_path: Path, **kw: Any) -> Service:  # noqa: F811
    """The service on a llama.cpp verifier: the scalar judge reading its grade's probabilities (one
    verifier call per caption keeps the replays short on a shared CPU); no verifier-side retries, so an
    outage reaches the service's policy at once."""
    fields = {"reward": {"family": "judge", "judge": {"mode": "choose"}, "subject": "image"},
              "verifier": {"kind": "openai", "model": "smollm2", "base_url": server.base_url, "concurrency": 2,
                          "max_retries": 0, "timeout_s": 60.0, "cooldown_s": 0.5},
              "batch_window_ms": 200, "outage_retry_s": 0.5, "records": str(tmp_path / "requests.jsonl")}
    return service_factory(**{**fields, **kw})


CAPTIONS = ["A red circle above a blue square.", "A red circle.", "Nothing to see.", "A blue square below a red circle."]


@pytest.mark.server
@requires_llama_cpp
def test_openrlhf_per_sample_replay_survives_a_killed_and_restarted_verifier(llama_server_factory,
                                                                          service_factory, tmp_path):  # noqa: F811
    import torch

    server = llama_server_factory()
    svc = verifier_service(service_factory, server, tmp_path)
    captions = CAPTIONS
    replies: list[str] = []

    async def rollout(url: str, samples: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
        async with httpx.AsyncClient() as client:  # many samples in flight, one POST each
            return await asyncio.gather(*(openrlhf_post(client, url, s, replies) for s in samples))

    killer = kill_then_restart(svc, server, after_served=1, down_s=1.0)
    infos = asyncio.run(rollout(svc.url + "/reward", openrlhf_samples(captions)))
    killer.join()
    assert all(info is not None for info in infos), replies
    exps = [openrlhf_convert(info) for info in infos]  # type: ignore[arg-type]
    assert all(bool(torch.isfinite(e["rewards"]).all() and torch.isfinite(e["scores"]).all()) for e in exps)
    assert all(bool(torch.isfinite(v).all()) for e in exps for v in e["info"].values())
    assert bool(torch.isfinite(group_advantages([e["rewards"] for e in exps], 2)).all())
    assert all(info["scored"] == [True] for info in infos)  # type: ignore[index]
    health = svc.health()
    assert health["retries"] >= 1 and health["outages"] == 0, health  # re-judged through the outage
    recs = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert max(r["batch_size"] for r in recs) > 1  # per-sample requests were pooled into verifier batches

    # the verifier stays down: 503 after the deadline, OpenRLHF's 5 tries, then None -> its batch fails
    server.kill()
    down = verifier_service(service_factory, server, tmp_path / "down", outage_deadline_s=1.0)
    replies.clear()
    t0 = time.monotonic()
    infos = asyncio.run(rollout(down.url + "/reward", openrlhf_samples(captions[:2])))
    assert infos == [None, None] and time.monotonic() - t0 < 60
    bodies = [strict_json(r) for r in replies]
    assert len(bodies) == 10 and all(b["error"]["field"] == "verifier" for b in bodies)
    assert "connection error" in bodies[0]["error"]["value"]
    with pytest.raises(TypeError):  # OpenRLHF's torch.cat over a None reward: the run stops
        group_advantages([None, None], 2)
    assert down.health()["outages"] == 10


def verl_reduce(outputs: list[Any]) -> tuple[Any, dict[str, Any]]:
    """verl's ``NaiveRewardManager.run_single`` result handling + ``RewardLoopManager.compute_rm_score``."""
    import numpy as np
    import torch

    scores, infos = [], []
    for result in outputs:
        if isinstance(result, dict):
            scores.append(result["score"])
            infos.append(dict(result))
        else:
            scores.append(result)
            infos.append({"acc": result})
    tensor = torch.tensor(scores, dtype=torch.float32)
    keys = list(infos[0].keys())
    return tensor, {k: np.array([info[k] for info in infos]) for k in keys}  # KeyError if keys vary


def _verl_wrap(fn: Any, reward_kwargs: dict[str, Any]) -> Any:
    """``verl.trainer.ppo.reward.get_custom_reward_fn``: a partial merging ``reward_kwargs`` into each call."""
    if inspect.iscoroutinefunction(fn):
        async def call_async(raw: Any, extra: dict[str, Any], *a: Any, **k: Any) -> Any:
            return await raw(*a, **{**k, **extra})

        return partial(call_async, fn, reward_kwargs)

    def call(raw: Any, extra: dict[str, Any], *a: Any, **k: Any) -> Any:
        return raw(*a, **{**k, **extra})

    return partial(call, fn, reward_kwargs)


async def verl_loop(fn: Any, samples: list[tuple[str, Any]], reward_kwargs: dict[str, Any]) -> list[Any]:
    """verl's reward loop (``RewardLoopWorker.compute_score_batch`` + ``NaiveRewardManager.run_single``): one
    call per sample, all at once; awaited when a coroutine function, else in the loop's thread pool."""
    compute_score = _verl_wrap(fn, reward_kwargs)
    loop = asyncio.get_running_loop()

    async def run_single(solution: str, ground_truth: Any) -> Any:
        kwargs = {"data_source": "captions", "solution_str": solution, "ground_truth": ground_truth,
                  "extra_info": {"num_turns": None, "rollout_reward_scores": {}}}
        if inspect.iscoroutinefunction(compute_score):
            return await compute_score(**kwargs)
        return await loop.run_in_executor(None, lambda: compute_score(**kwargs))

    return await asyncio.gather(*(run_single(s, g) for s, g in samples))


def test_verl_reward_loop_replay_cider_sync_and_async(service_factory, reference_file):  # noqa: F811
    """verl's reward loop through the client, sync and async, without a verifier (CIDEr-D): finite scores,
    one key set, the reference caption first, concurrent single-sample calls pooled into one batch."""
    from captionrl.serve import client

    svc = service_factory(reward={"family": "cider", "cider": {"references": str(reference_file)}}, batch_window_ms=300,
                          records=None)
    label = json.dumps({"references": REFS[0]})
    samples = [(REFS[0][0], label), ("an orange cat on a sofa", label), (REFS[0][1], {"references": REFS[0]})]
    for fn in (client.compute_score, client.compute_score_async):
        outputs = asyncio.run(verl_loop(fn, samples, {"url": svc.url}))
        scores, extra = verl_reduce(outputs)
        assert scores.isfinite().all() and scores[0] > 1.0 > scores[1] and scores[2] > scores[1]
        assert set(extra) == {"score", "unscored", "error", "base", "length_penalty", "caption_chars"}
        assert list(extra["unscored"]) == [0.0, 0.0, 0.0]
    assert svc.health()["batches"] <= 4  # 6 per-sample calls, pooled


@pytest.mark.server
@requires_llama_cpp
def test_verl_reward_loop_replay_survives_a_killed_and_restarted_verifier(llama_server_factory, service_factory,  # noqa: F811
                                                                          tmp_path, monkeypatch):
    from captionrl.serve import client

    server = llama_server_factory()
    svc = verifier_service(service_factory, server, tmp_path)
    label = {"reference": "A red circle above a blue square."}  # verl's ground truth: any JSON value
    samples = [(c, label) for c in CAPTIONS]
    killer = kill_then_restart(svc, server, after_served=1, down_s=1.0)
    outputs = asyncio.run(verl_loop(client.compute_score_async, samples, {"url": svc.url}))
    killer.join()
    scores, extra = verl_reduce(outputs)
    assert scores.isfinite().all() and list(extra["unscored"]) == [0.0] * len(CAPTIONS)
    assert set(extra) == {"score", "unscored", "error", "expected_grade", "grade", "base", "length_penalty", "caption_chars"}
    assert svc.health()["retries"] >= 1
    sync = asyncio.run(verl_loop(client.compute_score, samples[:2], {"url": svc.url}))  # the thread-pool path
    assert verl_reduce(sync)[0].isfinite().all()

    # the verifier stays down: the service answers 503 past its deadline, the client gives up and raises
    server.kill()
    down = verifier_service(service_factory, server, tmp_path / "down", outage_deadline_s=1.0)
    monkeypatch.setenv(client.DEADLINE_ENV, "3")
    with pytest.raises(BackendError, match="gave no reward"):
        asyncio.run(verl_loop(client.compute_score_async, samples[:1], {"url": down.url}))
    with pytest.raises(BackendError, match="HTTP 503"):
        client.compute_score("captions", samples[0][0], samples[0][1], url=down.url)
    with pytest.raises(BackendError, match="HTTP 400"):  # a malformed label is never retried, never scored
        client.compute_score("captions", "x", "not json {", url=down.url)


# ------------------------------------------------------------------------------------ every family
@pytest.mark.slow
def test_every_reward_family_through_the_service_ranks_the_better_caption(embedded_backend, service_factory,  # noqa: F811
                                                                          reference_file):
    """Per family, one single-sample request per caption through the real service: the caption that fits
    its label outscores one that does not. The LLM judges run on the embedded SmolLM2 in the service's
    process (its likelihood and grade probabilities carry the signal; on this shared 2-core CPU the
    llama.cpp server's echo log-probs took minutes). Answerability is the exception, stated: SmolLM2's
    multiple-choice letters do not depend on the caption (the same letter probabilities within 0.04 for
    a caption that answers and one that does not), so its two captions must tie, finite and scored."""
    from captionrl.config import from_dict
    from captionrl.serve.config import RewardServiceConfig, build_judge

    for reward, (settings, label, good, bad) in FAMILIES(reference_file).items():
        fields = {"reward": {"family": reward, **settings}, "records": None, "unscored_reward": 0.0}
        cfg = from_dict(RewardServiceConfig, fields)
        svc = service_factory(judge=build_judge(cfg, backend=embedded_backend), **fields)
        got = {}
        for name, caption in (("good", good), ("bad", bad)):
            body = strict_json(svc.post({"query": [PROMPT + caption], "prompts": [PROMPT], "labels": [label]}).text)
            assert body["scored"] == [True], (reward, body)
            got[name] = body["rewards"][0]
        if reward == "answerability":
            assert got["good"] == got["bad"], got
        else:
            assert got["good"] > got["bad"], (reward, got)


def FAMILIES(reference_file: Path) -> dict[str, tuple[dict[str, Any], Any, str, str]]:
    """reward -> (service settings, label, a caption that fits the label, one that does not)."""
    series, other = [3.0, 4.0, 6.0, 9.0, 13.0, 18.0], [18.0, 13.0, 9.0, 6.0, 4.0, 3.0]
    return {
        "identification": ({"mode": "likelihood", "k": 2, "signal": "soft"},
                           encode_label([series, other]), "It starts at 3 and rises to 18.",
                           "It starts at 18 and falls to 3."),
        "rubric": ({"rubric": {"mode": "likelihood", "decision": "soft"}},
                   {"rubric": [{"criterion": "The caption says the circle is red", "test": "Is the circle red?",
                                "weight": 2}]},
                   "A red circle.", "A blue square."),
        "judge": ({"judge": {"mode": "choose"}, "subject": "image"}, {"reference": "A red circle above a blue square."},
                   "A red circle above a blue square.", "Nothing to see."),
        "answerability": ({"answerability": {"n_questions": 2, "cannot_answer": False}, "subject": "image"},
                          {"questions": [{"question": "Is there a cat in the picture?", "options": ["yes", "no"],
                                          "answer": "yes"}], "id": "item-1"},
                          "A cat sits on a mat.", "An empty room with no animals."),
        "cider": ({"cider": {"references": str(reference_file)}}, {"references": REFS[0]}, REFS[0][0],
                  "an orange cat on a sofa"),
    }


# ------------------------------------------------------------------------------------ adapters
def test_adapters_serve_cider_with_the_same_labels_and_policy(monkeypatch, tmp_path, reference_file):
    """The in-process adapters give the service's rewards (one label format, one policy, fixed keys)."""
    from captionrl.adapters import engine
    from captionrl.adapters.openrlhf import reward_func
    from captionrl.adapters.verl import compute_score, compute_score_async

    yaml = tmp_path / "reward.yaml"
    yaml.write_text(f"reward:\n  family: cider\n  cider:\n    references: {reference_file}\n")
    monkeypatch.setenv("CAPTIONRL_REWARD_CONFIG", str(yaml))
    engine.setup.cache_clear()
    engine.reward.cache_clear()
    try:
        label = json.dumps({"references": REFS[0]})
        same, other = compute_score("c", REFS[0][0], label), compute_score("c", "an orange cat", label)
        assert same["score"] > 1.0 > other["score"] and set(same) == set(other)
        assert asyncio.run(compute_score_async("c", REFS[0][0], label))["score"] == pytest.approx(same["score"])
        out = reward_func([PROMPT + REFS[0][0] + "<|im_end|>"], [PROMPT], [label])
        assert float(out["rewards"][0]) == pytest.approx(same["score"]) and set(out["extra_logs"]) == {"unscored", "base", "length_penalty", "caption_chars"}
        with pytest.raises(DataError, match=r"labels\[0\]"):
            compute_score("c", "x", "not json {")
    finally:
        engine.setup.cache_clear()
        engine.reward.cache_clear()
