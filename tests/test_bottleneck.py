"""Information bottleneck on real embedded series with describer captions and the MiniLM encoder."""

from __future__ import annotations

import json

import numpy as np
import pytest

from captionrl.errors import ConfigError, DataError
from captionrl.eval import bottleneck as bn


@pytest.fixture(scope="module")
def small_study():
    return bn.embedded_study(["co2", "elnino"], length=16, horizon=8, max_windows=80)


@pytest.mark.slow
def test_describer_beats_controls_and_controls_match_naive(small_study, tmp_path):
    cfg = bn.BottleneckConfig(tasks=["reconstruct"], seeds=[0, 1])
    cfg = bn.BottleneckConfig(tasks=["reconstruct"], seeds=[0, 1], out=str(tmp_path), quiet=True)
    summary = bn.run(cfg, study=small_study)
    rows = {r["system"]: r for r in summary.rows}
    for corpus in ("co2", "elnino"):
        col = bn.column("reconstruct", corpus)
        naive, desc = rows[bn.NAIVE][col], rows[bn.DESCRIBER][col]
        empty, shuf = rows[bn.EMPTY][col], rows[bn.SHUFFLED][col]
        assert desc < 0.6 * min(empty, shuf), (corpus, desc, empty, shuf)
        for control in (empty, shuf):  # a caption that carries nothing is as good as the mean window
            assert abs(control / naive - 1) < 0.15, (corpus, control, naive)
    assert summary.protocol == "bottleneck" and "reconstruct:co2" in summary.columns
    assert (tmp_path / "table.md").read_text().count("|") > 10
    assert (tmp_path / "bottleneck.png").stat().st_size > 1000


def test_interrupted_run_resumes_without_recomputing(small_study, tmp_path):
    cfg = bn.BottleneckConfig(tasks=["reconstruct", "forecast"], seeds=[0, 1], head="ridge", out=str(tmp_path), quiet=True)
    calls = []

    def counting(*a, **kw):
        calls.append(a[-1])
        if len(calls) == 5:
            raise KeyboardInterrupt  # the run dies mid-way
        return bn.fit_predict(*a, **kw)

    with pytest.raises(KeyboardInterrupt):
        bn.run(cfg, study=small_study, fit=counting)
    done = len([ln for ln in (tmp_path / "records.jsonl").read_text().splitlines() if ln.strip()])
    total = 3 * 2 * 2 * 2  # systems x tasks x corpora x seeds
    assert done == 4 + 4  # 4 naive records + 4 finished fits
    calls.clear()
    first = bn.run(cfg, study=small_study, fit=lambda *a, **kw: (calls.append(1), bn.fit_predict(*a, **kw))[1])
    assert len(calls) == total - 4
    calls.clear()
    again = bn.run(cfg, study=small_study, fit=lambda *a, **kw: (calls.append(1), bn.fit_predict(*a, **kw))[1])
    assert calls == [] and again.rows == first.rows
    cfg3 = bn.BottleneckConfig(tasks=["reconstruct", "forecast"], seeds=[0, 1, 2], head="ridge", out=str(tmp_path),
                               quiet=True)
    bn.run(cfg3, study=small_study, fit=lambda *a, **kw: (calls.append(1), bn.fit_predict(*a, **kw))[1])
    assert len(calls) == total // 2  # only the new seed


def _write_items(path, windows, with_next=True, caption=None):
    from captionrl.domains.describe import describe_series

    with open(path, "w") as f:
        for w in windows:
            rec = {"id": w.id, "series": w.values.tolist(), "caption": caption or describe_series(w)}
            if with_next:
                rec["next"] = w.meta["next"]
            f.write(json.dumps(rec) + "\n")


def test_cli_on_user_files_compares_captioners(tmp_path):
    from captionrl.cli import main
    from captionrl.domains.corpora import load_embedded_corpus
    from captionrl.domains.timeseries import window

    wins = window(load_embedded_corpus(["elnino"])[0], 16, stride=8, next_length=8)
    _write_items(tmp_path / "honest.jsonl", wins)
    _write_items(tmp_path / "vague.jsonl", wins, caption="A time series.")
    rc = main(["eval", "bottleneck", "--captions", str(tmp_path / "honest.jsonl"), f"vague={tmp_path / 'vague.jsonl'}",
               "--out", str(tmp_path / "out"), "--seeds", "0", "1", "--head", "ridge", "--quiet", "--reference", "honest"])
    assert rc == 0
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    rows = {r["system"]: r for r in s["rows"]}
    assert set(rows) == {"naive", "honest", "vague", "empty caption", "shuffled caption"}
    assert rows["honest"]["reconstruct:Rel."] == pytest.approx(1.0)
    assert rows["vague"]["reconstruct:Rel."] > 1.0  # a caption with no facts carries less
    assert len(rows["honest"]["per_seed"]["forecast:all"]) == 2
    # Without 'next' only reconstruction runs.
    _write_items(tmp_path / "nonext.jsonl", wins, with_next=False)
    assert main(["eval", "bottleneck", "--captions", str(tmp_path / "nonext.jsonl"), "--out", str(tmp_path / "o2"),
                 "--seeds", "0", "--head", "ridge", "--quiet", "--no-controls"]) == 0
    s2 = json.loads((tmp_path / "o2" / "summary.json").read_text())
    assert s2["columns"] == ["reconstruct:all"]


def test_bad_inputs_fail_with_field_and_fix(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "a", "series": [1, 2, 3]}) + "\n")
    cfg = bn.BottleneckConfig()
    with pytest.raises(DataError, match="caption"):
        bn.load_caption_files(bn.parse_captions_arg([str(bad)]), cfg)
    bad.write_text(json.dumps({"id": "a", "series": [1, "x"], "caption": "c"}) + "\n")
    with pytest.raises(DataError, match="series"):
        bn.load_caption_files(bn.parse_captions_arg([str(bad)]), cfg)
    with pytest.raises(ConfigError, match="repeat"):
        bn.parse_captions_arg([str(bad), str(bad)])
    with pytest.raises(ConfigError, match="head"):
        bn.BottleneckConfig(head="forest")
    with pytest.raises(DataError, match="not found"):
        bn.parse_captions_arg([str(tmp_path / "missing.jsonl")])


def test_naive_baselines_are_persistence_and_mean_window():
    items = [bn.Item(f"i{k}", "c", np.arange(4.0) + k, np.full(2, 10.0 + k), "train" if k < 6 else "test")
             for k in range(8)]
    (c,) = bn._corpora(items)
    fc = bn.naive_predictions(c, "forecast")
    assert np.allclose(fc[0] * c.std + c.mean, [9.0, 9.0])  # item 6's last value is 3 + 6
    rec = bn.naive_predictions(c, "reconstruct") * c.std + c.mean
    assert np.allclose(rec[0], np.arange(4.0) + 2.5)  # mean of offsets 0..5
