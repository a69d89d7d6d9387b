"""Distractor mining on the embedded corpus: determinism, prefix consistency, overlap, nearness, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from captionrl.cli import main as cli_main
from captionrl.domains.candidates import (
    CandidateSet,
    candidate_series,
    load_candidate_file,
    mine_candidates,
    mine_candidates_naive,
    save_candidates,
)
from captionrl.domains.corpora import load_embedded_corpus
from captionrl.domains.timeseries import window
from captionrl.errors import ConfigError, DataError
from captionrl.types import Series

L = 32


@pytest.fixture(scope="module")
def windows() -> list[Series]:
    """Every stride-4 window of length 32 of the embedded corpus (1,439 windows, 6 domains)."""
    return [w for s in load_embedded_corpus() for w in window(s, L, 4)]


@pytest.fixture(scope="module")
def nearest8(windows) -> list[CandidateSet]:
    return mine_candidates(windows, windows, k=8, seed=0, progress=False)


@pytest.fixture(scope="module")
def random8(windows) -> list[CandidateSet]:
    return mine_candidates(windows, windows, k=8, rule="random", seed=0, progress=False)


def _overlap(a: Series, b: Series) -> float:
    if (a.source or a.id) != (b.source or b.id):
        return 0.0
    return max(0, min(a.end, b.end) - max(a.start, b.start)) / len(a)


def test_deterministic(windows, nearest8, random8):
    again = mine_candidates(windows, windows, k=8, seed=0, progress=False)
    assert [c.distractor_ids for c in again] == [c.distractor_ids for c in nearest8]
    r_again = mine_candidates(windows, windows, k=8, rule="random", seed=0, progress=False)
    assert [c.distractor_ids for c in r_again] == [c.distractor_ids for c in random8]
    r_other = mine_candidates(windows, windows, k=8, rule="random", seed=1, progress=False)
    assert sum(a.distractor_ids != b.distractor_ids for a, b in zip(r_other, random8, strict=True)) > len(windows) // 2
    # an item's distractors do not depend on which other items are mined with it
    sub = mine_candidates(windows[::7], windows, k=8, rule="random", seed=0, progress=False)
    assert [c.distractor_ids for c in sub] == [c.distractor_ids for c in random8[::7]]


@pytest.mark.parametrize("rule", ["nearest", "random"])
def test_prefix_consistent_across_k(windows, nearest8, random8, rule):
    big = nearest8 if rule == "nearest" else random8
    for k in (2, 4, 6):
        small = mine_candidates(windows, windows, k=k, rule=rule, seed=0, progress=False)
        assert [c.distractor_ids for c in small] == [c.distractor_ids[: k - 1] for c in big]
        assert [c.distractor_ids for c in small] == [c.prefix(k).distractor_ids for c in big]


@pytest.mark.parametrize("max_overlap", [0.0, 0.5])
def test_overlap_limit_respected(windows, max_overlap):
    by_id = {w.id: w for w in windows}
    sets = mine_candidates(windows, windows, k=6, seed=0, max_overlap=max_overlap, progress=False)
    worst = 0.0
    for cs in sets:
        lineup = candidate_series(cs, by_id)
        assert cs.item_id not in cs.distractor_ids and len(set(cs.distractor_ids)) == 5
        for i, a in enumerate(lineup):
            for b in lineup[i + 1:]:
                ov = _overlap(a, b)
                assert ov <= max_overlap, (cs.item_id, a.id, b.id, ov)
                worst = max(worst, ov)
    if max_overlap == 0.5:  # stride 4 allows half-overlapping neighbours, and nearest takes them
        assert worst == 0.5


def test_nearer_than_random(nearest8, random8):
    dn = np.array([c.distances for c in nearest8])
    dr = np.array([c.distances for c in random8])
    # both rules obey the same exclusions, so the nearest rule's first pick is the nearest eligible window
    assert (dn[:, 0] <= dr.min(axis=1) + 1e-12).all()
    assert (np.diff(dn, axis=1) >= -1e-12).all()  # nearest first
    assert np.median(dn) < 0.25 * np.median(dr)


def test_fast_path_equals_naive_scan(windows):
    sub = windows[::23]
    for kw in ({"k": 6}, {"k": 5, "max_overlap": 0.5}, {"k": 4, "mutual": False}):
        fast = mine_candidates(sub, windows, seed=3, progress=False, **kw)
        naive = mine_candidates_naive(sub, windows, seed=3, **kw)
        assert [c.distractor_ids for c in fast] == [c.distractor_ids for c in naive]
        np.testing.assert_allclose([c.distances for c in fast], [c.distances for c in naive], rtol=1e-12)


def test_duplicate_values_never_distractors(windows):
    target = windows[100]
    twin = Series(id="twin", values=target.values.copy(), source="copy", domain=target.domain)
    pool = [*windows, twin]
    sets = mine_candidates([target, twin], pool, k=8, seed=0, progress=False)
    assert "twin" not in sets[0].distractor_ids and target.id not in sets[1].distractor_ids


def test_items_outside_pool(windows):
    train = [w for w in windows if w.source != "nile"]
    nile = [w for w in windows if w.source == "nile"]
    sets = mine_candidates(nile, train, k=4, seed=0, progress=False)
    assert len(sets) == len(nile) and all(not d.startswith("nile") for cs in sets for d in cs.distractor_ids)


def test_length_mismatch_raises(windows):
    other = window(load_embedded_corpus(["nile"])[0], 16)[0]
    with pytest.raises(DataError, match="length differs from the pool's 32") as exc:
        mine_candidates([other], windows, k=4, progress=False)
    assert exc.value.field == "items[0] (nile@0)"
    with pytest.raises(DataError, match="pool\\[1\\]"):
        mine_candidates(windows[:1], [windows[0], other], k=2, progress=False)


def test_pool_too_small_raises(windows):
    nile = [w for w in windows if w.source == "nile"]  # 18 windows, all of one source, stride 4
    with pytest.raises(DataError, match="eligible distractor"):
        mine_candidates(nile, nile, k=8, progress=False)
    with pytest.raises(DataError, match="eligible distractor"):
        mine_candidates(nile, nile, k=8, rule="random", progress=False)


@pytest.mark.parametrize(("kw", "field"), [({"rule": "farthest"}, "rule"), ({"k": 1}, "k"),
                                           ({"max_overlap": 1.5}, "max_overlap"), ({"stats": ["mean", "bogus"]}, "stats")])
def test_bad_settings_raise_config_error(windows, kw, field):
    with pytest.raises(ConfigError) as exc:
        mine_candidates(windows[:10], windows, **{"k": 4, **kw}, progress=False)
    assert exc.value.field == field


def test_jsonl_roundtrip_and_resume(nearest8, windows, tmp_path):
    by_id = {w.id: w for w in windows}
    path = tmp_path / "candidates.jsonl"
    assert save_candidates(nearest8[:100], path, by_id) == 100
    with pytest.raises(DataError, match="not items of the file"):  # the first 100 name windows not yet written
        load_candidate_file(path)
    assert save_candidates(nearest8, path, by_id) == len(nearest8) - 100  # the first 100 are skipped
    loaded, series = load_candidate_file(path)
    assert loaded == nearest8
    assert loaded[5].candidate_ids(4) == [nearest8[5].item_id, *nearest8[5].distractor_ids[:3]]
    assert all(np.array_equal(series[w.id].values, w.values) and series[w.id].source == w.source for w in windows)
    with pytest.raises(DataError, match="does not exist"):
        load_candidate_file(tmp_path / "missing.jsonl")


def test_cli_writes_outputs_and_refuses_mixed_settings(tmp_path, capsys):
    out = tmp_path / "cands"
    args = ["candidates", "--corpus", "embedded", "--k", "4", "--seed", "0", "--out", str(out), "--quiet"]
    assert cli_main(args) == 0
    sets, series = load_candidate_file(out / "candidates.jsonl")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["protocol"] == "candidates" and summary["config"]["k"] == 4
    assert summary["rows"][0]["items"] == len(sets) == sum(summary["windows_per_domain"].values())
    assert all(cs.k == 4 and cs.rule == "nearest" for cs in sets)
    # distractors come from the item's own time-ordered split
    assert {s.split for s in series.values()} == {"train", "val", "test"}
    assert all(series[d].split == series[cs.item_id].split for cs in sets for d in cs.distractor_ids)
    assert "| nearest |" in (out / "table.md").read_text()
    assert cli_main(args) == 0  # resume: nothing new
    assert "(0 new)" in capsys.readouterr().out
    assert cli_main([*args, "--rule", "random"]) == 2
    assert "other settings (rule)" in capsys.readouterr().err
