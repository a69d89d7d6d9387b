"""Where a training step's time goes: generation, reward (and the verifier's share), policy log-probs,
policy forward/backward, optimizer.

``step_time`` alone cannot say whether the reward is the bottleneck (the LineupRL authors report it is at
paper scale). ``install_step_timer(trainer)`` measures each part of every optimizer step, for RLOO and
GRPO alike, without subclassing TRL's trainers: it wraps four methods *of the trainer instance* and
the verifier backends its reward functions hold, and listens to the optimizer callbacks:

- ``time/generation``: ``trainer._generate`` (sampling the captions, with its tokenisation);
- ``time/reward``: ``trainer._calculate_rewards`` (every reward function, sync and async);
- ``time/verifier``: wall time during which any backend reachable from a reward function (a verifier,
  a judge) had a call in flight, a part of ``time/reward``;
- ``time/logprobs``: the rest of TRL's input preparation (old-policy and reference log-probs, advantages);
- ``time/backward``: the policy forward + backward of the loss (``training_step`` minus its input
  preparation);
- ``time/optimizer``: ``optimizer.step()`` (between TRL's pre- and post-optimizer callbacks);
- ``time/step``: ``on_step_begin`` to ``on_step_end`` of the optimizer step, so the parts sum to at most it.

On a GPU the clock is read only after ``torch.cuda.synchronize()`` (:func:`clock`): CUDA kernels run
asynchronously, so without it a part would end when its kernels were *queued*, and their run time would be
charged to whichever later part first waits on the device (the optimizer step's ``.item()``, the next
generation). Nothing is synchronised on a CPU run or before CUDA is in use. ``time/verifier`` needs no
synchronisation: a backend call returns host values (texts, floats), which waits for its own kernels.

The values enter TRL's own metric buffer at each step end, so they reach ``metrics.jsonl``, TensorBoard
and W&B like ``step_time`` does; a one-line breakdown is printed at each log, and ``timing.json`` (means,
the reward's share, and the dtype every model was loaded in and why) is written at the end of training.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

PARTS = ("generation", "reward", "verifier", "logprobs", "backward", "optimizer")
KEYS = tuple(f"time/{p}" for p in (*PARTS, "step"))
BACKEND_METHODS = ("generate", "choose", "loglikelihood", "agenerate", "achoose", "aloglikelihood",
                   "aloglikelihood_results")
"""Backend calls timed as verifier time (sync and async; nested calls count once)."""


def _device_synchronize() -> None:
    """Wait for the work queued on the current CUDA device, when this process uses CUDA (else nothing)."""
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def clock() -> float:
    """``time.perf_counter()`` once the device has finished what was queued before it (see the module doc)."""
    _device_synchronize()
    return time.perf_counter()


class _Busy:
    """Wall time during which at least one call was in flight (thread-safe; overlapping calls count once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active = 0
        self._since = 0.0
        self.total = 0.0

    def enter(self) -> None:
        with self._lock:
            if self._active == 0:
                self._since = time.perf_counter()
            self._active += 1

    def exit(self) -> None:
        with self._lock:
            self._active -= 1
            if self._active == 0:
                self.total += time.perf_counter() - self._since

    def take(self) -> float:
        with self._lock:
            value = self.total
            if self._active:  # a call still running: count up to now, keep counting after
                now = time.perf_counter()
                value += now - self._since
                self._since = now
            self.total = 0.0
            return value


def _callback_base() -> type:
    from transformers import TrainerCallback

    return TrainerCallback


class StepTimer(_callback_base()):  # type: ignore[misc]
    """The per-step breakdown (see module doc). Build with ``install_step_timer``."""

    def __init__(self, trainer: Any, out_dir: str | Path | None = None, echo: bool = True) -> None:
        self.trainer = trainer
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.echo = echo
        self.acc: dict[str, float] = dict.fromkeys(PARTS, 0.0)
        self.verifier = _Busy()
        self.history: list[dict[str, float]] = []
        self._step_t0: float | None = None
        self._opt_t0: float | None = None
        self._in_prepare = 0.0
        self.backends: list[str] = []

    # ------------------------------------------------------------------ wrappers
    def _timed(self, fn: Callable[..., Any], part: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kw: Any) -> Any:
            t0 = clock()
            try:
                return fn(*args, **kw)
            finally:
                self.acc[part] += clock() - t0

        return wrapper

    def _wrap_trainer(self) -> None:
        from captionrl.train.run.trl_compat import original

        tr = self.trainer
        tr._generate = self._timed(original(tr, "_generate"), "generation")
        tr._calculate_rewards = self._timed(original(tr, "_calculate_rewards"), "reward")
        prepare, train_step = original(tr, "_prepare_inputs"), original(tr, "training_step")

        @functools.wraps(prepare)
        def timed_prepare(*args: Any, **kw: Any) -> Any:
            t0 = clock()
            try:
                return prepare(*args, **kw)
            finally:
                self._in_prepare += clock() - t0

        @functools.wraps(train_step)
        def timed_training_step(*args: Any, **kw: Any) -> Any:
            t0 = clock()
            before = self._in_prepare
            try:
                return train_step(*args, **kw)
            finally:
                self.acc["backward"] += (clock() - t0) - (self._in_prepare - before)

        tr._prepare_inputs = timed_prepare
        tr.training_step = timed_training_step

    def wrap_backends(self, roots: Iterable[Any]) -> list[str]:
        """Time every backend reachable from ``roots`` (reward functions) as verifier time."""
        for backend in find_backends(roots):
            for name in BACKEND_METHODS:
                fn = getattr(backend, name, None)
                if fn is None or getattr(fn, "_captionrl_timed", False):
                    continue
                setattr(backend, name, self._busy_wrapper(fn))
            self.backends.append(str(getattr(backend, "name", type(backend).__name__)))
        return self.backends

    def _busy_wrapper(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        import inspect

        busy = self.verifier
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def awrapper(*args: Any, **kw: Any) -> Any:
                busy.enter()
                try:
                    return await fn(*args, **kw)
                finally:
                    busy.exit()

            awrapper._captionrl_timed = True  # type: ignore[attr-defined]
            return awrapper

        @functools.wraps(fn)
        def wrapper(*args: Any, **kw: Any) -> Any:
            busy.enter()
            try:
                return fn(*args, **kw)
            finally:
                busy.exit()

        wrapper._captionrl_timed = True  # type: ignore[attr-defined]
        return wrapper

    # ------------------------------------------------------------------ callbacks
    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        # Work before the step (the reward preflight, an evaluation) is not the step's: drop what it left.
        self.verifier.take()
        self.acc = dict.fromkeys(PARTS, 0.0)
        self._in_prepare = 0.0
        self._step_t0 = clock()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._opt_t0 = clock()

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self._opt_t0 is not None:
            self.acc["optimizer"] += clock() - self._opt_t0
            self._opt_t0 = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self._step_t0 is None:
            return
        step = clock() - self._step_t0
        self._step_t0 = None
        rec = {"generation": self.acc["generation"], "reward": self.acc["reward"],
               "verifier": self.verifier.take(),
               "logprobs": max(self._in_prepare - self.acc["generation"] - self.acc["reward"], 0.0),
               "backward": self.acc["backward"], "optimizer": self.acc["optimizer"], "step": step}
        self.acc = dict.fromkeys(PARTS, 0.0)
        self._in_prepare = 0.0
        self.history.append({"global_step": float(state.global_step), **rec})
        metrics = getattr(self.trainer, "_metrics", None)
        if isinstance(metrics, dict) and "train" in metrics:  # TRL averages these into the step's log
            for part, value in rec.items():
                metrics["train"][f"time/{part}"].append(value)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
        if self.echo and logs and "time/step" in logs and state.is_world_process_zero:
            from tqdm.auto import tqdm

            tqdm.write(format_breakdown(logs, int(state.global_step)))

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.out_dir is None or not state.is_world_process_zero:
            return
        summary = self.summary()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "timing.json").write_text(json.dumps(summary, indent=2) + "\n")
        if summary["steps"]:
            logger.info("time per step (mean): " + format_breakdown(
                      {f"time/{k}": v for k, v in summary["mean_seconds"].items()}, None))

    def summary(self) -> dict[str, Any]:
        """Mean seconds per part, the reward's and verifier's share of a step, and the models' dtypes."""
        from captionrl.devices import DTYPE_CHOICES

        n = len(self.history)
        mean = {k: round(sum(h[k] for h in self.history) / n, 4) for k in (*PARTS, "step")} if n else {}
        share = {}
        if n and mean["step"] > 0:
            share = {"reward": round(mean["reward"] / mean["step"], 4),
                     "verifier": round(mean["verifier"] / mean["step"], 4)}
        reuse = getattr(self.trainer, "_captionrl_on_policy", {}).get("reason")  # train/run/on_policy.py
        shared = getattr(self.trainer, "_captionrl_shared_prefix", None)  # train/run/shared_prefix.py
        return {"steps": n, "mean_seconds": mean, "share_of_step": share, "timed_backends": self.backends,
                "dtypes": dict(DTYPE_CHOICES),
                "old_policy_logprobs": f"skipped: {reuse}" if reuse else "computed (TRL's pass)",
                "shared_prompt_forward": dict(shared) if shared is not None else "off (TRL's pass)"}


def format_breakdown(logs: dict[str, Any], step: int | None) -> str:
    """``step 3 time: generation 4.1s | reward 2.0s (verifier 1.9s) | ... | step 9.8s``."""

    def get(part: str) -> float:
        v = logs.get(f"time/{part}")
        return float(v) if isinstance(v, (int, float)) else float("nan")

    head = f"step {step} time: " if step is not None else ""
    return (f"{head}generation {get('generation'):.2f}s | reward {get('reward'):.2f}s "
            f"(verifier {get('verifier'):.2f}s) | logprobs {get('logprobs'):.2f}s | "
            f"forward/backward {get('backward'):.2f}s | optimizer {get('optimizer'):.2f}s | "
            f"step {get('step'):.2f}s")


def find_backends(roots: Iterable[Any], depth: int = 4) -> list[Any]:
    """Backends (objects with ``name``, ``generate``, ``choose`` and ``loglikelihood``) held by ``roots``,
    through attributes, containers and closures, at most ``depth`` levels down; torch modules are skipped."""
    found: dict[int, Any] = {}
    seen: set[int] = set()

    def children(obj: Any) -> Iterator[Any]:
        if isinstance(obj, dict):
            yield from obj.values()
        elif isinstance(obj, (list, tuple, set, frozenset)):
            yield from obj
        else:
            yield from (getattr(obj, "__dict__", None) or {}).values()
            func = getattr(obj, "func", None)  # functools.partial
            if func is not None:
                yield func
            for cell in getattr(obj, "__closure__", None) or ():
                try:
                    yield cell.cell_contents
                except ValueError:
                    continue

    def is_backend(obj: Any) -> bool:
        return all(callable(getattr(obj, m, None)) for m in ("generate", "choose", "loglikelihood")) and \
            isinstance(getattr(obj, "name", None), str) and not isinstance(obj, type)

    def visit(obj: Any, level: int) -> None:
        if id(obj) in seen or obj is None or isinstance(obj, (str, bytes, int, float, bool, Path)):
            return
        seen.add(id(obj))
        if _is_torch_module(obj):
            return
        if is_backend(obj):
            found[id(obj)] = obj
            return
        if level >= depth:
            return
        for child in children(obj):
            visit(child, level + 1)

    for r in roots:
        visit(r, 0)
    return list(found.values())


def _is_torch_module(obj: Any) -> bool:
    try:
        import torch
    except ImportError:
        return False
    return isinstance(obj, (torch.nn.Module, torch.Tensor))


def install_step_timer(trainer: Any, out_dir: str | Path | None = None, echo: bool = True) -> StepTimer:
    """Wrap ``trainer`` (RLOOTrainer or GRPOTrainer) and its rewards' backends; register the callback."""
    timer = StepTimer(trainer, out_dir, echo)
    timer._wrap_trainer()
    timer.wrap_backends(getattr(trainer, "reward_funcs", []))
    trainer.add_callback(timer)
    return timer
