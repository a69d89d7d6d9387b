"""The checks a run makes before its data and its policy load, as one stage: settings that only go wrong on
a GPU node, the frozen bottom's settings, the GPU memory plan, and the servers the run needs. Every one of
them refuses bad input in seconds, not after a model load."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from captionrl.backends.startup import probe_servers
from captionrl.train.run.freezing import check_freeze_settings
from captionrl.train.run.gpu_checks import check_gpu_settings
from captionrl.train.run.memory_check import check_run_memory

if TYPE_CHECKING:
    from captionrl.backends import BackendConfig


def check_run(cfg: Any, args: Any, servers: Sequence[tuple[BackendConfig, str]]) -> None:
    """Every check before the data and the policy load: ``args`` are the trainer's arguments, ``servers`` the
    (backend config, config field) of every server the run needs."""
    check_gpu_settings(args, getattr(cfg, "policy", None), servers)  # GPU-only mistakes
    check_freeze_settings(cfg)
    check_run_memory(cfg, args)  # on CUDA: the memory plan (captionrl plan), refused if it does not fit
    probe_servers(servers)
