"""Configs: YAML + overrides, clear errors naming field, value and fix."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import pytest

from captionrl.backends import BackendConfig, parse_backend_spec
from captionrl.config import (
    add_config_arguments,
    apply_overrides,
    config_from_args,
    describe,
    from_dict,
    help_field,
    load_config,
    parse_override,
)
from captionrl.errors import ConfigError
from captionrl.registry import Registry


@dataclass
class Inner:
    lr: float = help_field(1e-6, "learning rate")
    k: int = help_field(4, "candidates")


@dataclass
class Outer:
    name: str = help_field("run", "run name")
    inner: Inner = field(default_factory=Inner, metadata={"help": "nested section"})
    tags: list[str] = help_field(["a"], "tags")
    fast: bool = help_field(True, "a switch")
    limit: int | None = help_field(None, "optional count", flags=("--max",))


def test_yaml_plus_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: demo\ninner:\n  k: 6\n")
    cfg = load_config(Outer, path, ["inner.lr=1e-5", "tags=[x, y]"])
    assert cfg.name == "demo" and cfg.inner.k == 6
    assert cfg.inner.lr == pytest.approx(1e-5)  # YAML reads 1e-5 as a string; it is coerced
    assert cfg.tags == ["x", "y"]


def test_a_config_extends_another_and_states_only_what_it_changes(tmp_path):
    """``extends`` starts from another file (relative to this one): sections merge key by key, lists and
    values replace, overrides still come last; a circle or a missing base is named."""
    (tmp_path / "base.yaml").write_text("name: base\ntags: [a, b]\ninner:\n  k: 6\n  lr: 1.0e-4\n")
    (tmp_path / "variants").mkdir()
    (tmp_path / "variants" / "v.yaml").write_text("extends: ../base.yaml\ntags: [c]\ninner:\n  k: 8\n")
    (tmp_path / "variants" / "vv.yaml").write_text("extends: v.yaml\nfast: false\n")
    cfg = load_config(Outer, tmp_path / "variants" / "vv.yaml", ["inner.k=9"])
    assert (cfg.name, cfg.tags, cfg.fast, cfg.inner.lr, cfg.inner.k) == ("base", ["c"], False, 1e-4, 9)
    assert load_config(Outer, tmp_path / "variants" / "v.yaml").inner.k == 8

    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\nname: b\n")
    with pytest.raises(ConfigError) as info:
        load_config(Outer, tmp_path / "a.yaml")
    assert info.value.field == "extends" and "circle" in str(info.value)
    (tmp_path / "c.yaml").write_text("extends: missing.yaml\n")
    with pytest.raises(ConfigError) as info:
        load_config(Outer, tmp_path / "c.yaml")
    assert info.value.field == "extends" and "missing.yaml" in str(info.value) and "relative" in str(info.value)


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


def test_spec_options_follow_commas():
    spec = parse_backend_spec("hf:embedded,dtype=bfloat16,batch_size=16")
    assert (spec.kind, spec.model, spec.dtype, spec.batch_size) == ("hf", "embedded", "bfloat16", 16)
    spec = parse_backend_spec("openai:http://127.0.0.1:8000/v1#Qwen,concurrency=4,timeout_s=30")
    assert (spec.base_url, spec.model, spec.concurrency, spec.timeout_s) == ("http://127.0.0.1:8000/v1", "Qwen", 4, 30.0)
    assert parse_backend_spec("vllm:Qwen/Qwen2.5-14B").kind == "vllm"
    with pytest.raises(ConfigError, match="not key=value"):
        parse_backend_spec("hf:embedded,bfloat16")
    with pytest.raises(ConfigError, match="did you mean 'dtype'"):
        parse_backend_spec("hf:embedded,dtyp=float32")
    with pytest.raises(ConfigError, match="spec's head"):
        parse_backend_spec("hf:embedded,model=other")
    with pytest.raises(ConfigError, match=r"batch_size.*must be int"):
        parse_backend_spec("hf:embedded,batch_size=many")


def _parse(cls, argv):
    parser = argparse.ArgumentParser(prog="x")
    add_config_arguments(parser, cls)
    return parser, config_from_args(cls, parser.parse_args(argv))


def test_generated_flags_file_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: file\ntags: [f]\ninner:\n  k: 5\n")
    _, cfg = _parse(Outer, ["--config", str(path), "inner.lr=0.5", "--name", "flag", "--no-fast", "--max", "3"])
    assert (cfg.name, cfg.tags, cfg.inner.k, cfg.inner.lr, cfg.fast, cfg.limit) == ("flag", ["f"], 5, 0.5, False, 3)
    _, cfg = _parse(Outer, ["name=word", "--tags", "x", "y"])  # key=value words beat flags; lists take many
    assert (cfg.name, cfg.tags, cfg.fast, cfg.limit) == ("word", ["x", "y"], True, None)
    _, cfg = _parse(Outer, ["--tags", "x", "--tags", "y"])
    assert cfg.tags == ["x", "y"]
    with pytest.raises(ConfigError, match="did you mean 'name'"):
        _parse(Outer, ["nmae=x"])
    with pytest.raises(ConfigError, match="not key=value"):
        _parse(Outer, ["loose-word"])


def test_help_lists_every_field_with_its_default():
    parser, _ = _parse(Outer, [])
    text = parser.format_help()
    for key, default, help_text in describe(Outer):
        assert key.split(".")[-1] in text and help_text.split()[0] in text
        assert default in text, (key, default)
    assert "--no-fast" in text and "--max" in text and "inner.lr" in text  # nested: listed under dotted keys


@dataclass
class Renamed:
    limit: int | None = help_field(None, "at most this many items", renamed_from=("max_items",))
    inner: Inner = field(default_factory=Inner, metadata={"help": "nested section"})


def test_a_renamed_setting_fails_naming_the_old_key_its_value_and_the_new_key(tmp_path):
    """One name per idea: a setting renamed (``max_items`` -> ``limit``) is refused under its old name, in
    YAML, as a key=value word and as a --flag, with a message that says what to write instead."""
    with pytest.raises(ConfigError) as exc:
        from_dict(Renamed, {"max_items": 5})
    assert (exc.value.field, exc.value.value) == ("max_items", 5)
    assert "renamed to limit" in str(exc.value) and "limit=5" in str(exc.value)
    path = tmp_path / "old.yaml"
    path.write_text("max_items: 7\n")
    with pytest.raises(ConfigError, match=r"max_items=7: was renamed to limit"):
        load_config(Renamed, path)
    for argv in (["max_items=3"], ["--max-items", "3"], ["--max_items", "3"]):
        with pytest.raises(ConfigError, match=r"max_items=3: was renamed to limit.*limit=3"):
            _parse(Renamed, argv)
    parser, cfg = _parse(Renamed, ["--limit", "3"])
    assert cfg.limit == 3 and "max-items" not in parser.format_help()


def test_the_rl_effect_config_is_the_cpu_config_with_a_rescaled_per_pass_warm_start():
    """configs/lineup-cpu-rl-effect.yaml is the measured arrangement: the CPU config with exactly these changes."""
    from pathlib import Path

    from captionrl.train.lineup_config import LineupConfig

    configs = Path(__file__).resolve().parents[1] / "configs"
    changes = ["warm_start.epochs=16", "warm_start.rescale_share=1.0", "warm_start.rescale_draw=pass",
               "warm_start.order=values_first", "data.rl_rescale_share=1.0", "verifier.dtype=float32",
               "train.out_dir=runs/lineup-cpu-rl-effect"]
    effect = load_config(LineupConfig, configs / "lineup-cpu-rl-effect.yaml")
    assert effect == load_config(LineupConfig, configs / "lineup-cpu.yaml", changes)
    assert effect != load_config(LineupConfig, configs / "lineup-cpu.yaml", changes[1:])
