"""Is this Python environment a working GPU install? The last step of ``scripts/setup.sh --gpu``.

``python scripts/gpu_env_check.py scripts/gpu-pins.txt`` checks, in order, and stops at the first problem:

1. torch is a CUDA build (``torch.version.cuda``) and sees a GPU (``torch.cuda.is_available()``);
2. ``import transformers, torchvision, vllm, deepspeed`` works (a CUDA torchvision beside a CPU torch fails
   here with "operator torchvision::nms does not exist");
3. every package the pins file names has the pinned version (the versions the tests ran under).

Success prints one summary line (versions, CUDA, device) on stdout and exits 0; a problem prints one line,
``setup.sh --gpu: <what>. Fix: <fix>``, on stderr and exits 1. Standard library and the checked packages only.
"""

from __future__ import annotations

import importlib
import re
import sys
from importlib import metadata
from pathlib import Path

MODULES = ("transformers", "torchvision", "vllm", "deepspeed")
"""Imported after torch: each must load beside the CUDA torch (vLLM, and the Qwen-VL image processors)."""


def read_pins(path: str | Path) -> dict[str, str]:
    """``{distribution name: version}`` from a pip constraints file of ``name==version`` lines."""
    pins: dict[str, str] = {}
    for raw in Path(path).read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*===?\s*([^\s;]+)", line)
        if m is None:
            raise ValueError(f"{path}: '{raw}' is not a name==version line")
        pins[_norm(m.group(1))] = m.group(2)
    return pins


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _public(version: str) -> str:
    """The version without its local label (``2.13.0+cu130`` -> ``2.13.0``)."""
    return version.split("+", 1)[0]


def problem(pins: dict[str, str]) -> tuple[str, str] | None:
    """``(what is wrong, fix)`` for the first problem of this environment, or ``None`` when it is a GPU install."""
    fix_pins = "rm -rf .venv-gpu && bash scripts/setup.sh --gpu (reinstalls at the pinned versions)"
    try:
        import torch
    except Exception as exc:  # any import failure is the finding
        return f"torch does not import ({type(exc).__name__}: {exc})", fix_pins
    if torch.version.cuda is None:
        return (f"torch {torch.__version__} is a CPU build, and vLLM needs the CUDA build",
                "rm -rf .venv-gpu && bash scripts/setup.sh --gpu, with no CPU torch wheel on pip's find-links "
                "(PIP_FIND_LINKS)")
    if not torch.cuda.is_available():
        return (f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU",
                f"check that nvidia-smi lists a GPU, that CUDA_VISIBLE_DEVICES does not hide it, and that the "
                f"driver supports CUDA {torch.version.cuda}")
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return f"import {name} fails beside torch {torch.__version__} ({type(exc).__name__}: {first})", fix_pins
    for name, wanted in pins.items():
        try:
            got = metadata.version(name)
        except metadata.PackageNotFoundError:
            return f"{name} is not installed, but {wanted} is pinned", fix_pins
        if _public(got) != _public(wanted):
            return f"{name} is {got}, but the tested version is {wanted}", fix_pins
    return None


def summary() -> str:
    import torch
    import transformers
    import vllm

    return (f"torch {torch.__version__} (CUDA {torch.version.cuda}), vllm {vllm.__version__}, transformers "
            f"{transformers.__version__}, {torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name(0)}")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python scripts/gpu_env_check.py scripts/gpu-pins.txt", file=sys.stderr)
        return 2
    found = problem(read_pins(argv[0]))
    if found is not None:
        what, fix = found
        print(f"setup.sh --gpu: {what}. Fix: {fix}", file=sys.stderr)
        return 1
    print(summary())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
