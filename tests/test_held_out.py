"""Held-out corpora: other domains than the training corpus, shipped offline, as the test items."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from captionrl.domains.corpora import EMBEDDED, load_embedded_corpus
from captionrl.domains.held_out import HELD_OUT, load_held_out
from captionrl.domains.lineup_data import LineupDataConfig, build_lineup_data
from captionrl.errors import ConfigError


@pytest.mark.parametrize("name", sorted(HELD_OUT))
def test_each_corpus_loads_real_finite_series_of_its_own_domain(name):
    series = load_held_out([name])
    assert len(series) >= 4
    domains = {s.domain for s in series}
    assert len(domains) == 1 and not domains & {e.domain for e in EMBEDDED}  # a domain the training corpus lacks
    for s in series:
        assert len(s) >= 32 and np.isfinite(s.values).all() and s.values.std() > 0


def test_fertility_is_the_world_bank_rate_with_inner_gaps_interpolated():
    by_id = {s.id: s for s in load_held_out(["fertility"])}
    aruba = by_id["fertility:ABW"]
    assert aruba.values[:3].tolist() == [4.82, 4.655, 4.471] and aruba.meta["name"] == "Aruba"
    assert "fertility:AND" not in by_id  # Andorra reports too few years


def test_test_items_come_only_from_held_out_corpora_in_equal_numbers_and_never_from_training_series():
    cfg = LineupDataConfig(window=16, n_train=32, n_test=30, test_corpora=["fertility", "stocks", "eeg"])
    data = build_lineup_data(cfg, 4, seed=0)
    test = [data.pool[r["item_id"]] for r in data.rows["test"]]
    assert Counter(s.domain for s in test) == {"demography": 10, "finance": 10, "neuro": 10}
    training_sources = {s.id for s in load_embedded_corpus()}
    assert not {s.source for s in test} & training_sources
    assert {data.pool[r["item_id"]].source for r in data.rows["train"]} <= training_sources
    for r in data.rows["test"]:  # lineups mined among held-out windows only
        assert all(data.pool[c].split == "test" and data.pool[c].source not in training_sources
                   for c in r["candidate_ids"])
    again = build_lineup_data(cfg, 4, seed=0)
    assert [r["item_id"] for r in again.rows["test"]] == [r["item_id"] for r in data.rows["test"]]


def test_unknown_held_out_corpus_or_a_conflicting_source_is_a_named_error(tmp_path):
    with pytest.raises(ConfigError, match=r"data\.test_corpora.*'fertilty'.*did you mean 'fertility'"):
        LineupDataConfig(test_corpora=["fertilty"])
    with pytest.raises(ConfigError, match=r"data\.test_corpora.*candidates file"):
        LineupDataConfig(test_corpora=["eeg"], candidates_file=str(tmp_path / "c.jsonl"))
    assert LineupDataConfig(test_corpora="eeg").test_corpora == ["eeg"]  # key=value overrides
    assert LineupDataConfig(test_corpora="eeg, stocks").test_corpora == ["eeg", "stocks"]
