"""Faults that would silently stop learning: each becomes unscored, a named error, or a stop.

- a run whose verifier is down stops within ``reward.unscored_patience`` steps, saved, with one line;
- only model/transport failures are unscored: a shape bug in our code propagates (out of memory is retried);
- a failed question-generation request is not persisted, so the next run retries it;
- a Generator-parser failure in EvoLM is unscored, never 0;
- a shaping term whose column is missing raises at the first call;
- an input longer than the model's context is a named error before any forward pass.
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from captionrl.config import load_config
from captionrl.errors import ConfigError, DataError, InputTooLongError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def forbid_models(monkeypatch):
    """Any model call raises ModelCallsForbiddenError: these checks must need no model."""
    monkeypatch.setenv("CAPTIONRL_FORBID_MODEL_CALLS", "1")


def dead_port() -> int:
    """A local port where nothing listens (bound, then released): connections are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dead_openai_backend():
    """A real OpenAI-compatible client pointed at a port where nothing listens (refused connections)."""
    from captionrl.backends.openai_http import OpenAIBackend

    return OpenAIBackend(f"http://127.0.0.1:{dead_port()}/v1", model="m", timeout_s=2.0, max_retries=0,
                         backoff_s=0.01, verify_echo=False, progress=False)


# ---------------------------------------------------------------------- 1. the bound
def test_loss_tracker_stops_only_after_patience_steps_in_a_row():
    from captionrl.rewards.bound import LossTracker, RewardBound

    tracker = LossTracker(RewardBound(max_unscored_frac=0.5, unscored_patience=2))
    assert tracker.step(1, "r", (4, 4, 0, 0)) is None  # 100% lost, streak 1 of 2
    assert tracker.step(2, "r", (4, 1, 0, 0)) is None  # 25%: the streak restarts
    assert tracker.step(3, "r", (0, 0, 0, 0)) is None  # no reward call this step: streak unchanged (0)
    assert tracker.step(4, "r", (4, 3, 0, 0)) is None  # 75%: streak 1
    assert tracker.step(5, "r", (4, 4, 0, 0)) == ("unscored", 1.0, 2)
    assert tracker.first_step[("r", "unscored")] == 4
    fallback = LossTracker(RewardBound(max_fallback_frac=0.5, unscored_patience=1))
    assert fallback.step(1, "m", (4, 0, 2, 2)) == ("fallback", 1.0, 1)  # every group on the facts rubric


@pytest.mark.parametrize("override", ["reward.max_unscored_frac=1.5", "reward.unscored_patience=0",
                                      "reward.max_fallback_frac=-0.1"])
def test_the_bound_is_one_setting_shared_by_every_recipe(override, forbid_models):
    from captionrl.rewards.bound import RewardBound
    from captionrl.train.lineup import LineupConfig
    from captionrl.train.moco import MocoConfig
    from captionrl.train.rubicap import RubicapConfig

    for cls in (LineupConfig, RubicapConfig, MocoConfig):
        assert isinstance(cls().reward, RewardBound), cls  # one class, one place, every recipe
        with pytest.raises(ConfigError, match=override.split("=")[0].replace(".", r"\.")):
            load_config(cls, None, [override])


class ProbeThenDie(BaseHTTPRequestHandler):
    """Answers the run's start-up probe (``GET /v1/models``) and then the server goes away: every reward
    request meets a closed port (refused connections), as with a verifier that died after the launch."""

    def do_GET(self):
        body = json.dumps({"data": [{"id": "m"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        def die():
            self.server.shutdown()
            self.server.server_close()  # the port closes: later connections are refused

        threading.Thread(target=die, daemon=True).start()

    def log_message(self, *args):
        pass


@pytest.mark.slow
def test_lineup_run_whose_verifier_is_down_stops_within_the_patience_and_says_why(tmp_path, capsys):
    from captionrl.cli import main
    from captionrl.train.run.curves import load_metrics

    server = ThreadingHTTPServer(("127.0.0.1", 0), ProbeThenDie)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    out = tmp_path / "run"
    try:
        code = main(["train", "lineup", "--config", str(ROOT / "configs" / "lineup-cpu.yaml"),
                     "policy.model=tiny-qwen2.5-vl", "policy.dtype=float32", "warm_start.epochs=0", "train.freeze_layers=0", "train.beta=0.0",  # a tiny random policy
                     "verifier.kind=openai", f"verifier.base_url=http://127.0.0.1:{server.server_address[1]}/v1",
                     "verifier.model=m", "verifier.max_retries=0", "verifier.timeout_s=2",
                     "data.window=8", "data.n_train=2", "data.n_test=0", "data.series=[nile,sunspots]", "reward.k=2",
                     "reward.max_unscored_frac=0.5", "reward.unscored_patience=2",
                     "train.num_generations=2", "train.per_device_train_batch_size=4",
                     "train.max_completion_length=4", "train.max_steps=6", "train.save_steps=100",
                     "train.report_to=[]", "train.threads=1", "train.preflight_items=0", "eval.enabled=false",
                     f"train.out_dir={out}"])
    finally:
        thread.join(timeout=10)
    err = capsys.readouterr().err.strip().splitlines()  # progress bars go there too
    assert code == 2  # the command failed ...
    errors = [e for e in err if e.startswith("error:")]
    assert len(errors) == 1 and err[-1] == errors[0], err[-5:]  # ... ending with one line, no traceback
    line = errors[0]  # naming the judge, the share, the steps, the last error and the way on
    print(line)
    assert line.startswith("error: RewardLostError: reward lost: judge 'identify-c2s-likelihood on openai:m@127.0.0.1"), line
    assert "100% of the captions unscored for 2 step(s) in a row (steps 1-2" in line
    assert "last error:" in line and "Connect" in line, line
    assert f"checkpoint saved at {out / 'checkpoints' / 'checkpoint-2'}" in line and "rerun the same command" in line
    assert [m["step"] for m in load_metrics(out / "metrics.jsonl")] == [1, 2]  # stopped at the patience, not 6
    assert (out / "checkpoints" / "checkpoint-2" / "trainer_state.json").is_file()  # resumable
    assert not (out / "result.json").exists()  # never reported as a finished run


# ---------------------------------------------------------------------- 2. only model failures are unscored
def test_a_shape_bug_in_a_judge_propagates_instead_of_becoming_unscored(embedded_backend, monkeypatch):
    import torch

    import captionrl.backends.hf as hf
    from captionrl.judges.identification import IdentificationJudge, IdentifyConfig
    from captionrl.rewards import RewardFunction
    from captionrl.rewards.reward import Reward

    reward = RewardFunction(Reward(IdentificationJudge(embedded_backend, IdentifyConfig(mode="likelihood", k=2))))
    columns = {"candidates": [[[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]]] * 2}
    assert all(isinstance(s, float) for s in reward(completions=["it rises", "it falls"], **columns))

    def shape_bug(rows, offset, tokens):  # our own code multiplying mismatched shapes: torch's RuntimeError
        return float((rows @ torch.ones(3, 3)).sum())

    monkeypatch.setattr(hf, "_sum_logprobs", shape_bug)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        reward(completions=["it rises", "it falls"], **columns)


def test_out_of_memory_is_retried_at_half_the_batch_then_unscored(embedded_backend, monkeypatch):
    import torch

    pairs = [("Time series: 1, 2, 3\nDescription:", f" it rises {i}") for i in range(4)]
    expected = embedded_backend.loglikelihood(pairs)
    real = type(embedded_backend)._suffix_logprobs
    sizes: list[int] = []

    def oom_above_two(self, prefix, suffixes, extract, last_only=False):
        sizes.append(self.batch_size)
        if self.batch_size > 2:  # the allocator refuses the full batch
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(self, prefix, suffixes, extract, last_only)

    monkeypatch.setattr(type(embedded_backend), "_suffix_logprobs", oom_above_two)
    monkeypatch.setattr(embedded_backend, "batch_size", 4)
    got = embedded_backend.loglikelihood(pairs)
    assert got == pytest.approx(expected, abs=1e-4) and 4 in sizes and 2 in sizes  # one retry at half the batch
    assert embedded_backend.batch_size == 4  # restored

    def always_oom(self, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(type(embedded_backend), "_suffix_logprobs", always_oom)
    assert embedded_backend.loglikelihood(pairs) == [None] * 4  # a genuine failure: unscored, with the error
    assert "OutOfMemoryError" in embedded_backend.last_error


def test_only_model_failures_count_as_model_failures():
    from captionrl.backends.base import as_model_failure
    from captionrl.errors import EngineError, ModelOutOfMemoryError

    assert isinstance(as_model_failure(MemoryError()), ModelOutOfMemoryError)
    assert isinstance(as_model_failure(RuntimeError("DefaultCPUAllocator: can't allocate memory")), ModelOutOfMemoryError)
    assert isinstance(as_model_failure(RuntimeError("CUDA error: an illegal memory access")), EngineError)
    for bug in (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), ValueError("bad"), OSError("no file"),
                RuntimeError("CUDA error: device-side assert triggered"), KeyError("x"), TypeError("y")):
        assert as_model_failure(bug) is None, bug


# ---------------------------------------------------------------------- 3. failed generation is not persisted
def test_failed_question_generation_is_not_persisted_and_is_retried(tmp_path, embedded_backend):
    from captionrl.domains.lineup_data import build_lineup_data
    from captionrl.judges.series_qa import attach_questions
    from captionrl.records import read_jsonl
    from captionrl.train.lineup import LineupConfig

    cfg = load_config(LineupConfig, None, [
        "data.window=8", "data.n_train=2", "data.n_val=0", "data.n_test=0", "data.series=[nile,sunspots]",
        "reward.k=2", "reward.family=answerability", "reward.answerability.generator=llm",
        "reward.answerability.max_new_tokens=24", "reward.answerability.min_verified=1",
        f"train.out_dir={tmp_path}"])
    with pytest.raises(DataError, match="2 series failed: question generation failed"):
        attach_questions(build_lineup_data(cfg.data, cfg.reward.k, cfg.seed).rows, cfg.reward.answerability,
                         dead_openai_backend(), tmp_path)
    assert not list(read_jsonl(tmp_path / "questions.jsonl", appended=True))  # nothing persisted: the outage is not "no questions"
    summary = json.loads((tmp_path / "questions_summary.json").read_text())
    assert summary["failed"]["series"] == 2

    data = build_lineup_data(cfg.data, cfg.reward.k, cfg.seed)  # the next run, with a working model, retries them
    try:
        attach_questions(data.rows, cfg.reward.answerability, embedded_backend, tmp_path)
    except DataError as exc:  # the 135M writer may produce no valid question: that is a result, and recorded
        assert "0 series failed" in str(exc)
    recs = list(read_jsonl(tmp_path / "questions.jsonl", appended=True))
    assert sorted(r["item_id"] for r in recs) == sorted(r["item_id"] for r in build_lineup_data(
        cfg.data, cfg.reward.k, cfg.seed).rows["train"])


# ---------------------------------------------------------------------- 4. a parser failure is never 0
def test_evolm_generator_parser_failure_is_unscored_and_an_invalid_reply_is_format_zero(monkeypatch, forbid_models):
    import captionrl.train.moco as moco
    from captionrl.judges.online_rubric import fixed_roles

    cfg = load_config(moco.MocoConfig, None, ["method=evolm", "train.max_steps=1"])
    reward = moco.EvolmGeneratorReward(cfg, fixed_roles(dead_openai_backend()))
    cols = {"current": [["a caption"]], "earlier": [["another"]]}
    assert reward(completions=["no rubric here, no JSON at all"], **cols) == [0.0]  # the parser's verdict: format 0

    def broken_parser(text, min_items, max_items):
        raise ValueError("could not convert string to float: 'x'")  # a bug inside the parser, not a verdict

    monkeypatch.setattr(moco, "parse_generator_reply", broken_parser)
    assert reward(completions=['[{"criterion": "c", "test": "t", "weight": 2}]'], **cols) == [None]
    assert reward.health.unscored == 1 and "rubric parser failed" in reward.health.last_error


# ---------------------------------------------------------------------- 5. a needed column is missing
def test_shaping_without_the_series_column_raises_at_the_first_call():
    from captionrl.rewards import RewardFunction
    from captionrl.rewards.reward import Reward
    from captionrl.rewards.spec import RewardSpec
    from captionrl.types import Judgment

    calls = []

    class _Judge:  # never reached without a series: the check comes first
        name = "fixed"

        def judge(self, captions, columns):
            calls.append(captions)
            return [Judgment(score=1.0) for _ in captions]

    reward = RewardFunction(Reward(_Judge(), RewardSpec(), series_rows=True))  # the guard is on by default
    with pytest.raises(DataError, match=r"columns\.series.*needs the 'series' column"):
        reward(prompts=["p"], completions=["1, 2, 3, 4, 5"], item_id=["a"])
    assert not calls
    assert reward(prompts=["p"], completions=["It rises."], series=[[1.0, 2.0, 3.0]]) == [1.0]  # with it: scored
    # an engine's label gives only the candidates: the true series is the first of them
    series = [12.5, 13.75, 14.25, 15.5, 16.0]
    dump = reward(prompts=["p"], completions=["12.50, 13.75, 14.25, 15.50, 16.00"], candidates=[[series, series[::-1]]])
    assert dump == [pytest.approx(1.0 - 0.1 - 1.0)]  # 5 copied values (1 beyond 4) and a run: guarded


# ---------------------------------------------------------------------- 6. longer than the context
def test_a_prompt_longer_than_the_context_is_a_named_error_before_any_forward_pass(embedded_backend, monkeypatch):
    def no_forward(*args, **kwargs):
        raise AssertionError("a forward pass ran on an input longer than the context")

    monkeypatch.setattr(type(embedded_backend), "_suffix_logprobs", no_forward)
    long = "word " * 9000  # ~9,000 tokens; SmolLM2's context is 8,192
    with pytest.raises(InputTooLongError, match=r"pair\[0\].*9\d\d\d tokens.*context of hf:embedded \(8192 tokens\)"):
        embedded_backend.loglikelihood([("Time series: 1, 2\nDescription:", " " + long)])
    with pytest.raises(InputTooLongError, match=r"prompt\[0\].*Fix: shorten"):
        embedded_backend.choose([[{"role": "user", "content": long}]], ["A", "B"])


def test_eval_identify_names_the_file_and_line_of_a_caption_longer_than_the_context(tmp_path, embedded_backend):
    from captionrl.eval.identification import IdentifyEvalConfig, run

    caps = tmp_path / "caps.jsonl"
    lines = [{"id": f"s{i}", "series": [float(i), 2.0, 3.0, float(i) * 2], "caption": "It rises."} for i in range(3)]
    lines[1]["caption"] = "1 2 3 4 5 6 7 8 9 0 " * 10_000  # 200,000 characters: a paste gone wrong
    caps.write_text("".join(json.dumps(r) + "\n" for r in lines))
    cfg = IdentifyEvalConfig(captions=[str(caps)], out=str(tmp_path / "out"), ks=[2], directions=["c2s"],
                             controls=False)
    with pytest.raises(InputTooLongError) as err:
        run(cfg, verifiers={"hf:embedded": embedded_backend})
    msg = str(err.value)
    assert f"{caps}:line 2" in msg and "200000 characters" in msg and "(8192 tokens)" in msg and "Fix:" in msg


def test_moco_run_living_on_fallback_rubrics_is_stopped_by_the_bound(tmp_path):
    """The Generator's server is down (refused connections), so every group falls back to the item's facts
    rubric: the bound's callback sees the fallback share, asks the Trainer to save and stop, and raises
    one line naming the fallback at the end of train()."""
    from types import SimpleNamespace

    from transformers import TrainerControl, TrainerState

    from captionrl.domains.scenes import make_scene
    from captionrl.errors import RewardLostError
    from captionrl.judges.online_rubric import OnlineRubricConfig, fixed_roles
    from captionrl.rewards.bound import RewardBound
    from captionrl.rewards.reward import build_reward
    from captionrl.rewards.spec import RewardSpec, RubricFamilyConfig
    from captionrl.train.moco import MocoReward
    from captionrl.train.run.callbacks import RewardBoundCallback

    dead = dead_openai_backend()
    spec = RewardSpec(family="rubric", subject="image", rubric=RubricFamilyConfig(mode="choose"),
                      transcription_penalty=0.0, run_penalty=0.0)
    reward = MocoReward(build_reward(spec, fixed_roles(dead), name="moco_rubric",
                                     online=OnlineRubricConfig(max_attempts=1, fallback="facts", with_image=False)))
    scene = make_scene(0, 0, size=96)
    callback = RewardBoundCallback(RewardBound(max_unscored_frac=1.0, max_fallback_frac=0.5, unscored_patience=1),
                                   [reward])
    args, state, control = SimpleNamespace(output_dir=str(tmp_path)), TrainerState(), TrainerControl()
    callback.on_train_begin(args, state, control)
    reward(completions=["a", "b"], item_id=[scene.id] * 2, references=[[scene.reference_caption, "x"]] * 2,
           facts=[json.dumps(scene.facts)] * 2, trainer_state=state)
    state.global_step = 1
    callback.on_step_end(args, state, control)
    assert control.should_save and control.should_training_stop
    with pytest.raises(RewardLostError, match=r"scored 100% of its rubric groups with the facts fallback.*steps 1-1"):
        callback.on_train_end(args, state, control)
