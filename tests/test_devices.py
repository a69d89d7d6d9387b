"""dtype ``auto``: bf16 only where it is native (GPU, AVX512-BF16/AMX CPU), float32 elsewhere, with a reason."""

from __future__ import annotations

import pytest
import torch

from captionrl import devices
from captionrl.devices import resolve_dtype
from captionrl.errors import ConfigError


@pytest.fixture
def cpu(monkeypatch):
    """Pretend to be a CPU with the given /proc/cpuinfo flags and torch capability."""

    def set_cpu(flags: set[str], capability: str) -> None:
        monkeypatch.setattr(devices, "cpu_flags", lambda: frozenset(flags))
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)

    return set_cpu


def test_auto_is_float32_on_an_avx2_cpu(cpu):
    cpu({"avx2", "fma"}, "AVX2")
    dtype, reason = resolve_dtype("auto", "cpu")
    assert dtype is torch.float32
    assert "AVX512-BF16" in reason and "AVX2" in reason


def test_auto_is_bf16_on_a_cpu_with_native_bf16(cpu):
    cpu({"avx512f", "avx512_bf16", "amx_bf16"}, "AVX512")
    dtype, reason = resolve_dtype("auto", "cpu")
    assert dtype is torch.bfloat16
    assert "amx_bf16+avx512_bf16" in reason


def test_bf16_flags_without_avx512_kernels_stay_float32(cpu):
    cpu({"avx512_bf16"}, "AVX2")  # e.g. ATEN_CPU_CAPABILITY=avx2 forced by the user
    dtype, reason = resolve_dtype("auto", "cpu")
    assert dtype is torch.float32 and "no native bf16 path" in reason


def test_explicit_dtype_is_honoured_and_trained_weights_stay_float32(cpu):
    cpu({"avx512_bf16"}, "AVX512")
    assert resolve_dtype("bfloat16", "cpu")[0] is torch.bfloat16
    assert resolve_dtype("float32", "cpu") == (torch.float32, "float32 as configured")
    dtype, reason = resolve_dtype("auto", "cpu", training=True)
    assert dtype is torch.float32 and "trained weights" in reason


def test_explicit_bf16_on_a_cpu_without_native_bf16_is_honoured_but_warns(cpu):
    cpu({"avx2", "fma"}, "AVX2")
    with pytest.warns(RuntimeWarning, match="set dtype: auto or float32"):
        dtype, reason = resolve_dtype("bfloat16", "cpu")
    assert dtype is torch.bfloat16 and reason.startswith("bfloat16 as configured (slow here:")
    cpu({"avx512_bf16"}, "AVX512")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_dtype("bfloat16", "cpu") == (torch.bfloat16, "bfloat16 as configured")


def test_cuda_without_a_gpu_falls_back_to_float32(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    dtype, reason = resolve_dtype("auto", "cuda:0")
    assert dtype is torch.float32 and "no bf16" in reason


def test_unknown_dtype_names_the_choices():
    with pytest.raises(ConfigError, match="auto, float32, bfloat16 or float16"):
        resolve_dtype("bf16", "cpu")


def test_the_real_cpu_gets_bf16_exactly_when_its_flags_say_native():
    flags = devices.cpu_flags()
    dtype, _ = resolve_dtype("auto", "cpu")
    native = bool(flags & set(devices.NATIVE_BF16_FLAGS)) and devices.cpu_capability().startswith("AVX512")
    assert (dtype is torch.bfloat16) == native
