"""Saving a built tiny model as a folder, once, even with several processes racing to build it.

The spec file keeps its historical name, ``captionrl_fixture.json``, so folders built by earlier versions
(under ``captionrl.embedded.cache_dir()/models``) are still found instead of rebuilt.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

SPEC_FILE = "captionrl_fixture.json"
"""The spec a tiny model was built from, saved beside it; its presence marks a finished folder."""


def cached_tiny_model(name: str, build: Callable[[Path], Path], rebuild: bool = False) -> Path:
    """The folder ``name`` under the model cache, built by ``build(target)`` unless a finished one is there."""
    from captionrl.embedded import cache_dir

    target = cache_dir() / "models" / name
    if not rebuild and (target / SPEC_FILE).exists():
        return target
    return build(target)


def save_tiny_model(target: Path, model: Any, processor: Any, spec: dict[str, Any]) -> Path:
    """Write model, processor and the spec that built them beside ``target``, then rename into place: a
    reader never sees a half-written folder, and the last of several racing builders wins whole."""
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    processor.save_pretrained(tmp)
    (tmp / SPEC_FILE).write_text(json.dumps(spec, indent=2) + "\n")
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():  # a rebuild, or another process finished first
        shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target
