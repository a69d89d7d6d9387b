"""Time-series domain: validation, the embedded corpus, user layouts, leak-free splits, rendering, statistics."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from captionrl.domains import corpora
from captionrl.domains.corpora import (
    load_bedtime_csv,
    load_cats_bench,
    load_corpus,
    load_embedded_corpus,
    load_jsonl,
    load_tsfragment_csv,
    load_value_csv,
    load_wide_csv,
)
from captionrl.domains.timeseries import (
    make_series,
    render_chart,
    render_numbers,
    split_by_fraction,
    split_ett,
    summary_stats,
    window,
    window_splits,
)
from captionrl.errors import ConfigError, DataError
from captionrl.types import Series

ETT_COLS = ["date", "HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT"]


@pytest.fixture(scope="module")
def corpus() -> list[Series]:
    return load_embedded_corpus()


@pytest.fixture(scope="module")
def by_id(corpus) -> dict[str, Series]:
    return {s.id: s for s in corpus}


# ------------------------------------------------------------------------------------ embedded corpus
def test_embedded_corpus_is_real_multi_domain_and_reports_gaps(corpus, by_id):
    domains = {s.domain for s in corpus}
    assert len(domains) >= 4, domains
    assert len(by_id["co2"]) == 2284 and len(by_id["nile"]) == 100 and len(by_id["elnino"]) == 61 * 12
    # co2's empty weeks were interpolated and reported, not silently dropped
    co2 = by_id["co2"]
    assert co2.meta["filled"] == 59 and co2.meta["gaps"][0] == [6, 7]
    a, b = co2.meta["gaps"][0]
    assert co2.values[a] == pytest.approx((co2.values[a - 1] + co2.values[b]) / 2)
    assert by_id["nile"].values[0] == 1120.0 and by_id["sunspots"].values[-1] == 2.9
    assert all(np.isfinite(s.values).all() for s in corpus)


def test_embedded_corpus_unknown_name_suggests():
    with pytest.raises(ConfigError, match="did you mean 'nile'"):
        load_embedded_corpus(["nil"])


# --------------------------------------------------------------------------------------- make_series
def test_nan_rejected_naming_item_and_index():
    with pytest.raises(DataError) as exc:
        make_series([1.0, 2.0, float("nan"), 4.0], id="item7")
    assert exc.value.field == "series[item7][2]" and "interpolate" in exc.value.fix


def test_inf_rejected():
    with pytest.raises(DataError, match=r"series\[x\]\[1\]"):
        make_series([1.0, math.inf, 3.0], id="x")


def test_empty_rejected():
    with pytest.raises(DataError, match="is empty"):
        make_series([], id="e")


def test_ragged_rejected_naming_index():
    with pytest.raises(DataError, match="ragged") as exc:
        make_series([[1, 2], [3, 4], [5]], id="r")
    assert exc.value.field == "series[r][2]"


def test_two_dimensional_rejected():
    with pytest.raises(DataError, match="2-D"):
        make_series([[1, 2], [3, 4]], id="m")


def test_non_number_rejected_naming_index():
    with pytest.raises(DataError, match=r"series\[s\]\[1\]"):
        make_series([1, "abc", 3], id="s")


def test_interpolate_fills_linearly_and_reports_gaps():
    s = make_series([1.0, None, "nan", 4.0, 5.0, float("inf")], id="g", fill="interpolate")
    np.testing.assert_allclose(s.values, [1, 2, 3, 4, 5, 5])
    assert s.meta["gaps"] == [[1, 3], [5, 6]] and s.meta["filled"] == 3


def test_interpolate_needs_two_finite_values():
    with pytest.raises(DataError, match="only 1 finite"):
        make_series([float("nan"), 3.0, float("nan")], id="g", fill="interpolate")


# -------------------------------------------------------------------------------------- windows/splits
def test_window_ids_starts_and_next(by_id):
    nile = by_id["nile"]
    ws = window(nile, 16, 8, next_length=4)
    assert [w.start for w in ws[:3]] == [0, 8, 16]
    assert all(len(w) == 16 and w.source == "nile" for w in ws)
    last = ws[-1]
    assert last.end + 4 <= len(nile)  # the target never runs past the series
    np.testing.assert_array_equal(last.meta["next"], nile.values[last.end:last.end + 4])
    assert ws[0].meta["start_date"] == "1871"


def test_fraction_split_windows_never_cross_boundaries(by_id):
    co2 = by_id["co2"]
    segs = split_by_fraction(co2, (0.7, 0.1, 0.2))
    assert sum(len(s) for s in segs.values()) == len(co2)
    assert segs["train"].end == segs["val"].start and segs["val"].end == segs["test"].start
    np.testing.assert_array_equal(np.concatenate([s.values for s in segs.values()]), co2.values)
    wins = window_splits(segs, 64, 1, next_length=16)
    for name, ws in wins.items():
        lo, hi = segs[name].start, segs[name].end
        assert ws and all(lo <= w.start and w.end + 16 <= hi and w.split == name for w in ws)
    # the last train window stops exactly where its target must stay inside train
    assert wins["train"][-1].end + 16 == segs["train"].end


def test_ett_split_sizes_and_no_crossing(by_id):
    # ETT-sized hourly series made of real values (co2 tiled): 8640 / 2880 / 2880 rows
    vals = np.resize(by_id["co2"].values, 17420)
    s = Series(id="etth", values=vals)
    segs = split_ett(s, "h")
    assert [len(segs[k]) for k in ("train", "val", "test")] == [8640, 2880, 2880]
    assert segs["test"].end == 14400
    wins = window_splits(segs, 96, 48, next_length=96)
    for name, ws in wins.items():
        assert all(segs[name].start <= w.start and w.end + 96 <= segs[name].end for w in ws)
    seg15 = split_ett(Series(id="ettm", values=np.resize(vals, 69680)), "15min")
    assert [len(seg15[k]) for k in ("train", "val", "test")] == [34560, 11520, 11520]
    with pytest.raises(DataError, match="shorter than the ETT split"):
        split_ett(by_id["co2"], "h")


def test_bad_fractions_rejected(by_id):
    with pytest.raises(ConfigError, match="summing to 1"):
        split_by_fraction(by_id["nile"], (0.5, 0.2, 0.2))


# ------------------------------------------------------------------------------------------ rendering
def test_render_numbers_roundtrip_and_info(by_id):
    w = window(by_id["sunspots"], 32)[3]
    text, info = render_numbers(w, precision=1)
    assert info == {"precision": 1, "normalise": None}
    np.testing.assert_allclose([float(t) for t in text.split(", ")], w.values, atol=0.05)
    ztext, zinfo = render_numbers(w, precision=3, normalise="zscore")
    z = np.array([float(t) for t in ztext.split(", ")])
    np.testing.assert_allclose(z * zinfo["std"] + zinfo["mean"], w.values, atol=5e-3 * zinfo["std"])
    mtext, minfo = render_numbers(w, precision=2, normalise="minmax")
    m = np.array([float(t) for t in mtext.split(", ")])
    assert m.min() == 0.0 and m.max() == 1.0 and minfo["max"] == w.values.max()
    with pytest.raises(ConfigError):
        render_numbers(w, normalise="log")


def test_render_chart_image(by_id, tmp_path):
    a, b = window(by_id["nile"], 32)[:2]
    img = render_chart(a, tmp_path / "a.png", size=(320, 240))
    assert img.size == (320, 240) and img.mode == "RGB" and (tmp_path / "a.png").is_file()
    assert np.asarray(img).std() > 0  # something was drawn
    assert not np.array_equal(np.asarray(img), np.asarray(render_chart(b, size=(320, 240))))


# ----------------------------------------------------------------------------------------- statistics
def test_summary_stats_match_reference(by_id):
    ws = window(by_id["elec_equip"], 32, 16)
    x = np.stack([w.values for w in ws])
    st = summary_stats(x, ("slope", "acf1", "first", "argmax"))
    for row, w in zip(st, ws, strict=True):
        assert row[0] == pytest.approx(np.polyfit(np.arange(32), w.values, 1)[0], rel=1e-9)
        assert row[1] == pytest.approx(np.corrcoef(w.values[:-1], w.values[1:])[0, 1], abs=0.1)
        assert row[2] == w.values[0] and row[3] == w.values.argmax() / 31
    with pytest.raises(ConfigError, match="unknown statistic"):
        summary_stats(x, ("mean", "kurtosis"))


# ---------------------------------------------------------------------------------------- user layouts
def _write_ett(path, values, n=40):
    rows = [",".join(ETT_COLS)]
    for i in range(n):
        cells = [f"{values[(i + 7 * c) % len(values)]:.3f}" for c in range(7)]
        rows.append(f"2016-07-01 {i % 24:02d}:00:00," + ",".join(cells))
    path.write_text("\n".join(rows) + "\n")


def test_ett_csv_target_and_dates(by_id, tmp_path):
    p = tmp_path / "ETTh2.csv"
    _write_ett(p, by_id["co2"].values)
    (ot,) = load_wide_csv(p)
    assert len(ot) == 40 and ot.meta["column"] == "OT" and ot.meta["dates"][0] == "2016-07-01 00:00:00"
    assert ot.values[0] == pytest.approx(round(by_id["co2"].values[42], 3))
    (hufl,) = load_wide_csv(p, target="HUFL")
    assert hufl.values[0] == pytest.approx(round(by_id["co2"].values[0], 3))
    assert load_corpus(p)[0].values.tolist() == ot.values.tolist()
    assert window(ot, 8)[1].meta["start_date"] == "2016-07-01 08:00:00"


def test_missing_column_lists_columns_found(by_id, tmp_path):
    p = tmp_path / "ETTm2.csv"
    _write_ett(p, by_id["co2"].values)
    with pytest.raises(DataError, match="columns found") as exc:
        load_wide_csv(p, target="OTT")
    assert "HUFL" in str(exc.value)


def test_unparseable_number_names_row_and_column(by_id, tmp_path):
    p = tmp_path / "bad.csv"
    _write_ett(p, by_id["co2"].values, n=5)
    lines = p.read_text().splitlines()
    lines[3] = lines[3].rsplit(",", 1)[0] + ",12.x"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as exc:
        load_wide_csv(p)
    assert exc.value.field.endswith("row 4, column OT") and exc.value.value == "12.x"


def test_ragged_csv_row_and_empty_file(tmp_path):
    p = tmp_path / "ragged.csv"
    p.write_text("date,OT\n2020-01-01,1\n2020-01-02,2,3\n")
    with pytest.raises(DataError, match="has 3 fields but the header has 2"):
        load_wide_csv(p)
    e = tmp_path / "empty.csv"
    e.write_text("")
    with pytest.raises(DataError, match="is empty"):
        load_wide_csv(e)
    h = tmp_path / "header_only.csv"
    h.write_text(",".join(ETT_COLS) + "\n")
    with pytest.raises(DataError, match="no data rows"):
        load_wide_csv(h)


def test_missing_values_in_csv_follow_fill_policy(tmp_path):
    p = tmp_path / "gaps.csv"
    p.write_text("date,OT\nd0,1\nd1,\nd2,3\n")
    with pytest.raises(DataError, match=r"\[1\]"):
        load_wide_csv(p)
    (s,) = load_wide_csv(p, fill="interpolate")
    assert s.values.tolist() == [1.0, 2.0, 3.0] and s.meta["gaps"] == [[1, 2]]


def test_ltsf_electricity_csv(by_id, tmp_path):
    v = by_id["elec_equip"].values
    p = tmp_path / "electricity.csv"
    p.write_text("date,0,1,2,OT\n" + "\n".join(f"2016-07-01 {i:02d}:00:00,{v[i]},{v[i + 1]},{v[i + 2]},{v[i + 3]}"
                                               for i in range(20)) + "\n")
    (ot,) = load_wide_csv(p)
    np.testing.assert_allclose(ot.values, v[3:23])
    both = load_wide_csv(p, target=["0", "OT"])
    assert [s.id for s in both] == ["electricity:0", "electricity:OT"]


def test_saugeen_value_csv(by_id, tmp_path):
    v = by_id["nile"].values
    p = tmp_path / "saugeen.csv"
    p.write_text('"Date", "saugeenRiverflows"\n' + "\n".join(f"1915-01-{i + 1:02d}, {v[i]}" for i in range(30)) + "\n")
    (s,) = load_value_csv(p)
    np.testing.assert_allclose(s.values, v[:30])
    assert s.meta["column"] == "saugeenRiverflows" and load_corpus(p)[0].values.tolist() == s.values.tolist()


def test_cats_bench_folder(by_id, tmp_path):
    v = by_id["sunspots"].values
    for split, idx in (("train", 0), ("train", 1), ("test", 0)):
        stem = f"air_quality_{idx}_{split}"
        for sub in ("time series", "gt_captions", "metadata"):
            (tmp_path / split / sub).mkdir(parents=True, exist_ok=True)
        (tmp_path / split / "time series" / f"{stem}.txt").write_text(", ".join(str(x) for x in v[idx:idx + 24]))
        (tmp_path / split / "gt_captions" / f"{stem}.txt").write_text(f"caption of {stem}")
        (tmp_path / split / "metadata" / f"{stem}.json").write_text(json.dumps({"unit": "count"}))
    items = load_cats_bench(tmp_path)
    assert [s.id for s in items] == ["air_quality_0_train", "air_quality_1_train", "air_quality_0_test"]
    assert items[0].domain == "air_quality" and items[2].split == "test"
    assert items[1].meta["captions"] == ["caption of air_quality_1_train"] and items[1].meta["metadata"]["unit"] == "count"
    np.testing.assert_allclose(items[1].values, v[1:25])
    assert len(load_corpus(tmp_path)) == 3
    (tmp_path / "test" / "time series").rename(tmp_path / "test" / "series")
    with pytest.raises(DataError, match="time series"):
        load_cats_bench(tmp_path, "test")


def test_bedtime_csv_and_ragged_list(by_id, tmp_path):
    v = by_id["nile"].values
    p = tmp_path / "bedtime.csv"
    p.write_text('idx,series,annotations\n0,"' + str(v[:10].tolist()) + '","[\'rises then falls\', \'peaks early\']"\n'
                 '1,"' + str(v[10:20].tolist()) + '",flat overall\n')
    a, b = load_bedtime_csv(p)
    assert a.id == "0" and a.meta["captions"] == ["rises then falls", "peaks early"] and b.meta["captions"] == ["flat overall"]
    np.testing.assert_allclose(b.values, v[10:20])
    assert [s.id for s in load_corpus(p)] == ["0", "1"]
    bad = tmp_path / "bedtime_bad.csv"
    bad.write_text('idx,series,annotations\n0,"[[1, 2], [3]]",x\n')
    with pytest.raises(DataError, match="ragged"):
        load_bedtime_csv(bad)


def test_tsfragment_csv(by_id, tmp_path):
    v = by_id["elnino"].values
    p = tmp_path / "tsfragment.csv"
    p.write_text('Text,OT\n"warm spell, then cooling","' + json.dumps(v[:12].tolist()) + '"\n')
    (s,) = load_tsfragment_csv(p)
    assert s.meta["captions"] == ["warm spell, then cooling"]
    np.testing.assert_allclose(s.values, v[:12])
    assert load_corpus(p)[0].meta["captions"] == s.meta["captions"]


def test_jsonl_with_caption_next_and_errors(by_id, tmp_path):
    v = by_id["co2"].values
    p = tmp_path / "items.jsonl"
    p.write_text(json.dumps({"id": "a", "series": v[:8].tolist(), "caption": "slow rise", "next": v[8:12].tolist()})
                 + "\n\n" + json.dumps({"id": "b", "series": v[20:28].tolist()}) + "\n")
    a, b = load_jsonl(p)
    assert a.meta["captions"] == ["slow rise"] and a.meta["next"] == v[8:12].tolist() and b.meta["captions"] == []
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "a", "series": [1, 2]}) + "\n{not json\n")
    with pytest.raises(DataError, match="line 2"):
        load_jsonl(bad)
    bad.write_text(json.dumps({"id": "a", "values": [1, 2]}) + "\n")
    with pytest.raises(DataError, match="no 'series' field"):
        load_jsonl(bad)


def test_unknown_corpus_path():
    with pytest.raises(DataError, match="neither 'embedded'"):
        load_corpus("/nonexistent/corpus.csv")


def test_statsmodels_folder_found():
    assert (corpora.statsmodels_datasets_dir() / "co2" / "co2.csv").is_file()
