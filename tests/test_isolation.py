"""The suite runs in its own cache folder: nothing reads or writes the user's ~/.cache/captionrl."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from captionrl.embedded import cache_dir


def test_the_cache_is_the_sessions_own_folder():
    user = Path(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))) / "captionrl"
    here = cache_dir()
    assert here == Path(os.environ["CAPTIONRL_CACHE"])
    assert here.resolve() != user.resolve()
    assert user.resolve() not in here.resolve().parents
    out = subprocess.run([sys.executable, "-c", "from captionrl.embedded import cache_dir; print(cache_dir())"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert Path(out) == here  # subprocess tests inherit it
