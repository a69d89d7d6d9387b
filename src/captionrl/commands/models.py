"""``captionrl models``: list backends and prove the embedded model loads (name, size, load time)."""

from __future__ import annotations

import argparse
import json

from captionrl.backends import BACKENDS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--no-load", action="store_true", help="only list backends; do not load the embedded model")


def main(args: argparse.Namespace) -> int:
    info: dict[str, object] = {"backends": BACKENDS.names()}
    if not args.no_load:
        from captionrl.embedded import describe_embedded

        info["embedded"] = describe_embedded()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print("backends: " + ", ".join(info["backends"]))  # type: ignore[arg-type]
    emb = info.get("embedded")
    if isinstance(emb, dict):
        print(f"embedded model: {emb['name']}")
        print(f"  parameters:   {emb['parameters']:,} ({emb['parameters'] / 1e6:.1f}M)")
        print(f"  load time:    {emb['load_s']:.2f} s (first use converts the GGUF once: {emb['prepare_s']:.2f} s)")
        print(f"  gguf:         {emb['gguf']}")
        print(f"  cached at:    {emb['folder']}")
    return 0
