"""Configs are data: dataclasses with help text, loaded from YAML plus ``key=value`` overrides.

Every field carries ``metadata={"help": ...}``; ``__post_init__`` of each config rejects inconsistent
settings with a ``ConfigError`` that names field, value and fix. Validation happens on load, before any
model is built, so a bad config fails in milliseconds. The resolved config is saved beside the outputs.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from captionrl.errors import ConfigError
from captionrl.registry import suggest

C = TypeVar("C")


def help_field(default: Any = dataclasses.MISSING, help: str = "", *, flags: Sequence[str] = (),
               positional: bool = False, renamed_from: Sequence[str] = (), **kw: Any) -> Any:
    """A dataclass field with help text; mutable defaults are wrapped in a factory.

    ``flags``: extra command-line spellings kept for old commands (``("--mode",)`` for ``modes``);
    ``positional``: bare command-line words (no ``=``) fill this list field (``report RUN_DIR...``);
    ``renamed_from``: former names of this setting: given under one of them (YAML key, ``key=value`` or
    ``--flag``), a config fails with a ``ConfigError`` naming the old key, its value and the new key.
    """
    meta = {"help": help, "flags": tuple(flags), "positional": positional, "renamed_from": tuple(renamed_from)}
    if isinstance(default, (list, dict, set)):
        value = default
        return dataclasses.field(default_factory=lambda: copy_value(value), metadata=meta, **kw)
    return dataclasses.field(default=default, metadata=meta, **kw)


def copy_value(v: Any) -> Any:
    import copy

    return copy.deepcopy(v)


def parse_override(text: str) -> tuple[str, Any]:
    """``a.b=3`` -> ("a.b", 3); the value is parsed as YAML (numbers, booleans, lists, null)."""
    if "=" not in text:
        raise ConfigError("override", text, "is not of the form key=value", "write e.g. train.max_steps=10")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError("override", text, "has an empty key", "write e.g. train.max_steps=10")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    for text in overrides:
        key, value = parse_override(text)
        node = data
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError("override", text, f"{p!r} is not a section", "override a leaf field")
        node[parts[-1]] = value
    return data


def load_yaml(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A YAML config file as a mapping. A top-level ``extends: OTHER.yaml`` (relative to this file) starts
    from that file's settings and overrides them section by section with this file's, so a variant of a
    config states only what it changes."""
    data = _read_yaml(path)
    base = data.pop("extends", None)
    if base is None:
        return data
    here = Path(path).resolve()
    if not isinstance(base, str) or not base.strip():
        raise ConfigError("extends", base, f"in {path} is not a file name", "write extends: OTHER.yaml (a path "
                          "relative to this file)")
    parent = (here.parent / base).resolve()
    if parent in (*_seen, here):
        chain = " -> ".join(str(q) for q in (*_seen, here, parent))
        raise ConfigError("extends", base, f"makes a circle ({chain})", "let one of these files stop extending "
                          "the other")
    if not parent.exists():
        raise ConfigError("extends", base, f"in {path}: {parent} not found", "give a path relative to the file "
                          "that extends it, e.g. extends: lineup-cpu.yaml")
    return _merged(load_yaml(parent, (*_seen, here)), data)


def _merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over``'s keys set on it; mappings merge key by key, anything else (lists too) replaces."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


def _read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.exists():
        raise ConfigError("config", str(path), "file not found", "give the path of a YAML file, e.g. configs/lineup-cpu.yaml")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as exc:
        raise ConfigError("config", str(path), f"is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})", "save the file as UTF-8") from None
    except OSError as exc:
        raise ConfigError("config", str(path), f"cannot be read ({exc.strerror or exc})", "give the path of a readable YAML file") from None
    except yaml.YAMLError as exc:
        raise ConfigError("config", str(path), f"is not valid YAML ({exc})", "fix the YAML syntax") from exc
    if not isinstance(data, dict):
        raise ConfigError("config", str(path), "must hold a mapping at the top level", "write key: value lines")
    return data


def from_dict(cls: type[C], data: Mapping[str, Any], prefix: str = "") -> C:
    """Build dataclass ``cls`` from a (nested) mapping; unknown keys fail with close matches, a renamed key
    (``help_field(renamed_from=...)``) or a section merged into another (``cls.MERGED_SECTIONS``) with
    where it went."""
    if not isinstance(data, Mapping):
        raise ConfigError(prefix or cls.__name__, data, "must be a mapping", "write key: value lines")
    fields = {f.name: f for f in dataclasses.fields(typing.cast(Any, cls))}
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if key not in fields:
            new = next((f.name for f in fields.values() if key in f.metadata.get("renamed_from", ())), None)
            if new is not None:
                raise ConfigError(name, value, f"was renamed to {prefix}{new}",
                                  f"write {prefix}{new}={value!r} (the setting is the same, only its name changed)")
            merged = getattr(cls, "MERGED_SECTIONS", {}).get(key)
            if merged is not None:
                raise ConfigError(name, value, f"was merged into {prefix}{merged}",
                                  f"move its keys under {prefix}{merged} (same names, except where --help says)")
            raise ConfigError(name, value, "unknown setting", suggest(key, list(fields)))
        kwargs[key] = _coerce(hints[key], value, name)
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(prefix.rstrip(".") or cls.__name__, dict(data), str(exc), "add the missing settings") from exc


def _coerce(tp: Any, value: Any, name: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if isinstance(value, tp):
            return value
        if value is not None and not isinstance(value, Mapping):
            names = [f.name for f in dataclasses.fields(tp)]
            example = next((k for k in ("family", "kind", "name") if k in names), names[0])
            raise ConfigError(name, value, f"is a section, not a value (its keys: {', '.join(names)})",
                              f"write {name}.<key>=... (e.g. {name}.{example}={value!r})")
        return from_dict(tp, value or {}, prefix=name + ".")
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        if len(args) == 1:
            return _coerce(args[0], value, name)
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):  # YAML 1.1 reads 1e-5 (no dot) as a string
        try:
            return float(value)
        except ValueError:
            pass
    if tp is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if tp in (int, float, str, bool) and not isinstance(value, tp):
        if tp is str and isinstance(value, (int, float)):
            return str(value)
        raise ConfigError(name, value, f"must be {tp.__name__}", f"give a {tp.__name__} value")
    if origin is list and isinstance(value, tuple):
        value = list(value)
    if origin is list:
        (elem,) = typing.get_args(tp) or (Any,)
        if elem in (int, float, str, bool) and (isinstance(value, list) or elem is not str):
            # ``seeds=3`` is the one-element list; a list's items get the same checks as a scalar field (a
            # string for a list of strings is left to the config, which may split it: ``stats=mean,std``)
            items = value if isinstance(value, list) else [value]
            return [_coerce(elem, v, f"{name}[{i}]") for i, v in enumerate(items)]
    return value


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def save_config(cfg: Any, path: str | Path) -> None:
    """Write ``cfg`` as YAML, atomically: every rank of a multi-process run saves the run's config while
    the others may be reading it to compare with a resumed run (a torn read looked like 100 changed keys)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f"{p.name}.tmp{os.getpid()}")
    tmp.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    os.replace(tmp, p)


def load_config(cls: type[C], path: str | Path | None = None, overrides: Sequence[str] = ()) -> C:
    """YAML file (optional) + ``key=value`` overrides -> validated dataclass."""
    data = load_yaml(path) if path else {}
    return from_dict(cls, apply_overrides(data, overrides))


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _nested(tp: Any) -> type | None:
    """The dataclass type of a nested section (``Inner`` or ``Inner | None``), else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = args[0] if len(args) == 1 else None
    return tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None


def describe(cls: type, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key, default, help) of every field, nested sections as dotted keys: what ``--help`` lists."""
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        inner = _nested(hints[f.name])
        if inner is not None:
            rows.extend(describe(inner, key + "."))
            continue
        default = _default(f)
        rows.append((key, "(required)" if default is dataclasses.MISSING else repr(default), f.metadata.get("help", "")))
    return rows


# ---------------------------------------------------------------------- command lines from configs
_KEY = re.compile(r"^[A-Za-z_][\w.]*$")
_SCALARS = (str, int, float)


def _flag_kind(tp: Any) -> tuple[str, Any] | None:
    """("bool" | "scalar" | "list", element type) for a field that gets a ``--flag``; None: key=value only."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) != 1:
            return None
        tp = args[0]
    if tp is bool:
        return "bool", bool
    if tp in _SCALARS:
        return "scalar", tp
    if typing.get_origin(tp) is list:
        (elem,) = typing.get_args(tp) or (str,)
        return ("list", elem) if elem in _SCALARS else None
    return None


def add_config_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """Give ``parser`` the options of config dataclass ``cls``: ``--config FILE.yaml``, ``key=value``
    words (dotted for nested sections), a ``--field`` flag per top-level scalar, list or boolean field
    (``--no-field`` for booleans). ``--help`` shows every field with its help text and default: flags in
    the options list, the rest (nested sections, mappings) in an epilog under their dotted keys."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    if not any("--config" in f.metadata.get("flags", ()) for f in dataclasses.fields(cls)):
        # a command whose input is a config file (``captionrl plan --config PRESET``) names a field for it instead
        parser.add_argument("--config", metavar="FILE.yaml", default=None,
                            help="YAML file of the settings below; flags and key=value words override it")
    hints = typing.get_type_hints(cls)
    positional = ""
    flagged: set[str] = set()
    for f in dataclasses.fields(cls):
        if f.metadata.get("positional"):
            positional = f.name
            flagged.add(f.name)
            continue
        kind = _flag_kind(hints[f.name])
        if kind is None:
            continue
        flagged.add(f.name)
        names = [f"--{f.name.replace('_', '-')}", *([f"--{f.name}"] if "_" in f.name else []), *f.metadata.get("flags", ())]
        if "--config" in names:  # the field that owns --config is a config file: shown as --config FILE.yaml
            names = ["--config", *(n for n in names if n != "--config")]
        default = _default(f)
        text = f.metadata.get("help", "") + (" (required)" if default is dataclasses.MISSING else f" (default: {default!r})")
        kw: dict[str, Any] = {"dest": f"cfg__{f.name}", "default": argparse.SUPPRESS, "help": text.replace("%", "%%")}
        if kind[0] == "bool":
            kw["action"] = argparse.BooleanOptionalAction
        elif kind[0] == "list":
            kw.update(action="extend", nargs="*", type=kind[1], metavar=f.name.upper())
        else:
            kw.update(type=kind[1], metavar="FILE.yaml" if names[0] == "--config" else f.name.upper())
        parser.add_argument(*names, **kw)
        for old in f.metadata.get("renamed_from", ()):  # accepted, then refused by name in from_dict
            old_kw = {**kw, "dest": f"cfg__{old}", "help": argparse.SUPPRESS}
            parser.add_argument(*dict.fromkeys([f"--{old.replace('_', '-')}", f"--{old}"]), **old_kw)
    what = ""
    if positional:
        f = next(f for f in dataclasses.fields(cls) if f.name == positional)
        what = f"{positional.upper()} (bare words): {f.metadata.get('help', '')} (default: {_default(f)!r}). "
    parser.add_argument("words", nargs="*", metavar=f"{positional.upper()}|KEY=VALUE" if positional else "KEY=VALUE",
                        help=(what + "KEY=VALUE: setting overrides, e.g. out=runs/x (dotted keys for nested "
                              "sections; put them before the flags that take lists)").replace("%", "%%"))
    rows = [r for r in describe(cls) if r[0] not in flagged]  # nested sections and dicts: no --flag
    if rows:
        width = max(len(k) for k, _, _ in rows)
        listing = "\n".join(f"  {k:<{width}}  {h} (default: {d})" for k, d, h in rows)
        parser.epilog = f"settings without a --flag (YAML keys or key=value words):\n{listing}"


def config_from_args(cls: type[C], args: argparse.Namespace) -> C:
    """The config a parsed command line describes: YAML file, then ``--flags``, then ``key=value`` words."""
    data = load_yaml(args.config) if getattr(args, "config", None) else {}
    for name, value in vars(args).items():
        if name.startswith("cfg__"):
            data[name[len("cfg__"):]] = value
    positional = next((f.name for f in dataclasses.fields(typing.cast(Any, cls)) if f.metadata.get("positional")), "")
    overrides, bare = [], []
    for word in getattr(args, "words", None) or []:
        is_setting = "=" in word and _KEY.match(word.split("=", 1)[0]) is not None
        (overrides if is_setting else bare).append(word)
    if bare:
        if not positional:
            raise ConfigError("arguments", bare, "are not key=value settings", "write e.g. out=runs/x, or use the --flags")
        data[positional] = bare
    return from_dict(cls, apply_overrides(data, overrides))


# ---------------------------------------------------------------------- output paths
IN_THE_WAY = {"file": ("is a file where a folder is expected", "give a folder's path (new or existing), or move that file"),
              "folder": ("is a folder where a file is expected", "give a file's path, or move that folder")}


def _output_settings(cfg: object, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, value, "folder" or "file") of every output path a config names: a field called ``out`` or
    ``out_dir`` whose help says which of the two it is."""
    found: list[tuple[str, str, str]] = []
    for f in dataclasses.fields(cfg):  # type: ignore[arg-type]
        value, key, text = getattr(cfg, f.name), f"{prefix}{f.name}", f.metadata.get("help", "")
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            found.extend(_output_settings(value, f"{key}."))
        elif f.name in ("out", "out_dir") and isinstance(value, str) and value:
            kind = "folder" if "folder" in text else "file" if "file" in text else None
            if kind:
                found.append((key, value, kind))
    return found


def check_output_paths(cfg: object) -> None:
    """Refuse, before anything loads, an output folder given as an existing file's name (or a path under one)
    and an output file given as an existing folder's name: named with its setting and the fix."""
    for key, value, kind in _output_settings(cfg):
        path = Path(value)
        if kind == "folder":
            blocker = next((p for p in (path, *path.parents) if p.is_file()), None)
            if blocker is not None:
                problem, fix = IN_THE_WAY["file"]
                raise ConfigError(key, value, problem if blocker == path else f"cannot be made: {blocker} {problem}", fix)
        elif path.is_dir():
            raise ConfigError(key, value, *IN_THE_WAY["folder"])


def path_in_the_way(exc: OSError, cfg: object) -> str | None:
    """The one-line message for a path a command failed to make or write because a file stands where a folder
    goes (or a folder where a file goes), when that path is one of ``cfg``'s settings or lies under one: the
    setting, its value and the fix. ``None`` for any other path (a bug: it keeps its traceback)."""
    if cfg is None or not exc.filename:
        return None
    failed = Path(os.path.abspath(os.fsdecode(exc.filename)))
    if isinstance(exc, IsADirectoryError):
        blocker, (problem, fix) = failed, IN_THE_WAY["folder"]
    else:
        blocker, (problem, fix) = next((p for p in (failed, *failed.parents) if p.is_file()), None), IN_THE_WAY["file"]
        if blocker is None:
            return None

    def settings(value: object, prefix: str = "") -> list[tuple[str, str]]:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return [kv for f in dataclasses.fields(value) for kv in settings(getattr(value, f.name), f"{prefix}{f.name}.")]
        return [(prefix.rstrip("."), value)] if isinstance(value, str) and value else []

    for key, value in settings(cfg):
        path = Path(os.path.abspath(value))
        if path == blocker or (blocker in path.parents and not isinstance(exc, IsADirectoryError)):
            said = problem if path == blocker else f"cannot be made: {blocker} {problem}"
            return f"{key}={value!r}: {said}. Fix: {fix}"
    return None
