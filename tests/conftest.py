"""Shared fixtures: one embedded-model backend per test session (loading costs seconds)."""

from __future__ import annotations

import os

import pytest

from servers import llama_server, llama_server_factory  # noqa: F401  (real llama.cpp server fixtures)

# Tests share 2 cores with whatever else runs; one thread per process keeps them predictable.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


@pytest.fixture(scope="session")
def embedded_backend():
    """The embedded SmolLM2-135M-Instruct as an in-process backend (real model, loaded once)."""
    from captionrl.backends.hf import HFBackend

    backend = HFBackend("embedded", dtype="float32", batch_size=8)  # exact comparisons: pinned
    backend._ensure_loaded()
    return backend
