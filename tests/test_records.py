"""Records: JSONL that survives a killed writer and resumes by key."""

from __future__ import annotations

import json
import math

import pytest

from captionrl.errors import DataError
from captionrl.records import RecordWriter, read_jsonl, write_json


def test_resume_skips_written_keys_and_repairs_a_torn_last_line(tmp_path):
    path = tmp_path / "records.jsonl"
    with RecordWriter(path) as w:
        w.write({"key": "a", "score": 1.0})
        w.write({"key": "b", "score": None})
    with path.open("a") as f:  # a writer killed mid-line
        f.write('{"key": "c", "sco')
    w = RecordWriter(path)
    assert w.done_keys == {"a", "b"}
    assert not w.has("c")
    w.write({"key": "c", "score": 0.5})
    w.close()
    lines = path.read_text().splitlines()
    assert [json.loads(x)["key"] for x in lines] == ["a", "b", "c"]


def test_nan_scores_are_written_as_null_and_write_many_is_one_batch(tmp_path):
    path = tmp_path / "r.jsonl"
    with RecordWriter(path) as w:
        w.write_many([{"key": str(i), "score": math.nan if i == 1 else i} for i in range(3)])
    recs = list(read_jsonl(path))
    assert [r["score"] for r in recs] == [0, None, 2]
    with pytest.raises(KeyError, match="key"):
        RecordWriter(path).write({"score": 1})


def test_write_json_is_atomic_and_readable(tmp_path):
    write_json(tmp_path / "s" / "summary.json", {"x": float("inf"), "rows": [1]})
    assert json.loads((tmp_path / "s" / "summary.json").read_text()) == {"x": None, "rows": [1]}
    assert not list((tmp_path / "s").glob("*.tmp"))


# ---------------------------------------------------------------------- the strict reader
def test_a_malformed_middle_line_is_an_error_naming_file_line_and_fix(tmp_path):
    path = tmp_path / "caps.jsonl"
    path.write_text('{"id": "a"}\n{"id": "b", oops}\n{"id": "c"}\n')
    with pytest.raises(DataError, match=r"caps\.jsonl:line 2.*not valid JSON.*Fix:"):
        list(read_jsonl(path))


def test_a_torn_last_line_is_an_error_in_a_user_file_but_tolerated_once_in_an_appended_one(tmp_path, caplog):
    path = tmp_path / "r.jsonl"
    path.write_text('{"key": "a"}\n{"key": "b", "sco')
    with pytest.raises(DataError, match=r"r\.jsonl:line 2"):
        list(read_jsonl(path))
    assert [r["key"] for r in read_jsonl(path, appended=True)] == ["a"]
    err = "\n".join(caplog.messages)  # a warning: shown even where nobody configured logging
    assert err.count("r.jsonl:line 2") == 1 and "unfinished last line" in err
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    # a bad line that is not the last is an error even in an appended file
    path.write_text('{"key": "a", \n{"key": "b"}\n')
    with pytest.raises(DataError, match=r"r\.jsonl:line 1"):
        RecordWriter(path)


def test_a_complete_last_line_without_newline_is_kept(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"id": "a"}\n\n{"id": "b"}')
    assert [r["id"] for r in read_jsonl(path)] == ["a", "b"]


def test_a_missing_file_is_an_error_unless_the_project_appends_to_it(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        read_jsonl(tmp_path / "nope.jsonl")
    with pytest.raises(DataError, match="folder"):
        read_jsonl(tmp_path)
    assert list(read_jsonl(tmp_path / "nope.jsonl", appended=True)) == []
    assert RecordWriter(tmp_path / "new.jsonl").done_keys == set()


def test_non_utf8_bytes_and_non_objects_are_named_errors(tmp_path):
    path = tmp_path / "latin.jsonl"
    path.write_bytes('{"id": "a", "caption": "ok"}\n{"id": "b", "caption": "caf\u00e9"}\n'.encode("latin-1"))
    with pytest.raises(DataError, match=r"latin\.jsonl:line 2.*not UTF-8.*0xe9.*UTF-8"):
        list(read_jsonl(path))
    path.write_text('{"id": "a"}\n[1, 2]\n')
    with pytest.raises(DataError, match=r":line 2.*JSON list, not an object"):
        list(read_jsonl(path))
    path.write_bytes(b'\xef\xbb\xbf{"id": "bom"}\n')  # a byte-order mark is not an error
    assert list(read_jsonl(path)) == [{"id": "bom"}]


def test_a_repeated_id_names_the_id_and_both_lines(tmp_path):
    path = tmp_path / "caps.jsonl"
    path.write_text('{"id": "x", "caption": "1"}\n{"id": "y", "caption": "2"}\n{"id": "x", "caption": "3"}\n')
    assert len(list(read_jsonl(path))) == 3  # without unique_key repeats are the caller's business
    with pytest.raises(DataError, match=r"caps\.jsonl:line 3\.id='x': repeats the id of line 1.*lines 1 and 3"):
        list(read_jsonl(path, unique_key="id"))


def test_run_logs_are_read_as_appended_files(tmp_path):
    """metrics.jsonl / samples of a killed run: the torn tail is tolerated, missing samples are none."""
    from captionrl.train.run.curves import load_metrics
    from captionrl.train.run.logging import load_samples

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n{"step": 2, "rew')
    assert [m["step"] for m in load_metrics(tmp_path / "metrics.jsonl")] == [1]
    assert load_samples(tmp_path / "empty") == []
