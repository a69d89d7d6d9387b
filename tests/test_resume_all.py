"""Real-kill resume for every recipe: each run is started as ``python -m captionrl.cli train ...``, killed
with SIGKILL once a checkpoint exists and before it ends, and rerun with the same command. The rerun says
which checkpoint it resumed from, reaches ``max_steps`` (read from the Trainer's own ``trainer_state.json``)
and keeps the steps logged before the kill. MoCo's momentum after a kill and resume equals an
uninterrupted run's; RubiCap and SFT are killed while writing a checkpoint (full fine-tuning writes ~1.6 GB,
a window of seconds), so the rerun must skip that half-written folder, say so, and resume from the one
before. LineupRL's kill test lives in ``test_train_resume.py``.

Sizes are the smallest that still train: a few steps, a checkpoint every step, short completions,
one thread per process (the uninterrupted MoCo run goes on the second core meanwhile).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from captionrl.train.run.run_folder import incomplete_reason, last_checkpoint

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 900.0  # seconds a single run may take on a busy 2-core machine before the test gives up


# ---------------------------------------------------------------------- unit: incomplete checkpoints
def _fake_checkpoint(root: Path, step: int, *, state: str | None = "{}", files: Sequence[str] = ("model.safetensors",)) -> Path:
    p = root / "checkpoints" / f"checkpoint-{step}"
    p.mkdir(parents=True)
    for name in files:
        (p / name).write_bytes(b"x")
    if state is not None:
        (p / "trainer_state.json").write_text(state)
    return p


def test_half_written_checkpoints_are_skipped_with_a_message(tmp_path, caplog):
    ok = _fake_checkpoint(tmp_path, 2, files=("model.safetensors", "momentum.pt"))
    _fake_checkpoint(tmp_path, 1, files=("model.safetensors", "momentum.pt"))
    no_state = _fake_checkpoint(tmp_path, 3, state=None)  # killed while writing the weights
    torn = _fake_checkpoint(tmp_path, 4, state='{"global_step": 4, "log_hist')  # killed inside the state file
    tmp_file = _fake_checkpoint(tmp_path, 5, files=("model.safetensors", "momentum.pt", "momentum.pt.tmp"))
    (tmp_path / "checkpoints" / "checkpoint-9x").mkdir()  # not a checkpoint name: ignored silently
    (tmp_path / "checkpoints" / "runs").mkdir()

    assert last_checkpoint(tmp_path) == ok
    out = "\n".join(caplog.messages)
    assert f"skipping incomplete checkpoint {no_state}: no trainer_state.json" in out
    assert f"skipping incomplete checkpoint {torn}: trainer_state.json is torn" in out
    assert f"skipping incomplete checkpoint {tmp_file}: unfinished file(s) momentum.pt.tmp" in out
    assert "checkpoint-9x" not in out and "checkpoint-1" not in out and "checkpoint-2:" not in out

    # a recipe that needs a file written after the Trainer's state (MoCo's momentum.pt) names it
    missing = _fake_checkpoint(tmp_path, 6, files=("model.safetensors",))
    assert last_checkpoint(tmp_path) == missing  # the Trainer's files alone make it complete ...
    caplog.clear()
    assert last_checkpoint(tmp_path, required=("momentum.pt",)) == ok  # ... but not a MoCo checkpoint
    assert f"skipping incomplete checkpoint {missing}: no momentum.pt" in "\n".join(caplog.messages)


def test_only_incomplete_checkpoints_mean_a_fresh_start(tmp_path, caplog):
    assert last_checkpoint(tmp_path) is None  # no checkpoints folder at all
    only = _fake_checkpoint(tmp_path, 1, state=None)
    assert last_checkpoint(tmp_path) is None
    assert f"skipping incomplete checkpoint {only}: no trainer_state.json" in "\n".join(caplog.messages)
    assert incomplete_reason(_fake_checkpoint(tmp_path, 2)) is None


def test_resumed_sampler_continues_the_uninterrupted_shuffle():
    from types import SimpleNamespace

    from torch.utils.data import DataLoader
    from trl.trainer.utils import RepeatSampler

    from captionrl.train.run.callbacks import ResumeShuffleCallback

    def loader() -> DataLoader:  # TRL's sampler as GRPO builds it: each item's group of 2 in one batch
        sampler = RepeatSampler(list(range(6)), mini_repeat_count=2, batch_size=1, repeat_count=1, shuffle=True, seed=3)
        return DataLoader(list(range(6)), batch_size=2, sampler=sampler)

    def epoch(dl: DataLoader) -> list[list[int]]:
        return [b.tolist() for b in dl]

    uninterrupted = loader()
    orders = [epoch(uninterrupted) for _ in range(3)]
    assert len(orders[0]) == 6 and orders[0] != orders[1] != orders[2]
    assert epoch(loader()) == orders[0]  # a fresh sampler replays epoch 0: what a plain resume would do
    for step, expected in ((8, orders[1]), (12, orders[2]), (3, orders[0])):  # resumed in epoch 1, 2, 0
        resumed = loader()
        ResumeShuffleCallback().on_train_begin(SimpleNamespace(gradient_accumulation_steps=1),
                                               SimpleNamespace(global_step=step), None, train_dataloader=resumed)
        assert epoch(resumed) == expected, step


# ---------------------------------------------------------------------- helpers for the kill tests
def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1"}


def _train(*args: str) -> list[str]:
    return [sys.executable, "-m", "captionrl.cli", "train", *args]


def _ckpt(out: Path, step: int) -> Path:
    return out / "checkpoints" / f"checkpoint-{step}"


def _complete(out: Path, step: int, required: Sequence[str] = ()) -> bool:
    p = _ckpt(out, step)
    return p.is_dir() and incomplete_reason(p, required) is None


def _kill_when(cmd: list[str], log: Path, ready: Callable[[], bool]) -> None:
    """Start ``cmd``, SIGKILL it as soon as ``ready()`` holds; the run must still be going then."""
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=fh, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + TIMEOUT
            while not ready():
                if proc.poll() is not None:
                    pytest.fail(f"the run ended (exit {proc.returncode}) before it could be killed:\n{log.read_text()[-4000:]}")
                if time.monotonic() > deadline:
                    pytest.fail(f"not ready to kill within {TIMEOUT:.0f} s:\n{log.read_text()[-4000:]}")
                time.sleep(0.02)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, log.read_text()[-4000:]


def _rerun(cmd: list[str], log: Path) -> str:
    """Run ``cmd`` to the end; returns its output (stdout and stderr)."""
    done = subprocess.run(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=TIMEOUT)
    log.write_text(done.stdout)
    assert done.returncode == 0, done.stdout[-4000:]
    return done.stdout


def _state(ckpt: Path) -> dict:
    return json.loads((ckpt / "trainer_state.json").read_text())


def _logged_steps(state: dict, key: str) -> list[int]:
    return [h["step"] for h in state["log_history"] if key in h]


def _check_resumed(out: Path, text: str, resumed_from: Path, max_steps: int, key: str, before: dict) -> None:
    """The rerun said where it resumed, reached max_steps, logged every step once and kept the old log."""
    assert f"resuming from {resumed_from}" in text, text[-3000:]
    final = _state(_ckpt(out, max_steps))
    assert final["global_step"] == max_steps
    assert _logged_steps(final, key) == list(range(1, max_steps + 1))
    kept = [h for h in before["log_history"] if key in h]
    assert kept and all(h in final["log_history"] for h in kept), "steps logged before the kill were lost"


@pytest.fixture
def run_dir(tmp_path: Path) -> Iterator[Path]:
    """A run folder removed afterwards: full fine-tuning checkpoints weigh ~1.6 GB each."""
    yield tmp_path / "run"
    shutil.rmtree(tmp_path / "run", ignore_errors=True)


def _kill_while_saving_then_rerun(cmd: list[str], out: Path, logs: Path, max_steps: int, key: str) -> None:
    """Kill once checkpoint-1 is complete and checkpoint-2 (the last) is being written; the rerun skips the
    torn checkpoint-2 with a message, resumes from checkpoint-1 and redoes step 2."""
    _kill_when(cmd, logs / "killed.log", lambda: _complete(out, 1) and _ckpt(out, 2).is_dir())
    torn = _ckpt(out, 2)
    assert incomplete_reason(torn) is not None, "the kill landed after the save finished; the save window is gone"
    assert last_checkpoint(out) == _ckpt(out, 1)
    before = _state(_ckpt(out, 1))
    text = _rerun(cmd, logs / "rerun.log")
    assert f"skipping incomplete checkpoint {torn}: no trainer_state.json" in text, text[-3000:]
    _check_resumed(out, text, _ckpt(out, 1), max_steps, key, before)


# ---------------------------------------------------------------------- RubiCap, SFT (killed mid-save)
@pytest.mark.long  # kill-while-saving: test_sft_killed_while_saving_... in the default tier
@pytest.mark.slow
def test_rubicap_killed_while_saving_resumes_from_the_previous_checkpoint(run_dir, tmp_path):
    cmd = _train("rubicap", "--config", str(ROOT / "configs" / "rubicap-cpu.yaml"),
                 "data.items=scenes:4:0", "train.num_generations=2", "train.per_device_train_batch_size=2",
                 "train.max_completion_length=8", "train.max_steps=2", "train.save_steps=1", "train.report_to=[]",
                 "train.threads=1", f"train.out_dir={run_dir}")
    _kill_while_saving_then_rerun(cmd, run_dir, tmp_path, 2, "reward")
    assert (run_dir / "model" / "config.json").exists()


@pytest.mark.slow
def test_sft_killed_while_saving_resumes_from_the_previous_checkpoint(run_dir, tmp_path):
    teacher = tmp_path / "teacher.jsonl"
    teacher.write_text("".join(json.dumps({"id": f"s{i}", "prompt": f"Describe series {i}: {i}, {i + 2}, {2 * i}.",
                                           "caption": f"It rises from {i} to {2 * i}."}) + "\n" for i in range(8)))
    cmd = _train("sft", f"data.path={teacher}", f"train.out_dir={run_dir}", "train.max_steps=2", "train.save_steps=1",
                 "train.per_device_train_batch_size=1", "train.max_length=64", "train.logging_steps=1",
                 "train.report_to=[]", "train.threads=1", "train.save_total_limit=2")
    _kill_while_saving_then_rerun(cmd, run_dir, tmp_path, 2, "loss")
    summary = json.loads((run_dir / "sft_summary.json").read_text())
    assert summary["steps"] == 2 and summary["resumed_from"] == str(_ckpt(run_dir, 1))

    # interrupted after its last checkpoint (the final save lost): the rerun trains no step beyond max_steps
    # (the Trainer alone resumes a run that ends inside an epoch into one more step)
    shutil.rmtree(run_dir / "model")
    text = _rerun(cmd, tmp_path / "after-last.log")
    assert not _ckpt(run_dir, 3).exists() and (run_dir / "model" / "config.json").is_file()
    assert json.loads((run_dir / "sft_summary.json").read_text())["steps"] == 2
    assert f"{_ckpt(run_dir, 2)} is the last step (2): nothing left to train" in text, text[-3000:]


# ---------------------------------------------------------------------- multi-role SFT (LoRA)
@pytest.mark.slow
def test_multirole_sft_killed_after_a_checkpoint_resumes(run_dir, tmp_path):
    max_steps = 4
    cmd = _train("moco-sft", "data.demo=true", "data.demo_images=1", f"train.out_dir={run_dir}",
                 f"train.max_steps={max_steps}", "train.save_steps=1", "train.per_device_train_batch_size=1",
                 "train.max_length=320", "train.logging_steps=1", "train.report_to=[]", "train.threads=1",
                 "train.learning_rate=0.001", "policy.lora=true", "policy.lora_r=2",
                 "policy.lora_target_modules=[q_proj,v_proj]")
    _kill_when(cmd, tmp_path / "killed.log", lambda: _complete(run_dir, 1))
    resumed_from = last_checkpoint(run_dir)
    assert resumed_from is not None and int(resumed_from.name.split("-")[1]) < max_steps
    text = _rerun(cmd, tmp_path / "rerun.log")
    _check_resumed(run_dir, text, resumed_from, max_steps, "loss", _state(resumed_from))
    roles = {json.loads(line)["role"] for line in (run_dir / "data.jsonl").read_text().splitlines()}
    assert roles == {"policy", "generator", "judge"}


# ---------------------------------------------------------------------- MoCo (momentum included)
MOCO_STEPS = 4
MOCO_KILL_AFTER = 2  # checkpoint-2 complete (momentum.pt included), steps 3-4 are redone after the kill


def _moco_cmd(out: Path) -> list[str]:
    # 2 images, one per step: the kill after step 2 lands on an epoch boundary, so the resumed epoch must
    # draw the uninterrupted run's second shuffle (train.run.callbacks.ResumeShuffleCallback), not the first.
    return _train("moco", "--config", str(ROOT / "configs" / "moco-cpu.yaml"), "data.n_train=2",
                  "train.max_completion_length=8", "rubric.max_new_tokens=8", "rubric.max_attempts=1",
                  "train.threads=1", f"train.max_steps={MOCO_STEPS}", "train.save_steps=1",
                  "train.save_total_limit=null", f"train.out_dir={out}")


@dataclass
class MocoRuns:
    reference: Path  # uninterrupted
    resumed: Path  # killed after checkpoint-2, rerun
    resumed_from: Path
    rerun_text: str
    before: dict


@pytest.fixture(scope="module")
def moco_runs(tmp_path_factory) -> Iterator[MocoRuns]:
    """One uninterrupted MoCo run (on the second core, in the background) and one killed and rerun."""
    root = tmp_path_factory.mktemp("moco")
    ref_out, out = root / "reference", root / "resumed"
    with (root / "reference.log").open("w") as fh:
        ref = subprocess.Popen(_moco_cmd(ref_out), cwd=ROOT, env=_env(), stdout=fh, stderr=subprocess.STDOUT)
        try:
            _kill_when(_moco_cmd(out), root / "killed.log", lambda: _complete(out, MOCO_KILL_AFTER, ("momentum.pt",)))
            resumed_from = last_checkpoint(out, ("momentum.pt",))
            assert resumed_from is not None and int(resumed_from.name.split("-")[1]) < MOCO_STEPS
            before = _state(resumed_from)
            text = _rerun(_moco_cmd(out), root / "rerun.log")
            assert ref.wait(timeout=TIMEOUT) == 0, (root / "reference.log").read_text()[-4000:]
        finally:
            if ref.poll() is None:
                ref.send_signal(signal.SIGKILL)
                ref.wait()
    yield MocoRuns(ref_out, out, resumed_from, text, before)
    shutil.rmtree(root, ignore_errors=True)


def _momentum(ckpt: Path) -> dict:
    import torch

    return torch.load(ckpt / "momentum.pt", map_location="cpu", weights_only=False)


def _max_diff(a: dict, b: dict) -> float:
    assert a["slots"].keys() == b["slots"].keys()
    worst = 0.0
    for slot in a["slots"]:
        assert a["slots"][slot].keys() == b["slots"][slot].keys()
        for name, t in a["slots"][slot].items():
            worst = max(worst, float((t.float() - b["slots"][slot][name].float()).abs().max()))
    return worst


@pytest.mark.long  # MoCo resume incl. momentum: the DeepSpeed moco-zero3 rehearsal's resume in the default tier
@pytest.mark.slow
def test_moco_killed_after_a_checkpoint_resumes_to_max_steps(moco_runs):
    r = moco_runs
    _check_resumed(r.resumed, r.rerun_text, r.resumed_from, MOCO_STEPS, "reward", r.before)
    result = json.loads((r.resumed / "result.json").read_text())
    assert result["steps"] == MOCO_STEPS and result["momentum"]["updates"] == MOCO_STEPS
    distances = [h["momentum/distance"] for h in _state(_ckpt(r.resumed, MOCO_STEPS))["log_history"]
                 if "momentum/distance" in h]
    assert len(distances) == MOCO_STEPS and distances[-1] > 0


@pytest.mark.long  # the same module fixture (two MoCo runs, 5 min)
@pytest.mark.slow
def test_moco_momentum_after_resume_equals_an_uninterrupted_run(moco_runs):
    from safetensors.torch import load_file

    r = moco_runs
    k = int(r.resumed_from.name.split("-")[1])
    # up to the kill both runs are the same computation (fixed seed, one thread) ...
    assert _max_diff(_momentum(_ckpt(r.reference, k)), _momentum(r.resumed_from)) == 0.0
    # ... and the resumed run restores the momentum (and the epoch's data order) and continues as if it
    # had never been interrupted
    ref_final, res_final = _momentum(_ckpt(r.reference, MOCO_STEPS)), _momentum(_ckpt(r.resumed, MOCO_STEPS))
    assert res_final["updates"] == ref_final["updates"] == MOCO_STEPS
    assert res_final["last_update_step"] == ref_final["last_update_step"] == MOCO_STEPS
    moved = _max_diff(_momentum(r.resumed_from), ref_final)
    assert moved > 1e-6, "the momentum did not move after the resume point: the comparison below would be empty"
    assert _max_diff(res_final, ref_final) < 1e-8
    # the Policy (LoRA adapter) too, and the rewards the momentum Judge gave after the resume
    ref_policy = load_file(_ckpt(r.reference, MOCO_STEPS) / "adapter_model.safetensors")
    res_policy = load_file(_ckpt(r.resumed, MOCO_STEPS) / "adapter_model.safetensors")
    at_kill = load_file(r.resumed_from / "adapter_model.safetensors")
    assert max(float((ref_policy[n] - at_kill[n]).abs().max()) for n in ref_policy) > 1e-5
    assert max(float((ref_policy[n] - res_policy[n]).abs().max()) for n in ref_policy) < 1e-7
    ref_rewards = [h["reward"] for h in _state(_ckpt(r.reference, MOCO_STEPS))["log_history"] if "reward" in h]
    res_rewards = [h["reward"] for h in _state(_ckpt(r.resumed, MOCO_STEPS))["log_history"] if "reward" in h]
    assert res_rewards == pytest.approx(ref_rewards, abs=1e-6)


# ---------------------------------------------------------------------- EvoLM (phase checkpoints)
@pytest.mark.long  # kill after a checkpoint: the multi-role SFT kill in the default tier
@pytest.mark.slow
def test_evolm_killed_after_a_phase_resumes_at_the_next_phase(run_dir, tmp_path):
    cmd = _train("moco", "--config", str(ROOT / "configs" / "moco-cpu.yaml"), "method=evolm", "data.n_train=2",
                 "train.max_completion_length=8", "rubric.max_new_tokens=8", "rubric.max_attempts=1",
                 "train.threads=1", "train.max_steps=2", "evolm.policy_steps=1", "evolm.generator_steps=1",
                 "evolm.n_captions=2", "evolm.generator_num_generations=2", "train.num_generations=2",
                 "train.per_device_train_batch_size=2", f"train.out_dir={run_dir}")
    phases = run_dir / "evolm" / "phases.jsonl"

    def phase_one_done() -> bool:
        return phases.is_file() and '"phase": 1' in phases.read_text()

    _kill_when(cmd, tmp_path / "killed.log", phase_one_done)
    assert [json.loads(line)["phase"] for line in phases.read_text().splitlines()] == [1], "killed too late"
    text = _rerun(cmd, tmp_path / "rerun.log")
    assert "resuming after EvoLM phase 1" in text, text[-3000:]
    assert [json.loads(line)["phase"] for line in phases.read_text().splitlines()] == [1, 2]  # phase 1 not redone
    result = json.loads((run_dir / "result.json").read_text())
    assert result["steps"] == 2 and result["phases"] == 2
    for phase in (1, 2):  # each phase's Policy trainer ran its one step to the end
        state = _state(run_dir / "evolm" / f"phase{phase}-policy" / "checkpoints" / "checkpoint-1")
        assert state["global_step"] == 1
    merged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sorted(m["step"] for m in merged if m["role"] == "policy" and "reward" in m) == [1, 2]
