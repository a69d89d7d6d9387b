"""Shared fixtures: one embedded-model backend per test session (loading costs seconds).

The suite never reads or writes the user's cache (``~/.cache/captionrl`` or their ``$CAPTIONRL_CACHE``):
``CAPTIONRL_CACHE`` is forced to a fresh folder per session, shared by the session's pytest-xdist workers, so
every test path that converts or caches (the embedded model, the tiny VLMs, text embeddings) runs for real,
once per session (the embedded model's conversion takes about a minute on a busy 2-core machine), and
subprocesses inherit it. A developer may point
``CAPTIONRL_TEST_CACHE`` at a folder of their own to keep it between sessions; CI leaves it unset.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from servers import llama_server, llama_server_factory  # noqa: F401  (real llama.cpp server fixtures)

# Tests share 2 cores with whatever else runs; one thread per process keeps them predictable.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

_SESSION_CACHE = "CAPTIONRL_SESSION_CACHE"  # the controller's folder, inherited by its pytest-xdist workers
if os.environ.get("CAPTIONRL_TEST_CACHE"):
    TEST_CACHE, _OWN_CACHE = os.environ["CAPTIONRL_TEST_CACHE"], False
elif os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get(_SESSION_CACHE):
    # One folder for the session's workers: a model is converted or built once, not once per worker (every cache
    # writer writes a folder or file of its own and renames it into place, so two workers never see half of one).
    TEST_CACHE, _OWN_CACHE = os.environ[_SESSION_CACHE], False
else:
    TEST_CACHE, _OWN_CACHE = tempfile.mkdtemp(prefix="captionrl-test-cache-"), True
    os.environ[_SESSION_CACHE] = TEST_CACHE
os.environ["CAPTIONRL_CACHE"] = TEST_CACHE  # forced, before any test (or subprocess) asks for cache_dir()


def pytest_report_header(config) -> str:
    """Free disk where tests write: a training test needs ~2-4 GB while it runs (see pyproject)."""
    free_gb = shutil.disk_usage(tempfile.gettempdir()).free / 2**30
    return f"captionrl: {free_gb:.1f} GiB free in {tempfile.gettempdir()}; test cache {TEST_CACHE}"


LONG_TESTS = "CAPTIONRL_LONG_TESTS"


HEAVIEST_FIRST = ("test_rehearsal_lineup.py", "test_deepspeed_rehearsal.py", "test_rehearsal_rubicap.py",
                  "test_preflight.py", "test_paper_eval.py", "test_moco_preflight.py", "test_identify.py",
                  "test_faults.py", "test_resume_all.py", "test_lineup_families.py", "test_train_moco.py",
                  "test_prepare.py", "test_rubicap_rewards.py", "test_trainer_args.py", "test_rehearsal_moco.py",
                  "test_gpu_pins.py")
"""Files whose tests take longest (``--durations``, 2026-12-02), handed to the xdist workers first.

The two workers take a file each at a time (``--dist loadfile``, ``--no-loadscope-reorder``); xdist's own
order puts files with few tests last, and those are the single long rehearsals, so one worker ran them
alone for minutes at the end. Heaviest first, the many short files even out the finish."""

HEAVIEST_FIRST_LONG = ("test_gpu_pins.py", "test_resume_all.py", "test_deepspeed_rehearsal.py", "test_faults.py",
                       "test_train_resume.py", "test_train_distributed.py", "test_train_moco.py")
"""The long tier's own order (``-m long``; ``--durations``, 2026-12-07): its heaviest files are not the default
tier's, and the GPU smoke rehearsal (7 minutes on a 2-core AVX2 CPU) started late ran alone at the end."""


def pytest_collection_modifyitems(config, items):
    """Heaviest files first (above); the long tier runs only when asked for (``CAPTIONRL_LONG_TESTS=1``),
    and says so in the summary.

    Each long test is a second test of a joint the default tier tests once (a real-kill resume of another
    recipe or DeepSpeed stage, another preset's dry run, a two-process DDP run beside the DeepSpeed rehearsals): the default
    tier keeps every joint and, with setup, is sized for 30 minutes on 2 cores; the long tier is the whole suite."""
    order = HEAVIEST_FIRST_LONG if config.getoption("markexpr", "") == "long" else HEAVIEST_FIRST
    rank = {name: i for i, name in enumerate(order)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
    if os.environ.get(LONG_TESTS):
        return
    skip = pytest.mark.skip(reason=f"long tier: {LONG_TESTS}=1 runs it (docs/testing.md)")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)


def pytest_unconfigure(config):
    if _OWN_CACHE:
        shutil.rmtree(TEST_CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def embedded_backend():
    """The embedded SmolLM2-135M-Instruct as an in-process backend (real model, loaded once)."""
    from captionrl.backends.hf import HFBackend

    backend = HFBackend("embedded", dtype="float32", batch_size=8)  # exact comparisons: pinned
    backend._ensure_loaded()
    return backend


@pytest.fixture(scope="session")
def tiny_llama() -> str:
    """Folder of the tiny random SmolLM2-shaped policy (``captionrl.testing.tiny_llama``): the policy of the
    training-mechanics tests, whose checks need a model that trains, not one that writes English."""
    from captionrl.testing.tiny_llama import tiny_llama_dir

    return str(tiny_llama_dir())
