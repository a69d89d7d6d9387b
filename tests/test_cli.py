"""The command line: help, errors as messages (not tracebacks), `models`, and `eval identify` end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from captionrl.cli import main


def test_help_lists_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for word in ("train", "eval", "models", "report"):
        assert word in out


def test_user_errors_are_one_line_messages(tmp_path, capsys):
    rc = main(["eval", "identify", "--captions", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o")])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "Fix:" in err


@pytest.mark.slow
def test_models_prints_name_parameters_and_load_time():
    out = subprocess.run([sys.executable, "-m", "captionrl.cli", "models", "--json"], capture_output=True, text=True,
                         check=True, timeout=600).stdout
    info = json.loads(out)
    assert info["embedded"]["name"] == "SmolLM2-135M-Instruct"
    assert info["embedded"]["parameters"] == 134_515_008
    assert info["embedded"]["load_s"] > 0
    assert {"hf", "openai", "vllm"} <= set(info["backends"])


@pytest.mark.slow
def test_eval_identify_on_a_user_file_resumes(tmp_path, embedded_backend, monkeypatch):
    """The simplest call on a user's own file: tables written, controls at chance, rerun adds nothing."""
    import numpy as np

    from captionrl.domains.describe import describe_series

    rng = np.random.default_rng(0)
    path = tmp_path / "items.jsonl"
    with path.open("w") as f:
        for i in range(6):
            values = np.cumsum(rng.normal(size=16)).round(2) + 10 * i
            f.write(json.dumps({"id": f"s{i}", "series": values.tolist(), "caption": describe_series(values)}) + "\n")
    monkeypatch.setattr("captionrl.eval.identification.backend_from_spec", lambda spec: embedded_backend)
    out = tmp_path / "ident"
    args = ["eval", "identify", "--captions", f"mine={path}", "--out", str(out), "--direction", "c2s", "--k", "3"]
    assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    rows = {r["system"]: r for r in summary["rows"]}
    assert rows["mine"]["c2s"] > 0.6
    assert rows["mine/empty"]["c2s"] == pytest.approx(1 / 3, abs=1e-4)  # all candidates tie: exactly chance
    assert "| system | mode | K |" in (out / "table.md").read_text()
    n = len((out / "records.jsonl").read_text().splitlines())
    assert main(args) == 0
    assert len((out / "records.jsonl").read_text().splitlines()) == n


def test_caption_command_writes_jsonl_and_resumes(tmp_path):
    out = tmp_path / "caps.jsonl"
    args = ["caption", "--captioner", "describer", "--max-items", "3", "--out", str(out)]
    assert main(args) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 3 and all(r["caption"].startswith("The series has 24 points") for r in lines)
    assert main(args) == 0  # resumed: nothing appended
    assert len(out.read_text().splitlines()) == 3
