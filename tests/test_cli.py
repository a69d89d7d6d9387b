"""The command line: help, errors as messages (not tracebacks), `models`, and `eval identify` end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from captionrl.cli import COMMANDS, main


def test_help_lists_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for word in ("train", "eval", "models", "report"):
        assert word in out


@pytest.mark.parametrize("group", sorted({words[0] for words in COMMANDS if len(words) > 1}))
def test_every_command_group_help_prints(group, capsys):
    """A group's --help lists its subcommands with their help, which may contain a literal '%'."""
    with pytest.raises(SystemExit) as exit_info:
        main([group, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for words, (_module, help_text) in COMMANDS.items():
        if words[0] == group and len(words) > 1:
            assert words[1] in out
            assert help_text.split()[0] in out
    if group == "eval":
        with pytest.raises(SystemExit):
            main(["eval", "recheck", "--help"])
        assert "95% interval" in capsys.readouterr().out.replace("\n", " ")


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
    args = ["caption", "--captioner", "describer", "--limit", "3", "--out", str(out)]
    assert main(args) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 3 and all(r["caption"].startswith("The series has 24 points") for r in lines)
    assert main(args) == 0  # resumed: nothing appended
    assert len(out.read_text().splitlines()) == 3


def test_every_converted_command_help_lists_every_field_with_its_default(capsys):
    """--help is generated from the command's CONFIG: each field's flag (or dotted key), help and default."""
    import importlib

    from captionrl.cli import COMMANDS
    from captionrl.config import describe

    checked = 0
    for words, (module_name, _) in COMMANDS.items():
        module = importlib.import_module(module_name)
        if not hasattr(module, "CONFIG"):
            continue  # a legacy add_arguments/main module (being converted on another branch)
        with pytest.raises(SystemExit):
            main([*words, "--help"])
        text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
        assert "--config FILE.yaml" in text and "KEY=VALUE" in text, words
        for key, default, help_text in describe(module.CONFIG):
            flag = "--" + key.replace("_", "-")
            assert flag in text or key in text, (words, key)
            assert " ".join(help_text.split()[:3]) in text, (words, key)
            assert default == "(required)" or f"(default: {default})" in text, (words, key, default)
        checked += 1
    assert checked >= 13  # models, caption, rubrics build, report and the nine eval commands


def test_eval_command_takes_config_file_and_key_value_overrides(tmp_path):
    """YAML file, then --flags, then key=value words; the resolved config lands in summary.json."""
    (tmp_path / "human.jsonl").write_text("".join(json.dumps({"id": i, "label": lab}) + "\n"
                                                  for i, lab in enumerate(["A", "B", "A", "tie"])))
    (tmp_path / "j.jsonl").write_text("".join(json.dumps({"id": i, "decision": d}) + "\n"
                                              for i, d in enumerate(["A", "B", "B", None])))
    cfg = tmp_path / "agreement.yaml"
    cfg.write_text(f"labels: {tmp_path / 'human.jsonl'}\njudges: ['j={tmp_path / 'j.jsonl'}']\n"
                   f"out: {tmp_path / 'from-file'}\nseed: 3\n")
    assert main(["eval", "agreement", "--config", str(cfg), f"out={tmp_path / 'from-word'}", "--seed", "5"]) == 0
    assert not (tmp_path / "from-file").exists()
    summary = json.loads((tmp_path / "from-word" / "summary.json").read_text())
    assert summary["config"]["seed"] == 5 and summary["config"]["out"] == str(tmp_path / "from-word")
    row = summary["rows"][0]
    assert row["system"] == "j" and row["exact"] == pytest.approx(2 / 3) and row["invalid"] == 1
    assert summary["better"]["kappa"] == "higher" and summary["records"].endswith("records.jsonl")
    assert (tmp_path / "from-word" / "table.html").read_text().count("<tr>") == 2


def test_bad_settings_and_the_removed_backend_form_are_one_line_errors(tmp_path, capsys):
    assert main(["eval", "pairwise", f"out={tmp_path}", "judgee=hf:embedded"]) == 2
    assert "did you mean 'judge'" in capsys.readouterr().err
    assert main(["eval", "qa", "--answerer", "hf:embedded,bfloat16", "--out", str(tmp_path)]) == 2
    assert "not key=value" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the old `--backend kind=hf model=embedded` form is gone
        main(["eval", "pairwise", "--backend", "kind=hf", "model=embedded"])


def test_report_reads_run_dirs_as_bare_words(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "summary.json").write_text(json.dumps(
        {"protocol": "qa", "rows": [{"system": "a", "accuracy": 0.5}, {"system": "b", "accuracy": 0.7}],
         "columns": ["accuracy"], "better": {"accuracy": "higher"}}))
    assert main(["report", str(tmp_path / "run"), "--out", str(tmp_path / "rep")]) == 0
    assert "| b | **0.7000** |" in (tmp_path / "rep" / "report.md").read_text()


def test_library_messages_go_once_to_the_current_stderr_and_results_stay_on_stdout(capsys):
    """``main`` shows the library's logged progress on stderr as plain lines, however often it runs."""
    import logging

    from captionrl.cli import configure_logging

    configure_logging()
    configure_logging()  # a second command in the same process: no second handler
    logging.getLogger("captionrl.train.run.skeleton").info("resuming from run/checkpoint-1")
    logging.getLogger("captionrl.records").warning("note: r.jsonl:line 2: ignoring the unfinished last line")
    got = capsys.readouterr()  # a fresh sys.stderr per test: the handler must follow it
    assert got.err == "resuming from run/checkpoint-1\nnote: r.jsonl:line 2: ignoring the unfinished last line\n"
    assert got.out == ""
    logging.getLogger("another_library").info("not ours")  # other libraries' levels are untouched
    assert capsys.readouterr().err == ""


def test_library_code_logs_and_only_a_command_prints_its_product():
    """``print`` appears only in a command's ``run_command`` (its table or summary on stdout) and in the
    command line's ``main``: everything else reports through ``logging``, so a host application decides
    what to show and ``captionrl ... --json | jq`` reads only the product."""
    import ast
    from pathlib import Path

    import captionrl

    stray = []
    for path in sorted(Path(captionrl.__file__).parent.rglob("*.py")):
        def visit(node: ast.AST, function: str | None, path: Path = path) -> None:
            for child in ast.iter_child_nodes(node):
                inner = function
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and function not in ("run_command", "main"):
                    inner = child.name
                if (isinstance(child, ast.Call) and isinstance(child.func, ast.Name) and child.func.id == "print"
                        and inner not in ("run_command", "main")):
                    stray.append(f"{path.name}:{child.lineno} in {inner}")
                visit(child, inner)

        visit(ast.parse(path.read_text(encoding="utf-8")), None)
    assert not stray, f"print outside a command's run_command (log instead, or return text): {stray}"


def test_the_item_count_is_limit_in_every_command_and_max_items_is_refused_by_name(tmp_path, capsys):
    """``limit`` is how many items a command captions or evaluates; the old ``max_items`` of ``caption``,
    ``eval identify`` and ``eval paper`` fails with the new name, before any model loads."""
    for words in (["caption"], ["eval", "identify"], ["eval", "paper"]):
        assert main([*words, "max_items=3", f"out={tmp_path / 'o'}"]) == 2, words
        err = capsys.readouterr().err
        assert "max_items=3: was renamed to limit" in err and "write limit=3" in err, (words, err)
