"""``captionrl moco records``: the multi-role SFT records from teachers, schema-checked and resumable.

Scripted backends (fakes for the parse and error paths) reply per request; the real path (teachers over
HTTP, then ``train moco-sft`` on the records) is the MoCo rehearsal (tests/test_rehearsal_moco.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from captionrl.backends.base import Generation
from captionrl.cli import main
from captionrl.config import load_config
from captionrl.errors import ConfigError
from captionrl.records import read_jsonl
from captionrl.train.moco_records import MocoRecordsConfig, build_records
from captionrl.train.moco_sft import RoleRecords, build_multirole_rows

SERVER = {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"}
RUBRIC = [{"criterion": "Names the shapes", "test": "Yes if the shapes are named.", "weight": 3},
          {"criterion": "Gives the colours", "test": "Yes if colours are given.", "weight": 2},
          {"criterion": "Counts the shapes", "test": "Yes if counts are given.", "weight": 1}]
JUDGED = json.dumps([{"id": i, "reason": "ok", "decision": d} for i, d in ((1, "yes"), (2, "no"), (3, "yes"))])


class Scripted:
    """Replies by a rule on the request (a fake for parse/error paths); keeps every request."""

    def __init__(self, name, rule):
        self.name, self.rule, self.requests = name, rule, []

    def generate(self, requests):
        self.requests.extend(requests)
        return [Generation(text=self.rule(r)) if self.rule(r) is not None else Generation(None, error="down")
                for r in requests]


def _text(req) -> str:
    c = req.messages[-1]["content"]
    return c if isinstance(c, str) else " ".join(p.get("text", "") for p in c)


def _cfg(tmp_path, *extra):
    return load_config(MocoRecordsConfig, None, [
        f"out_dir={tmp_path / 'rec'}", "data.n_train=2", "data.image_size=96", "samples=2", "max_attempts=2",
        f"teachers=[{json.dumps(SERVER)}]", f"writer={json.dumps(SERVER)}", *extra])


@pytest.mark.parametrize(("override", "field"), [
    ("teachers=[]", "teachers"), ("structured_output=grammar", "structured_output"),
    ("image_text=caption", "image_text"), ("min_items=11", "min_items"), ("samples=0", "samples"),
    ("teachers=[{kind: openai, model: m}]", "backend.base_url"),
])
def test_bad_settings_name_the_field(tmp_path, override, field):
    with pytest.raises(ConfigError) as exc:
        _cfg(tmp_path, override)
    assert exc.value.field.endswith(field)


def test_records_are_what_moco_sft_reads_and_bad_replies_are_recorded_skips(tmp_path):
    cfg = _cfg(tmp_path)
    teacher = Scripted("teacher", lambda r: "Two red circles and a blue square.")
    # the writer's greedy reply is malformed, its sampled retry parses
    writer = Scripted("writer", lambda r: "not json" if r.temperature == 0 else json.dumps(RUBRIC))
    judge = Scripted("judge", lambda r: JUDGED if "Caption:" in _text(r) else None)
    s = build_records(cfg, [teacher], writer, judge)
    out = Path(cfg.out_dir)
    assert s["records"] == {"captions": 4, "rubrics": 2, "judgments": 4}
    assert s["rejected_this_run"] == {} and s["rejected_total"] == {}
    rub = list(read_jsonl(out / "rubrics.jsonl"))
    assert all(r["attempts"] == 2 and r["raws"][0] == "not json" for r in rub), "the failed first attempt is kept"
    assert all(len(r["references"]) == 2 and len(r["candidate_ids"]) == 2 for r in rub)
    assert all(Path(r["image"]).is_file() for r in read_jsonl(out / "captions.jsonl"))
    # the writer saw the image, the two references and the candidates; the judge saw no image
    assert any(p.get("type") == "image" and p.get("image") is not None for p in writer.requests[0].messages[0]["content"])
    assert all(isinstance(r.messages[0]["content"], str) for r in judge.requests)
    recs = RoleRecords.from_files(out / "captions.jsonl", out / "rubrics.jsonl", out / "judgments.jsonl")
    rows = build_multirole_rows(recs, with_images=True)
    assert sorted(r["role"] for r in rows).count("judge") == 4 and len(rows) == 4 + 2 + 4
    assert rows[-1]["completion"][0]["content"].startswith('[{"id": 1')

    # rerun: every record is done, no backend is asked again
    n = [len(b.requests) for b in (teacher, writer, judge)]
    s2 = build_records(cfg, [teacher], writer, judge)
    assert [len(b.requests) for b in (teacher, writer, judge)] == n and s2["written_this_run"] == {}


def test_malformed_teacher_replies_are_counted_and_retried_on_resume(tmp_path):
    cfg = _cfg(tmp_path, "data.n_train=1")
    teacher = Scripted("teacher", lambda r: "A caption." if r.seed % 2 else "   ")  # some samples come back empty
    state = {"writer_ok": False, "judge_ok": False}
    writer = Scripted("writer", lambda r: json.dumps(RUBRIC) if state["writer_ok"] else '[{"criterion": "..."}]')
    judge = Scripted("judge", lambda r: JUDGED if state["judge_ok"] else json.dumps([{"id": 1, "decision": "maybe"}]))
    s = build_records(cfg, [teacher], writer, judge)
    empty = sum(1 for r in teacher.requests if r.seed % 2 == 0)
    assert empty == 1, "the seeds are stable: one of the two samples is the empty one"
    assert s["records"]["captions"] == 2 - empty and s["records"]["rubrics"] == 0
    rejected = list(read_jsonl(Path(cfg.out_dir) / "rejected.jsonl"))
    assert s["rejected_this_run"].get("caption", 0) == empty and s["rejected_this_run"].get("rubric") == 1
    rub = next(r for r in rejected if r["role"] == "rubric")
    assert len(rub["raws"]) == 2 and "attempt 2" in rub["errors"][-1], "every attempt's reply and error is kept"

    state["writer_ok"] = True
    s2 = build_records(cfg, [teacher], writer, judge)
    assert s2["records"]["rubrics"] == 1 and s2["records"]["judgments"] == 0
    assert s2["rejected_this_run"]["judgment"] == s2["records"]["captions"]
    state["judge_ok"] = True
    s3 = build_records(cfg, [teacher], writer, judge)
    assert s3["records"]["judgments"] == s3["records"]["captions"]
    assert s3["rejected_this_run"] == ({"caption": empty} if empty else {}), "an empty sample is asked again, same seed"
    assert sum(s3["rejected_total"].values()) == len(list(read_jsonl(Path(cfg.out_dir) / "rejected.jsonl")))


def test_image_text_mode_sends_no_image_and_records_the_text(tmp_path):
    cfg = _cfg(tmp_path, "data.n_train=1", "samples=1", "image_text=references", "structured_output=json_object",
               "n_candidates=1")
    teacher = Scripted("teacher", lambda r: "A caption.")
    writer = Scripted("writer", lambda r: json.dumps(RUBRIC))
    judge = Scripted("judge", lambda r: JUDGED)
    build_records(cfg, [teacher], writer, judge)
    assert all(isinstance(r.messages[0]["content"], str) and "Image (described in text)" in r.messages[0]["content"]
               for r in teacher.requests + writer.requests)
    assert writer.requests[0].response_format["schema"]["minItems"] == 3
    assert judge.requests[0].response_format["schema"]["maxItems"] == 3
    cap = next(iter(read_jsonl(Path(cfg.out_dir) / "captions.jsonl")))
    assert cap["image_text"] and cap["image_text"] in teacher.requests[0].messages[0]["content"]


def test_cli_check_validates_without_models(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CAPTIONRL_FORBID_MODEL_CALLS", "1")
    rc = main(["moco", "records", "check=true", f"out_dir={tmp_path / 'r'}", "data.n_train=3", "data.image_size=96",
               f"teachers=[{json.dumps(SERVER)}]", f"writer={json.dumps(SERVER)}"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["captions_to_ask"] == 3 * 2


def test_shipped_config_loads_with_the_data_section_of_train_moco():
    from captionrl.train import moco

    root = Path(__file__).resolve().parents[1]
    cfg = load_config(MocoRecordsConfig, root / "configs" / "moco-records.yaml")
    paper = load_config(moco.CONFIG, root / "configs" / "moco-paper.yaml")
    assert type(cfg.data) is type(paper.data) and cfg.n_candidates == paper.rubric.n_candidates == 4
    assert cfg.structured_output == "json_schema" and len(cfg.teachers) * cfg.samples == 4
