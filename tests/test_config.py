"""Configs: YAML + overrides, clear errors naming field, value and fix."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from captionrl.backends import BackendConfig, parse_backend_spec
from captionrl.config import apply_overrides, from_dict, help_field, load_config, parse_override
from captionrl.errors import ConfigError
from captionrl.registry import Registry


@dataclass
class Inner:
    lr: float = help_field(1e-6, "learning rate")
    k: int = help_field(4, "candidates")


@dataclass
class Outer:
    name: str = help_field("run", "run name")
    inner: Inner = help_field(None, "nested section")  # type: ignore[assignment]
    tags: list[str] = help_field(["a"], "tags")

    def __post_init__(self) -> None:
        self.inner = self.inner or Inner()


def test_yaml_plus_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: demo\ninner:\n  k: 6\n")
    cfg = load_config(Outer, path, ["inner.lr=1e-5", "tags=[x, y]"])
    assert cfg.name == "demo" and cfg.inner.k == 6
    assert cfg.inner.lr == pytest.approx(1e-5)  # YAML reads 1e-5 as a string; it is coerced
    assert cfg.tags == ["x", "y"]


def test_unknown_keys_and_wrong_types_name_the_field_and_a_fix():
    with pytest.raises(ConfigError, match=r"inner\.kk.*did you mean 'k'"):
        from_dict(Outer, {"inner": {"kk": 3}})
    with pytest.raises(ConfigError, match=r"inner\.k.*must be int"):
        from_dict(Outer, {"inner": {"k": "four"}})
    with pytest.raises(ConfigError, match="key=value"):
        parse_override("train.max_steps")
    with pytest.raises(ConfigError, match="not a section"):
        apply_overrides({"name": "x"}, ["name.sub=1"])
    with pytest.raises(ConfigError, match="file not found"):
        load_config(Outer, "/nonexistent.yaml")


def test_backend_specs_and_validation():
    assert parse_backend_spec("hf:embedded,dtype=bfloat16").dtype == "bfloat16"
    spec = parse_backend_spec("openai:http://127.0.0.1:8000/v1#Qwen2.5-14B")
    assert (spec.kind, spec.base_url, spec.model) == ("openai", "http://127.0.0.1:8000/v1", "Qwen2.5-14B")
    assert parse_backend_spec("tiny-vlm").model == "tiny-vlm"
    with pytest.raises(ConfigError, match=r"unknown backend.*openai"):
        parse_backend_spec("opanai:http://x#m")
    with pytest.raises(ConfigError, match="base_url"):
        BackendConfig(kind="openai")


def test_registry_suggests_close_names():
    reg: Registry[int] = Registry("judge")
    reg.add("identify", 1)
    reg.add("rubric", 2)
    with pytest.raises(ConfigError, match="did you mean 'identify'"):
        reg.get("identfy")
