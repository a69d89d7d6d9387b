"""The reward service on 127.0.0.1: OpenRLHF's contract, replica failover mid-batch, pooling across
clients, clear 400s, an outage past the deadline is a 503 (never NaN, never 0). The engines' own client
patterns are replayed in test_engines.py."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from captionrl.adapters.engine import encode_label
from captionrl.config import from_dict
from captionrl.rewards.spec import RewardSpec
from captionrl.serve.config import RewardServiceConfig
from captionrl.serve.reward import make_server
from servers import free_port, requires_llama_cpp

RISING = [float(v) for v in range(1, 13)]
FALLING = RISING[::-1]
PROMPT = "Describe the time series.\n"


class Service:
    """The service in a thread of this process, on a free port; stopped by ``close``."""

    def __init__(self, judge=None, **fields) -> None:
        fields.setdefault("port", free_port())
        self.cfg = from_dict(RewardServiceConfig, fields)
        self.server = make_server(self.cfg, judge)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://127.0.0.1:{self.cfg.port}"
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "service did not start"
            time.sleep(0.05)

    def post(self, body, timeout: float = 300.0) -> httpx.Response:
        return httpx.post(self.url + "/reward", json=body, timeout=timeout)

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=10).json()

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def service_factory() -> Iterator:
    started: list[Service] = []

    def start(judge=None, **fields) -> Service:
        s = Service(judge, **fields)
        started.append(s)
        return s

    yield start
    for s in started:
        s.close()


@pytest.fixture
def references_file(tmp_path: Path) -> Path:
    """Training references for CIDEr-D's document frequencies (it refuses to start without them)."""
    refs = [["a red circle above a blue square"], ["a green triangle on the left"], ["an orange cat on a sofa"],
            ["a white boat on a lake"]]
    p = tmp_path / "refs.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in refs))
    return p


def openrlhf_batch(captions: list[str]) -> dict:
    labels = [encode_label([RISING, FALLING] if i % 2 == 0 else [FALLING, RISING]) for i in range(len(captions))]
    return {"query": [PROMPT + c for c in captions], "prompts": [PROMPT] * len(captions), "labels": labels}


@pytest.mark.long  # a replica killed mid-batch: test_openai_backend.py's, and test_engines.py's OpenRLHF replay, in the default tier
@pytest.mark.server
@requires_llama_cpp
def test_openrlhf_batch_survives_a_replica_killed_mid_batch(llama_server_factory, service_factory, tmp_path: Path):
    a, b = llama_server_factory(), llama_server_factory()
    svc = service_factory(
        reward={"family": "identification", "mode": "letter", "k": 2, "signal": "soft"},
        verifier={"kind": "openai", "model": "smollm2", "base_url": [a.base_url, b.base_url], "concurrency": 2,
                 "max_retries": 2, "backoff_s": 0.05, "cooldown_s": 5.0},
        batch_window_ms=50, records=str(tmp_path / "requests.jsonl"),
    )
    captions = [f"It {'rises' if i % 2 == 0 else 'falls'} steadily, from 1 to 12 (take {i})." for i in range(8)]

    def kill_a_mid_batch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            reps = svc.health().get("replicas", [])
            if sum(r["served"] for r in reps) >= 3:
                a.kill()
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_a_mid_batch)
    killer.start()
    reply = svc.post(openrlhf_batch(captions))
    killer.join()
    assert not a.alive
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert set(body) >= {"rewards", "scores", "extra_logs"}
    assert len(body["rewards"]) == 8 and body["scored"] == [True] * 8, body["errors"]
    assert all(isinstance(r, float) and 0.0 <= r <= 1.0 for r in body["rewards"])
    assert body["extra_logs"]["unscored"] == [0.0] * 8 and len(body["extra_logs"]["soft"]) == 8
    reps = {r["url"]: r for r in svc.health()["replicas"]}
    assert reps[a.base_url]["failures"] >= 1 and reps[b.base_url]["served"] > 0
    (rec,) = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert rec["n"] == 8 and rec["rewards"] == body["rewards"] and rec["columns"] == ["candidates"]


def test_bad_requests_get_a_400_naming_field_and_fix(service_factory, tmp_path: Path, references_file: Path):
    svc = service_factory(reward={"family": "cider", "cider": {"references": str(references_file)}}, records=str(tmp_path / "r.jsonl"))
    cases = [
        ({"prompts": ["p"]}, "query"),
        ({"query": ["a", "b"], "prompts": ["a"]}, "prompts"),
        ({"query": ["a"], "labels": [{"references": ["a"]}], "weights": 3}, "weights"),
        ({"query": ["a"], "labels": [{"not_references": 1}]}, "labels[0].references"),
        ({"query": ["a"], "labels": ["not json {"]}, "labels[0]"),
    ]
    for body, field in cases:
        reply = svc.post(body)
        assert reply.status_code == 400, (body, reply.text)
        err = reply.json()["error"]
        assert err["field"] == field and err["problem"] and err["fix"], err
    reply = httpx.post(svc.url + "/reward", content=b"{not json", timeout=10)
    assert reply.status_code == 400 and reply.json()["error"]["field"] == "body"


def test_concurrent_clients_share_one_judge_call(service_factory, tmp_path: Path, references_file: Path):
    svc = service_factory(reward={"family": "cider", "cider": {"references": str(references_file)}}, batch_window_ms=400,
                          records=str(tmp_path / "r.jsonl"))
    refs = ["a red circle above a blue square", "a green triangle on the left"]
    results: dict[int, httpx.Response] = {}

    def client(i: int) -> None:
        results[i] = svc.post({"query": [refs[i], "nothing alike"], "labels": [[refs[i]], [refs[i]]]})

    threads = [threading.Thread(target=client, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(2):
        rewards = results[i].json()["rewards"]
        assert rewards[0] > rewards[1] >= 0.0  # the reference itself beats an unrelated caption
    recs = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert len(recs) == 2 and recs[0]["batch_id"] == recs[1]["batch_id"] and recs[0]["batch_size"] == 4
    assert svc.health()["batches"] == 1


def test_unreachable_verifier_is_a_503_past_the_deadline_never_nan_or_zero(service_factory, tmp_path: Path):
    svc = service_factory(
        reward={"family": "identification", "mode": "letter", "k": 2}, outage_deadline_s=0.6, outage_retry_s=0.2,
        verifier={"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1|http://127.0.0.1:7/v1",
                 "max_retries": 0},
        records=str(tmp_path / "r.jsonl"),
    )
    reply = svc.post(openrlhf_batch(["It rises.", "It falls."]))
    assert reply.status_code == 503 and reply.headers["retry-after"] == "1"
    err = reply.json()["error"]
    assert err["field"] == "verifier" and "connection error" in err["value"] and "refusing to invent" in err["problem"]
    assert "rewards" not in reply.json()
    health = svc.health()
    assert health["outages"] == 1 and health["retries"] == 0 and health["requests"] == 0
    (rec,) = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert rec["status"] == 503 and "connection error" in rec["error"]


@pytest.mark.slow
def test_service_shapes_identification_like_training(embedded_backend):
    """The service's identification reward carries the training guard: a dump of the numbers is penalised
    below its verifier score, an honest caption keeps its score (its key values are within the allowance)."""
    import numpy as np

    from captionrl.domains.corpora import load_embedded_corpus
    from captionrl.domains.describe import describe_series
    from captionrl.domains.timeseries import window
    from captionrl.rewards.reward import Reward
    from captionrl.serve.config import build_judge

    corpus = [s for s in load_embedded_corpus() if len(s) >= 48][:4]
    wins = [window(s, 24)[0] for s in corpus]
    cands = [[w.values.tolist(), *[o.values.tolist() for o in wins if o is not w][:3]] for w in wins[:2]]
    honest = [describe_series(w) for w in wins[:2]]
    dumps = [", ".join(f"{v:.2f}" for v in np.asarray(w.values)) for w in wins[:2]]
    judge = build_judge(from_dict(RewardServiceConfig, {"reward": {"mode": "likelihood"}}), backend=embedded_backend)
    assert isinstance(judge, Reward)
    got = judge.judge([*honest, *dumps], {"candidates": cands + cands})
    for j in got[:2]:
        assert j.scored and j.score == pytest.approx(j.extra["base"])
    for j in got[2:]:
        assert j.scored and j.extra["copied_values"] >= 20 and j.score < j.extra["base"] - 1.0


def test_a_bug_in_the_judge_is_a_500_not_an_unscored_batch(tmp_path):
    """A judge that raises a TypeError (our bug) answers HTTP 500 naming it; a RuntimeError from the model
    (out of memory) is an outage: re-judged until the deadline, then HTTP 503 naming it, never NaN or 0."""
    from starlette.testclient import TestClient

    from captionrl.serve.app import create_app
    from captionrl.serve.config import RewardServiceConfig

    class Raising:
        name = "raising"

        def __init__(self, exc):
            self.exc = exc

        def judge(self, captions, columns):
            raise self.exc

    cfg = RewardServiceConfig(reward=RewardSpec(family="cider"), batch_window_ms=0, records=str(tmp_path / "r.jsonl"),
                              outage_deadline_s=0.3, outage_retry_s=0.1)
    body = {"query": ["a red square"], "prompts": [""], "labels": [{"references": ["a red square"]}]}
    with TestClient(create_app(cfg, Raising(TypeError("unsupported operand")))) as client:
        resp = client.post("/reward", json=body)
    assert resp.status_code == 500 and "TypeError" in resp.json()["error"]["problem"]
    with TestClient(create_app(cfg, Raising(RuntimeError("out of memory")))) as client:
        resp = client.post("/reward", json=body)
    got = resp.json()
    assert resp.status_code == 503 and "out of memory" in got["error"]["value"]


@pytest.mark.parametrize("key, value", [("max_concurrency", 0), ("port", 70000), ("max_batch", 0),
                                        ("max_pending", 0), ("batch_window_ms", -1.0), ("port", -1)])
def test_the_services_ranges_are_validated(key, value):
    """Each range check runs (they once sat after an early return: max_concurrency=0 started a service that
    could never judge, port=70000 failed only when uvicorn bound it)."""
    from captionrl.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        from_dict(RewardServiceConfig, {key: value})
    assert err.value.field == key and err.value.value == value


def test_old_sections_and_a_bare_reward_name_say_where_their_keys_went():
    """The reward has one spelling; the service's earlier sections fail naming their new place."""
    from captionrl.errors import ConfigError

    for old, new in (("identify", "reward"), ("shaping", "reward"), ("backend", "verifier"), ("ngram", "reward.cider"),
                     ("scalar", "reward.judge"), ("qa", "reward.answerability")):
        with pytest.raises(ConfigError, match=f"merged into {new}") as err:
            from_dict(RewardServiceConfig, {old: {}})
        assert err.value.field == old
    with pytest.raises(ConfigError, match="is a section") as err:
        from_dict(RewardServiceConfig, {"reward": "cider"})
    assert err.value.field == "reward" and "reward.family" in err.value.fix
    with pytest.raises(ConfigError, match="renamed to judge"):
        from_dict(RewardServiceConfig, {"reward": {"family": "scalar"}})
