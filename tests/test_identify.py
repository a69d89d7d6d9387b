"""Identification judge and reward: rotations, likelihood mode on real data, failures, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from captionrl.backends.base import ChoiceResult
from captionrl.domains.describe import describe_series
from captionrl.errors import ConfigError, DataError
from captionrl.judges.identification import IdentificationJudge, IdentifyConfig, rotation
from captionrl.rewards import RewardFunction
from captionrl.rewards.reward import Reward


class AlwaysA:
    """A verifier that answers "A" to every question (what SmolLM2-135M does in letter mode)."""

    name = "always-a"

    def __init__(self) -> None:
        self.prompts: list = []

    def choose(self, prompts, options):
        self.prompts.extend(prompts)
        return [ChoiceResult({o: 1.0 if o == "A" else 0.0 for o in options}, "logits", mass=1.0) for _ in prompts]


class Broken:
    """A verifier whose every call fails (a dead server): results carry errors, not scores."""

    name = "broken"
    last_error = "ConnectError: connection refused"

    def choose(self, prompts, options):
        return [ChoiceResult(None, "top_logprobs", error=self.last_error) for _ in prompts]

    def loglikelihood(self, pairs):
        return [None for _ in pairs]


def _sets(n: int, k: int, length: int = 12, seed: int = 0) -> list[list[list[float]]]:
    rng = np.random.default_rng(seed)
    return [[rng.normal(size=length).round(2).tolist() for _ in range(k)] for _ in range(n)]


def test_rotation_puts_the_truth_at_every_position():
    for k in (2, 4, 6):
        positions = [rotation(k, r).index(0) for r in range(k)]
        assert positions == list(range(k))
        assert all(sorted(rotation(k, r)) == list(range(k)) for r in range(k))


@pytest.mark.parametrize("k", [2, 4, 8])
def test_always_a_verifier_scores_exactly_one_over_k(k):
    verifier = AlwaysA()
    judge = IdentificationJudge(verifier, IdentifyConfig(mode="letter", k=k))
    captions = ["It rises from 1 to 9.", "", "The answer is A.", "x" * 50]
    out = judge.judge(captions, {"candidates": _sets(len(captions), k)})
    assert [j.extra["hard"] for j in out] == [pytest.approx(1.0 / k)] * len(captions)
    assert [j.score for j in out] == [pytest.approx(1.0 / k)] * len(captions)
    assert len(verifier.prompts) == k * len(captions)  # one question per rotation


def test_letter_prompts_put_candidates_before_the_caption_and_group_by_rotation():
    verifier = AlwaysA()
    judge = IdentificationJudge(verifier, IdentifyConfig(mode="letter", k=4))
    sets = _sets(1, 4) * 3  # three captions of one item share a candidate set
    judge.judge(["first caption", "second caption", "third caption"], {"candidates": sets})
    texts = [p[0]["content"] for p in verifier.prompts]
    for t in texts:
        assert t.index("A: ") < t.index("description")
    # The three captions of one rotation are adjacent and share everything before the caption.
    first_rotation = texts[:3]
    prefixes = {t.split("Here is a description")[0] for t in first_rotation}
    assert len(prefixes) == 1


def test_failed_verifier_leaves_captions_unscored_never_zero():
    for mode in ("letter", "likelihood"):
        judge = IdentificationJudge(Broken(), IdentifyConfig(mode=mode, k=4))
        out = judge.judge(["a caption"], {"candidates": _sets(1, 4)})
        assert out[0].score is None and "connection refused" in out[0].error
    reward = RewardFunction(Reward(IdentificationJudge(Broken(), IdentifyConfig(mode="letter", k=2))))
    logged: dict = {}
    scores = reward(prompts=["p"], completions=[[{"role": "assistant", "content": "c"}]],
                    candidates=_sets(1, 2, seed=1), log_metric=lambda k, v: logged.__setitem__(k, v))
    assert scores == [None]
    assert logged["identification/unscored_frac"] == 1.0


def test_bad_candidate_sets_fail_clearly():
    judge = IdentificationJudge(AlwaysA(), IdentifyConfig(mode="letter", k=4))
    with pytest.raises(DataError, match="length mismatch"):
        judge.judge(["c"], {"candidates": [[[1, 2, 3], [1, 2], [1, 2, 3], [1, 2, 3]]]})
    with pytest.raises(DataError, match="K=4"):
        judge.judge(["c"], {"candidates": [[[1, 2, 3], [1, 2, 4]]]})
    with pytest.raises(DataError, match="needs column 'candidates'"):
        judge.judge(["c"], {})
    with pytest.raises(DataError, match="finite"):
        judge.judge(["c"], {"candidates": [[[1, float("nan")], [1, 2], [1, 2], [1, 2]]]})
    with pytest.raises(ConfigError, match="at least 2"):
        IdentifyConfig(k=1)
    with pytest.raises(ConfigError, match="letter or likelihood"):
        IdentifyConfig(mode="vibes")


@pytest.mark.slow
def test_likelihood_mode_identifies_describer_captions_and_not_shuffled_ones(embedded_backend):
    """On real corpus windows: true captions far above chance, another item's caption at chance."""
    from captionrl.domains.candidates import mine_candidates
    from captionrl.domains.corpora import load_embedded_corpus
    from captionrl.domains.timeseries import split_by_fraction, window

    windows = []
    for s in load_embedded_corpus():
        windows.extend(window(split_by_fraction(s)["test"], 24, 24))
    rng = np.random.default_rng(0)
    items = [windows[i] for i in rng.choice(len(windows), size=min(8, len(windows)), replace=False)]
    sets = mine_candidates(items, windows, k=4, seed=0)
    by_id = {w.id: w for w in windows}
    candidates = [[it.values.tolist(), *[by_id[c].values.tolist() for c in cs.distractor_ids[:3]]] for it, cs in zip(items, sets, strict=True)]
    captions = [describe_series(it) for it in items]
    shuffled = captions[1:] + captions[:1]
    judge = IdentificationJudge(embedded_backend, IdentifyConfig(mode="likelihood", k=4))
    # one call: each candidate series' context runs once for the true and the shuffled caption (shared prefix)
    hard = [j.extra["hard"] for j in judge.judge(captions + shuffled, {"candidates": candidates + candidates})]
    true_acc, shuf_acc = np.mean(hard[: len(items)]), np.mean(hard[len(items) :])
    print(f"likelihood c2s K=4 on {len(items)} windows: describer {true_acc:.3f}, shuffled {shuf_acc:.3f}")
    assert true_acc >= 0.75
    assert shuf_acc <= 0.5


@pytest.mark.slow
def test_reward_callable_follows_trl_contract(embedded_backend):
    series = [float(x) for x in np.sin(np.arange(16) / 3) * 5 + 20]
    other = [float(x) for x in np.linspace(30, 10, 16)]
    reward = RewardFunction(Reward(IdentificationJudge(embedded_backend, IdentifyConfig(mode="likelihood", k=2, signal="soft"))))
    metrics: dict = {}
    completions = [[{"role": "assistant", "content": describe_series(np.array(series))}],
                   [{"role": "assistant", "content": describe_series(np.array(other))}]]
    scores = reward(prompts=[[{"role": "user", "content": "p"}]] * 2, completions=completions, completion_ids=None,
                    candidates=[[series, other]] * 2, item_id=["a", "a"], trainer_state=None,
                    log_metric=lambda k, v: metrics.__setitem__(k, v), log_extra=lambda c, v: None)
    assert len(scores) == 2 and all(0.0 <= s <= 1.0 for s in scores)
    assert scores[0] > 0.5 > scores[1]  # the right description wins, the wrong one loses
    assert {"identification/hard", "identification/soft", "identification/unscored_frac"} <= set(metrics)


# ---------------------------------------------------------------------- the command's inputs
def _caption_file(path, n):
    import json

    rng = np.random.default_rng(0)
    path.write_text("".join(json.dumps({"id": f"s{i}", "series": rng.normal(size=12).round(3).tolist(),
                                        "caption": f"caption {i}"}) + "\n" for i in range(n)))
    return path


def test_identify_honours_limit_with_caption_files(tmp_path, monkeypatch):
    from captionrl.cli import main
    from captionrl.eval import identification
    from captionrl.eval.identification import IdentifyEvalConfig

    seen = {}

    def fake_run(items, systems, distractors, pool, verifiers, cfg, out_dir, **_kw):
        seen.update(items=[it.id for it in items], pool=set(pool), distractors=distractors)
        return "result"

    monkeypatch.setattr(identification, "run_identification", fake_run)
    monkeypatch.setattr(identification, "backend_from_spec", lambda spec: AlwaysA())
    f = _caption_file(tmp_path / "caps.jsonl", 10)

    def cfg(**kw):
        return IdentifyEvalConfig(captions=[str(f)], ks=[3], out=str(tmp_path / "o"), **kw)

    assert identification.run(cfg(limit=4, seed=1)) == "result"
    first = seen["items"]
    assert len(first) == 4 and len(set(first)) == 4
    assert seen["pool"] == {f"s{i}" for i in range(10)}  # distractors still come from the whole file
    identification.run(cfg(limit=4, seed=1))
    assert seen["items"] == first  # a seeded sample
    identification.run(cfg())
    assert len(seen["items"]) == 10  # no limit: every item of the files
    assert main(["eval", "identify", "--captions", str(f), "--limit", "0", "--out", str(tmp_path / "o")]) == 2


def test_identify_against_an_unreachable_verifier_fails_fast_with_a_named_error(tmp_path, capsys):
    import socket
    import time

    from captionrl.cli import main

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    f = _caption_file(tmp_path / "caps.jsonl", 3)
    t0 = time.perf_counter()
    rc = main(["eval", "identify", "--captions", str(f), "--verifier", f"openai:http://127.0.0.1:{port}/v1#m",
               "--out", str(tmp_path / "o")])
    assert rc == 2 and time.perf_counter() - t0 < 10
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not answer" in err and str(port) in err and "Fix:" in err
    assert not (tmp_path / "o" / "records.jsonl").exists()  # nothing was judged
