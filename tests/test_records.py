"""Records: JSONL that survives a killed writer and resumes by key."""

from __future__ import annotations

import json
import math

import pytest

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
