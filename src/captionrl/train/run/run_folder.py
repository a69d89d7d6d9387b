"""The run folder: checked before anything loads, resumed from its last complete checkpoint only under the
config it was started with, which it keeps beside its outputs."""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from captionrl.config import to_dict
from captionrl.errors import ConfigError
from captionrl.train.run.builder import is_main_process

logger = logging.getLogger(__name__)

RESUME_SAFE_KEYS = ("train.threads", "train.report_to", "train.logging_steps", "train.max_steps", "train.memory_plan",
                    "train.resume", "eval", "check", "build_rubrics",
                    "reward.max_unscored_frac", "reward.unscored_patience", "reward.max_fallback_frac")
"""Settings that may change between an interrupted run and its resume (they do not change what was
learnt so far). ``train.max_steps`` may grow to train longer, and the lost-reward bound may be loosened
to resume a run it stopped; everything else must match the saved config."""


def quiet_offline_env(out_dir: str | Path) -> None:
    """No telemetry pings (the trainer runs offline) and TensorBoard files in a known folder of the run."""
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TENSORBOARD_LOGGING_DIR", str(Path(out_dir) / "tensorboard"))


CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


PARTIAL_SUFFIXES = (".tmp", ".partial")
"""A file with one of these endings is a write that never finished (a file is written there, then renamed)."""


def incomplete_reason(checkpoint: Path, required: Sequence[str] = ()) -> str | None:
    """Why ``checkpoint`` is not a complete checkpoint, or ``None`` when it is.

    The Trainer writes ``trainer_state.json`` after the weights, optimizer and RNG states, so a folder
    without it (or with a torn one) was cut by a kill during save; ``required`` names files that callbacks
    write after it (MoCo's ``momentum.pt``), and a leftover ``*.tmp`` file is a write that never finished.
    """
    import json

    state = checkpoint / "trainer_state.json"
    if not state.is_file():
        return "no trainer_state.json (killed while saving?)"
    try:
        json.loads(state.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        return f"trainer_state.json is torn ({exc})"
    missing = [name for name in required if not (checkpoint / name).exists()]
    if missing:
        return f"no {', '.join(missing)} (killed while saving?)"
    partial = sorted(f.name for f in checkpoint.iterdir() if f.name.endswith(PARTIAL_SUFFIXES))
    if partial:
        return f"unfinished file(s) {', '.join(partial)}"
    return None


def last_checkpoint(out_dir: str | Path, required: Sequence[str] = ()) -> Path | None:
    """The most recent complete checkpoint of a run (see :func:`incomplete_reason`).

    Folders left half written by a kill during save are skipped with a message naming each and why, so
    a rerun resumes from the previous complete checkpoint instead of failing on (or silently trusting)
    the torn one.
    """
    folder = Path(out_dir) / "checkpoints"
    if not folder.is_dir():
        return None
    found = []
    for p in folder.iterdir():
        m = CHECKPOINT_RE.match(p.name)
        if not (m and p.is_dir()):
            continue
        reason = incomplete_reason(p, required)
        if reason is None:
            found.append((int(m.group(1)), p))
        elif is_main_process():
            logger.warning(f"skipping incomplete checkpoint {p}: {reason}")
    return max(found)[1] if found else None


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


RUN_FOLDER = "<run folder>"
"""What a path inside the run folder is compared as: the folder's own place does not change the run."""


def folder_relative(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``flat`` (a flattened config) with ``train.out_dir`` dropped and every path inside it written relative
    to it. Why: a run folder that was copied or moved (a warm start reused by a run with another verifier
    dtype, a run folder synced from another machine) holds the same run; its absolute paths alone must not
    refuse the resume."""
    out = dict(flat)
    root = out.pop("train.out_dir", None)
    if not isinstance(root, str) or not root:
        return out
    prefix = str(Path(root)).rstrip("/") + "/"
    return {k: RUN_FOLDER + "/" + v[len(prefix):] if isinstance(v, str) and v.startswith(prefix) else v
            for k, v in out.items()}


def config_differences(saved: Mapping[str, Any], current: Mapping[str, Any],
                       safe: Sequence[str] = RESUME_SAFE_KEYS,
                       defaults: Mapping[str, Any] | None = None) -> list[tuple[str, Any, Any]]:
    """(key, saved, current) for every setting that differs, except those safe to change on resume, and
    settings the saved config predates that are at their default now (``defaults``: a new setting's default
    keeps the behaviour the run was started with, so a run saved by an older captionrl still resumes).
    The run folder's own place is not compared (``folder_relative``): a copied folder resumes."""
    a, b = folder_relative(flatten(saved)), folder_relative(flatten(current))
    born_later = flatten(defaults or {})
    diffs = []
    for key in sorted(set(a) | set(b)):
        if any(key == s or key.startswith(s + ".") for s in safe):
            continue
        if key not in a and key in born_later and b.get(key) == born_later[key]:
            continue
        va, vb = a.get(key, "(absent)"), b.get(key, "(absent)")
        if isinstance(va, float) and isinstance(vb, float) and math.isclose(va, vb):
            continue
        if va != vb:
            diffs.append((key, va, vb))
    return diffs


def default_settings(cfg: Any) -> dict[str, Any]:
    """The defaults of ``cfg``'s config class as a nested mapping (empty when the class has required fields)."""
    try:
        return to_dict(type(cfg)())
    except (TypeError, ConfigError):
        return {}


def prepare_run_dir(cfg: Any, out_dir: str | Path, resume: str, required: Sequence[str] = ()) -> Path | None:
    """Check the run folder before anything loads; save the config; return the checkpoint to resume from.

    A folder with checkpoints is resumed only when its saved ``config.yaml`` matches ``cfg`` (apart from
    ``RESUME_SAFE_KEYS``); otherwise the user is told which settings differ and how to proceed.
    ``required``: files a complete checkpoint of this recipe holds besides the Trainer's own.
    """
    import yaml

    from captionrl.config import save_config

    out = Path(out_dir)
    ckpt = last_checkpoint(out, required)
    saved_path = out / "config.yaml"
    current = to_dict(cfg)
    if ckpt is not None:
        if resume == "off":
            raise ConfigError("train.out_dir", str(out), f"already holds checkpoints ({ckpt.name}) and train.resume is off",
                              "choose a new train.out_dir, or set train.resume: auto to continue that run")
        if saved_path.exists():
            saved = yaml.safe_load(saved_path.read_text()) or {}
            diffs = config_differences(saved, current, defaults=default_settings(cfg))
            if diffs:
                shown = "; ".join(f"{k}: saved {va!r}, now {vb!r}" for k, va, vb in diffs[:12])
                raise ConfigError(
                    "train.out_dir", str(out),
                    f"holds a run with a different config ({len(diffs)} setting(s) differ: {shown})",
                    "rerun with the saved settings (see config.yaml there) to resume, or choose a new train.out_dir",
                )
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, saved_path)
    return ckpt
