"""Per-step time breakdown: a real 2-step RLOO run of a tiny random SmolLM2-shaped policy (the breakdown is
mechanics; ``captionrl.testing.tiny_llama``), with the real embedded model as the verifier backend inside
its reward, logs every ``time/*`` part, the parts fit inside the step, and the verifier's share
is a part of the reward's."""

from __future__ import annotations

import json
import logging

import pytest

from captionrl.rewards import completion_text
from captionrl.train.run import builder, loading, sections
from captionrl.train.run.curves import load_metrics
from captionrl.train.run.logging import MetricsLog
from captionrl.train.run.timing import KEYS, _Busy, find_backends, format_breakdown

pytestmark = pytest.mark.slow


class LikelihoodReward:
    """Mean token log-prob of the caption after a fixed context, from a real verifier backend."""

    __name__ = "likelihood"

    def __init__(self, verifier) -> None:
        self.verifier = verifier

    def __call__(self, prompts=None, completions=(), **kw):
        texts = [completion_text(c) for c in completions]
        scores = self.verifier.loglikelihood([("A short sentence:", " " + t) for t in texts])
        return [None if s is None else s / max(len(t), 1) for s, t in zip(scores, texts, strict=True)]


def test_two_step_run_logs_every_part_and_parts_fit_in_the_step(tmp_path, capsys, caplog, tiny_llama):
    from datasets import Dataset

    from captionrl.backends.hf import HFBackend

    caplog.set_level(logging.INFO, logger="captionrl")
    train = sections.TrainConfig(
        algorithm="rloo", out_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=4,
        max_completion_length=8, max_steps=2, save_steps=100, beta=0.0, report_to=[], learning_rate=1e-5,
    )
    model, tok, _ = loading.load_policy(sections.PolicyConfig(model=tiny_llama))
    verifier = HFBackend("embedded", dtype="float32", batch_size=8)
    reward = LikelihoodReward(verifier)
    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"Say a word about {w}."}]
                                         for w in ("rain", "snow", "sun", "wind")]})
    trainer = builder.build_trainer(train, builder.trainer_args(train, seed=0), model, tok, [reward], data,
                                    callbacks=[MetricsLog(tmp_path / "metrics.jsonl", echo=False)])
    assert verifier.loglikelihood.__wrapped__  # the verifier's calls are timed
    verifier.loglikelihood([("A short sentence:", " before training")] * 16)  # as a preflight would: not step 1's
    trainer.train()

    records = load_metrics(tmp_path / "metrics.jsonl")
    assert len(records) == 2
    for rec in records:
        for key in KEYS:
            assert isinstance(rec.get(key), float) and rec[key] >= 0.0, (key, rec)
        parts = sum(rec[f"time/{p}"] for p in ("generation", "reward", "logprobs", "backward", "optimizer"))
        assert parts <= rec["time/step"] + 1e-6
        assert 0.0 < rec["time/verifier"] <= rec["time/reward"] + 1e-6
        assert rec["time/generation"] > 0.0 and rec["time/backward"] > 0.0 and rec["time/optimizer"] > 0.0
    summary = json.loads((tmp_path / "timing.json").read_text())
    assert summary["steps"] == 2 and summary["timed_backends"] == [verifier.name]
    assert 0.0 < summary["share_of_step"]["verifier"] <= summary["share_of_step"]["reward"] < 1.0
    assert summary["old_policy_logprobs"].startswith("skipped: on-policy")  # rloo, beta 0: train/run/on_policy.py
    shared = summary["shared_prompt_forward"]  # train/run/shared_prefix.py: 2 steps x 4 rows, 2 prompts per step
    assert (shared["rows"], shared["prompts"], shared["fallback_calls"]) == (8, 4, 0), shared
    assert shared["generation"] == {"rows": 8, "prompts": 4}, shared
    assert summary["dtypes"][f"policy:{tiny_llama}"]["dtype"] == "float32"
    assert summary["dtypes"][verifier.name]["reason"] == "float32 as configured"
    assert "step 2 time: generation" in capsys.readouterr().out  # tqdm.write, beside the progress bar
    assert any(m.startswith("time per step (mean): ") for m in caplog.messages), caplog.messages


def test_busy_counts_overlapping_calls_once():
    import threading
    import time

    busy = _Busy()

    def call() -> None:
        busy.enter()
        time.sleep(0.2)
        busy.exit()

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 0.19 < busy.take() < 0.4  # three overlapping 0.2 s calls are 0.2 s of wall time, not 0.6
    assert busy.take() == 0.0


def test_find_backends_walks_attributes_containers_and_closures():
    class Backend:
        name = "b"

        def generate(self, r): ...
        def choose(self, p, o): ...
        def loglikelihood(self, p): ...

    b1, b2 = Backend(), Backend()

    class Judge:
        def __init__(self):
            self.backends = {"v": b1}

    def make():
        return lambda: b2

    found = find_backends([type("R", (), {})(), Judge(), make()])
    assert {id(b) for b in found} == {id(b1), id(b2)}


def test_format_breakdown_names_every_part():
    line = format_breakdown({f"time/{k}": 1.0 for k in ("generation", "reward", "verifier", "logprobs",
                                                         "backward", "optimizer", "step")}, 3)
    assert line.startswith("step 3 time: generation 1.00s | reward 1.00s (verifier 1.00s)")


class _QueuedKernels:
    """A stand-in for CUDA's asynchronous queue (no GPU here): a part "launches" kernels that take ``seconds``
    and returns at once, as on a GPU; ``synchronize`` waits for them, as ``torch.cuda.synchronize`` does."""

    def __init__(self) -> None:
        self.pending = 0.0
        self.syncs = 0

    def launch(self, seconds: float) -> None:
        self.pending += seconds

    def synchronize(self, device=None) -> None:
        import time

        self.syncs += 1
        time.sleep(self.pending)
        self.pending = 0.0


def _one_step(timer, gpu: _QueuedKernels) -> dict[str, float]:
    from types import SimpleNamespace

    state, args, control = SimpleNamespace(global_step=1, is_world_process_zero=True), None, None
    timer.on_step_begin(args, state, control)
    timer._timed(lambda: gpu.launch(0.3), "generation")()
    timer.on_pre_optimizer_step(args, state, control)
    gpu.launch(0.2)  # the optimizer's kernels, queued between TRL's two optimizer callbacks
    timer.on_optimizer_step(args, state, control)
    timer.on_step_end(args, state, control)
    return timer.history[-1]


@pytest.mark.parametrize("cuda", ["in use", "available, unused", "absent"])
def test_parts_on_cuda_include_the_kernels_they_queued(monkeypatch, cuda):
    """On a GPU a part's kernels run after its Python has returned: the timer synchronises the device before it
    reads the clock, so each part is charged its own kernels (without it, generation here would read ~0 s and
    its 0.3 s would land in a later part). No synchronisation on a CPU run, or before CUDA is in use."""
    from collections import defaultdict
    from types import SimpleNamespace

    import torch

    from captionrl.train.run.timing import StepTimer

    gpu = _QueuedKernels()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda != "absent")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: cuda == "in use")
    monkeypatch.setattr(torch.cuda, "synchronize", gpu.synchronize)
    timer = StepTimer(SimpleNamespace(_metrics={"train": defaultdict(list)}), echo=False)
    rec = _one_step(timer, gpu)
    if cuda == "in use":
        assert gpu.syncs == 6  # before every clock read: step begin/end, the part's two, the optimizer's two
        assert rec["generation"] >= 0.3 and rec["optimizer"] >= 0.2
        assert rec["step"] >= rec["generation"] + rec["optimizer"]
    else:
        assert gpu.syncs == 0
        assert rec["generation"] < 0.1 and rec["optimizer"] < 0.1
    assert timer.trainer._metrics["train"]["time/generation"] == [rec["generation"]]
