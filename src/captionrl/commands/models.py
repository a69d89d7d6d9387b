"""``captionrl models``: list backends and prove the embedded model loads (name, size, load time)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from captionrl.backends import BACKENDS
from captionrl.config import help_field


@dataclass
class ModelsConfig:
    """Settings of ``captionrl models``."""

    json: bool = help_field(False, "print one JSON object instead of text")
    load: bool = help_field(True, "load the embedded model and report it (--no-load: only list backends)")


CONFIG = ModelsConfig


def run_command(cfg: ModelsConfig) -> int:
    info: dict[str, Any] = {"backends": BACKENDS.names()}
    if cfg.load:
        from captionrl.embedded import describe_embedded

        info["embedded"] = describe_embedded()
    if cfg.json:
        print(json.dumps(info, indent=2))
        return 0
    print("backends: " + ", ".join(info["backends"]))
    emb = info.get("embedded")
    if isinstance(emb, dict):
        print(f"embedded model: {emb['name']}")
        print(f"  parameters:   {emb['parameters']:,} ({emb['parameters'] / 1e6:.1f}M)")
        print(f"  load time:    {emb['load_s']:.2f} s (first use converts the GGUF once: {emb['prepare_s']:.2f} s)")
        print(f"  gguf:         {emb['gguf']}")
        print(f"  cached at:    {emb['folder']}")
    return 0
