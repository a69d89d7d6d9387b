"""The ``vllm`` backend's memory settings reach ``vllm.LLM`` (vLLM does not install on these CPU machines: a
stub module stands in for it and records how ``LLM`` is built; the GPU smoke test builds the real one)."""

from __future__ import annotations

import sys
import types

import pytest

from captionrl.backends import BackendConfig, make_backend, parse_backend_spec
from captionrl.errors import ConfigError


@pytest.fixture
def built(monkeypatch):
    """The keyword arguments every ``vllm.LLM(...)`` of the test was built with."""
    calls: list[dict] = []

    class LLM:
        def __init__(self, model: str, **kwargs) -> None:
            calls.append({"model": model, **kwargs})

    stub = types.ModuleType("vllm")
    stub.LLM = LLM
    stub.SamplingParams = dict
    monkeypatch.setitem(sys.modules, "vllm", stub)
    return calls


def test_defaults_leave_the_gpu_to_the_trainer(built):
    """vLLM alone takes 0.9 of the GPU and the model's whole context (262,144 tokens for Qwen3-VL); the
    backend's defaults take 0.3 (TRL's colocate share) and 16,384 tokens."""
    backend = make_backend({"kind": "vllm", "model": "Qwen/Qwen2.5-14B-Instruct"}, shared=False)
    assert built == []  # built on first use
    _ = backend.llm
    assert built == [{"model": "Qwen/Qwen2.5-14B-Instruct", "gpu_memory_utilization": 0.3, "max_model_len": 16384,
                      "enforce_eager": False}]


def test_settings_from_a_spec_and_a_config_reach_vllm(built):
    spec = parse_backend_spec("vllm:m,gpu_memory_utilization=0.2,max_model_len=null,enforce_eager=true")
    _ = make_backend(spec, shared=False).llm
    _ = make_backend({"kind": "vllm", "model": "m", "max_model_len": 4096}, shared=False).llm
    assert built == [{"model": "m", "gpu_memory_utilization": 0.2, "enforce_eager": True},  # null: the model's
                     {"model": "m", "gpu_memory_utilization": 0.3, "max_model_len": 4096, "enforce_eager": False}]


def test_direct_construction_gets_the_same_defaults_and_checks(built):
    from captionrl.backends.vllm_offline import VLLMBackend

    _ = VLLMBackend("m", dtype="bfloat16").llm
    assert built[-1] == {"model": "m", "gpu_memory_utilization": 0.3, "max_model_len": 16384, "enforce_eager": False,
                         "dtype": "bfloat16"}
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        VLLMBackend("m", gpu_memory_utilization=0.0)


@pytest.mark.parametrize(("field", "value", "problem"), [
    ("gpu_memory_utilization", 0.0, "between 0 and 1"),
    ("gpu_memory_utilization", 1.0, "between 0 and 1"),
    ("gpu_memory_utilization", 90, "between 0 and 1"),
    ("gpu_memory_utilization", True, "between 0 and 1"),
    ("max_model_len", 0, "token count"),
    ("max_model_len", 2.5, "token count"),
])
def test_bad_memory_settings_are_refused_with_the_field_and_a_fix(field, value, problem):
    with pytest.raises(ConfigError, match=rf"backend\.{field}=.*{problem}.*Fix: set {field}: "):
        BackendConfig(kind="vllm", model="m", **{field: value})
