"""Bad input through the command line: one named line on stderr, exit 2, no traceback; bugs keep theirs."""

from __future__ import annotations

import dataclasses
import json
import types

import pytest

from captionrl import cli
from captionrl.cli import main


def _lines(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _one_line_error(capsys, *needles):
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: DataError:") or err.startswith("error: ConfigError:"), err
    for n in needles:
        assert n in err, (n, err)
    return err


def _row(i):
    return {"id": f"s{i}", "series": [float(i), 2.0, 3.0, 4.0], "caption": f"item {i}", "next": [1.0, 2.0]}


def test_bottleneck_caption_file_with_a_malformed_middle_line_stops_with_file_and_line(tmp_path, capsys):
    f = _lines(tmp_path / "caps.jsonl", [_row(0), '{"id": "s1", "series": [1, 2', _row(2)])
    assert main(["eval", "bottleneck", "--captions", str(f), "--out", str(tmp_path / "o")]) == 2
    _one_line_error(capsys, "caps.jsonl:line 2", "not valid JSON", "Fix:")


def test_identify_caption_file_that_is_not_utf8_is_a_named_error(tmp_path, capsys):
    f = tmp_path / "caps.jsonl"
    f.write_bytes(json.dumps(_row(0)).encode() + b"\n" + json.dumps(_row(1)).replace("item", "caf\u00e9").encode("latin-1") + b"\n")
    assert main(["eval", "identify", "--captions", str(f), "--out", str(tmp_path / "o")]) == 2
    _one_line_error(capsys, "caps.jsonl:line 2", "not UTF-8")


def test_identify_caption_file_with_a_repeated_id_names_id_and_both_lines(tmp_path, capsys):
    f = _lines(tmp_path / "caps.jsonl", [_row(0), _row(1), _row(0)])
    assert main(["eval", "identify", "--captions", str(f), "--out", str(tmp_path / "o")]) == 2
    _one_line_error(capsys, "caps.jsonl:line 3.id='s0'", "line 1")


def test_pairwise_caption_file_with_a_repeated_id_is_refused(tmp_path, capsys):
    a = _lines(tmp_path / "a.jsonl", [{"id": "x", "caption": "one"}, {"id": "x", "caption": "two"}])
    b = _lines(tmp_path / "b.jsonl", [{"id": "x", "caption": "three"}])
    assert main(["eval", "pairwise", "--captions", str(a), str(b), "--out", str(tmp_path / "o")]) == 2
    _one_line_error(capsys, "a.jsonl:line 2.id='x'", "line 1")


def test_a_config_that_is_not_utf8_is_a_named_error(tmp_path):
    from captionrl.config import load_yaml
    from captionrl.errors import ConfigError

    p = tmp_path / "c.yaml"
    p.write_bytes("seed: 1\nname: caf\u00e9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_yaml(p)


def test_a_bug_keeps_its_traceback(monkeypatch):
    @dataclasses.dataclass
    class NoSettings:
        """A command without settings."""

    fake = types.SimpleNamespace(CONFIG=NoSettings, run_command=lambda cfg: {}["missing"])
    monkeypatch.setattr(cli.importlib, "import_module", lambda name: fake)
    with pytest.raises(KeyError):
        main(["report"])
