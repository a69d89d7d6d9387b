"""Fault injection in a real training run: LineupRL with the openai verifier against a real llama.cpp
server that is SIGKILLed after the first step and restarted two steps later.

What must hold: the run finishes; the captions of the steps without a verifier are
unscored (``None``), never a reward of 0 from the outage; TRL gives them zero advantage, so those steps
move nothing (loss and gradient norm exactly 0 with ``beta=0``); their unscored share is logged; and
rewards resume after the restart.
"""

from __future__ import annotations

import math
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]


class KilledAfterFirstStep:
    """The server's own backend, with the server killed before the 2nd reward call and restarted before
    the 4th: the fault is real (a dead process, refused connections), only its timing is scripted."""

    def __init__(self, inner, server):
        self.inner, self.server, self.calls = inner, server, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def loglikelihood(self, pairs):
        self.calls += 1
        if self.calls == 2:
            self.server.kill()
        if self.calls == 4:
            self.server.start()
        return self.inner.loglikelihood(pairs)


@pytest.mark.long  # a killed server mid-run: the RubiCap judge test below in the default tier
@pytest.mark.slow
@pytest.mark.server
def test_lineup_run_survives_a_killed_verifier_with_zero_advantage_and_resumes(tmp_path, llama_server_factory):
    from captionrl.config import load_config
    from captionrl.train import lineup
    from captionrl.train.lineup import LineupConfig
    from captionrl.train.run.curves import load_metrics
    from captionrl.train.run.logging import load_samples

    server = llama_server_factory()
    served = httpx.get(f"{server.base_url}/models", timeout=5).json()["data"][0]["id"]
    out = tmp_path / "run"
    cfg = load_config(LineupConfig, ROOT / "configs" / "lineup-cpu.yaml", [
        "data.window=8", "data.n_train=2", "data.n_test=2", "data.series=[nile,sunspots]", "warm_start.epochs=0", "train.freeze_layers=0",
        "reward.k=2", "reward.signal=soft", "reward.max_caption_chars=null", "reward.transcription_penalty=0.0",
        "train.algorithm=rloo", "train.num_generations=2", "train.per_device_train_batch_size=4",
        "train.max_completion_length=6", "train.max_steps=4", "train.save_steps=4", "train.learning_rate=1.0e-5",
        "train.beta=0.0", "train.report_to=[]", "train.threads=1", "eval.enabled=false", f"train.out_dir={out}",
        "train.preflight_items=0",  # the preflight would call the verifier too and move the scripted kill
        "verifier.kind=openai", f"verifier.base_url={server.base_url}", f"verifier.model={served}"])
    # 60 s: echo log-likelihood requests queue one at a time on a cold, restarted 1-thread server
    verifier = KilledAfterFirstStep(server.backend(timeout_s=60, max_retries=1, backoff_s=0.1), server)
    lineup.run(cfg, verifier=verifier)  # 1. the run finishes

    assert verifier.calls == 4
    metrics = {m["step"]: m for m in load_metrics(out / "metrics.jsonl")}
    samples = load_samples(out)
    assert sorted(metrics) == [1, 2, 3, 4]
    by_step = {s: [r for r in samples if r["step"] == s - 1] for s in metrics}  # generated before step s
    assert all(len(rows) == 4 for rows in by_step.values())
    for step in (2, 3):  # 2. the outage: unscored, never 0, with the error kept
        rows = by_step[step]
        assert all(r["reward"] is None for r in rows), rows
        assert all(r["error"] and "verifier failed" in r["error"] for r in rows)
        m = metrics[step]
        assert m["identification/unscored_frac"] == 1.0  # 3. the unscored share is logged
        reward = m.get("reward")
        assert reward is None or math.isnan(reward)  # TRL's mean over no scored caption, never 0
        # 4. zero advantage for every caption: no policy-gradient signal, nothing moves (beta = 0)
        assert m["loss"] == 0.0 and m["grad_norm"] == 0.0
    for step in (1, 4):  # 5. before the kill and after the restart: real rewards, real updates
        rows = by_step[step]
        assert all(isinstance(r["reward"], float) for r in rows), [(r["reward"], r["error"]) for r in rows]
        assert metrics[step]["identification/unscored_frac"] == 0.0
        assert metrics[step]["reward"] == pytest.approx(sum(r["reward"] for r in rows) / 4, abs=1e-5)
        assert metrics[step]["grad_norm"] > 0.0
    assert server.alive  # the restarted server served step 4 and is still up


def test_a_stalled_server_is_bounded_by_the_timeout_and_leaves_rewards_unscored():
    """A server that accepts connections and never answers: every request ends at the timeout (and
    its retries), the reward is None for every caption, never 0, and the call returns."""
    import socket
    import threading
    import time

    from captionrl.backends.openai_http import OpenAIBackend
    from captionrl.judges.identification import IdentificationJudge, IdentifyConfig
    from captionrl.rewards import RewardFunction
    from captionrl.rewards.reward import Reward

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept_and_hold():
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])  # read nothing, answer nothing
            except OSError:
                continue

    thread = threading.Thread(target=accept_and_hold, daemon=True)
    thread.start()
    try:
        port = listener.getsockname()[1]
        backend = OpenAIBackend(f"http://127.0.0.1:{port}/v1", model="m", timeout_s=1.0, max_retries=1,
                                backoff_s=0.1, verify_echo=False, progress=False)
        reward = RewardFunction(Reward(IdentificationJudge(backend, IdentifyConfig(mode="likelihood", k=2))))
        t0 = time.perf_counter()
        scores = reward(completions=["it rises", "it falls"], candidates=[[[1.0, 2.0], [2.0, 1.0]]] * 2)
        elapsed = time.perf_counter() - t0
    finally:
        stop.set()
        thread.join(timeout=5)
        for s in held:
            s.close()
        listener.close()
    assert scores == [None, None]
    assert elapsed < 10  # 2 attempts x 1 s timeout (+ backoff), requests in parallel: bounded, not hung
    assert all("timeout" in e for e in backend.last_errors), backend.last_errors
    assert held  # the server really accepted the connections


class KillJudgeServer:
    """A TrainerCallback that SIGKILLs the judge server after step 1 and restarts it after step 3: the
    captions generated for steps 2 and 3 meet a dead server (refused connections), those of step 4 a live one."""

    def __init__(self, server):
        from transformers import TrainerCallback

        class _Cb(TrainerCallback):
            def on_step_end(cb, args, state, control, **kw):
                if state.global_step == 1:
                    server.kill()
                if state.global_step == 3:
                    server.start()

        self.callback = _Cb()


@pytest.mark.long  # a run whose judge is lost: test_reliability.py's run-level stop, and the killed-and-restarted servers of test_engines.py, in the default tier
@pytest.mark.slow
@pytest.mark.server
def test_rubicap_run_survives_a_killed_judge_server_with_zero_advantage_and_resumes(tmp_path, llama_server_factory):
    """The same fault under RubiCap: the rubric judge is served by a real llama.cpp server (choose mode:
    yes/no probabilities from top_logprobs) that dies after step 1 and comes back after step 3."""
    from captionrl.config import load_config
    from captionrl.train import rubicap
    from captionrl.train.rubicap import RubicapConfig
    from captionrl.train.run.curves import load_metrics
    from captionrl.train.run.logging import load_samples

    server = llama_server_factory()
    served = httpx.get(f"{server.base_url}/models", timeout=5).json()["data"][0]["id"]
    out = tmp_path / "run"
    cfg = load_config(RubicapConfig, ROOT / "configs" / "rubicap-cpu.yaml", [
        "data.items=scenes:2:0", "reward.rubric.mode=choose", "reward.rubric.decision=soft",
        "train.num_generations=2", "train.per_device_train_batch_size=4", "train.max_completion_length=6",
        "train.max_steps=4", "train.save_steps=4", "train.report_to=[]", "train.threads=1",
        "train.preflight_items=0", f"train.out_dir={out}",
        "judge.kind=openai", f"judge.base_url={server.base_url}", f"judge.model={served}"])
    judge = server.backend(timeout_s=60, max_retries=1, backoff_s=0.1)  # a cold restarted server is slow
    rubicap.run(cfg, judge_backend=judge, callbacks=[KillJudgeServer(server).callback])  # the run finishes

    metrics = {m["step"]: m for m in load_metrics(out / "metrics.jsonl")}
    samples = load_samples(out)
    assert sorted(metrics) == [1, 2, 3, 4]
    by_step = {s: [r for r in samples if r["step"] == s - 1] for s in metrics}
    for step in (2, 3):  # the outage: every caption unscored with its error, never a 0 reward
        rows = by_step[step]
        assert rows and all(r["reward"] is None and r["error"] for r in rows), rows
        assert metrics[step]["rubric/unscored_frac"] == 1.0
        assert metrics[step]["loss"] == 0.0 and metrics[step]["grad_norm"] == 0.0  # zero advantage, nothing moves
    for step in (1, 4):  # before the kill and after the restart: scored captions
        rows = by_step[step]
        assert rows and all(isinstance(r["reward"], float) for r in rows), [(r["reward"], r["error"]) for r in rows]
        assert metrics[step]["rubric/unscored_frac"] == 0.0
    assert server.alive
