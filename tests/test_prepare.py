"""``captionrl data prepare`` on tiny copies of each public layout (written here, in the exact layouts), and
the prepared folder feeding LineupRL's data build, ``captionrl caption`` and ``eval identify``. No model
loads: the captioner is the deterministic describer, and every bad input must fail before one would."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from captionrl.cli import main
from captionrl.domains.candidates import load_candidate_file
from captionrl.domains.lineup_data import LineupDataConfig, build_lineup_data
from captionrl.domains.prepare import PrepareConfig, allocate, load_prepared, prepare, resample
from captionrl.errors import ConfigError, DataError
from captionrl.types import Series

RNG = np.random.default_rng(0)


def _walk(n: int, seed: int) -> np.ndarray:
    r = np.random.default_rng(seed)
    t = np.arange(n)
    return 20 + 5 * np.sin(2 * np.pi * t / 24) + np.cumsum(r.normal(0, 0.5, n))


def _write_csv(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def write_ett(folder: Path, name: str = "ETTh1.csv", rows: int = 14400, nan_row: int | None = None) -> Path:
    """ETT layout: date,HUFL,HULL,MUFL,MULL,LUFL,LULL,OT, hourly from 2016-07-01 (20 months = 14,400 rows)."""
    import datetime as dt

    t0 = dt.datetime(2016, 7, 1)
    cols = np.stack([_walk(rows, s) for s in range(7)], axis=1).round(3)
    out = []
    for i in range(rows):
        vals: list[object] = cols[i].tolist()
        if nan_row is not None and i == nan_row - 2:
            vals[6] = ""
        out.append([(t0 + dt.timedelta(hours=i)).strftime("%Y-%m-%d %H:%M:%S"), *vals])
    return _write_csv(folder / name, ["date", "HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT"], out)


def write_electricity(folder: Path, rows: int = 600) -> Path:
    """LTSF electricity layout: date,0,1,...,N-1,OT (hourly)."""
    cols = np.stack([_walk(rows, 10 + s) for s in range(4)], axis=1).round(2)
    out = [[f"2016-07-{1 + i // 24:02d} {i % 24:02d}:00:00", *cols[i].tolist()] for i in range(rows)]
    return _write_csv(folder / "electricity.csv", ["date", "0", "1", "2", "OT"], out)


def write_saugeen(folder: Path, rows: int = 2000) -> Path:
    """Saugeen layout: Date,saugeenRiverflows (daily)."""
    v = np.abs(_walk(rows, 42)).round(1)
    return _write_csv(folder / "saugeen.csv", ["Date", "saugeenRiverflows"],
                      [[f"{1915 + i // 336}-{1 + (i // 28) % 12:02d}-{1 + i % 28:02d}", v[i]] for i in range(rows)])


def write_bedtime(folder: Path, lengths: tuple[int, ...] = (24, 24, 24, 24, 24, 24, 32, 32, 32, 32, 32, 32, 40),
                  name: str = "bedtime.csv", nan_at: int | None = None) -> Path:
    """BEDTime layout: idx, series (a list string), annotations."""
    rows = []
    for i, n in enumerate(lengths):
        vals = _walk(n, 100 + i).round(2).tolist()
        text = json.dumps(vals)
        if nan_at == i:
            text = text.replace(str(vals[3]), "NaN", 1)
        rows.append([i, text, f"A series of {n} values that rises and falls (item {i})."])
    return _write_csv(folder / name, ["idx", "series", "annotations"], rows)


def write_tsfragment(folder: Path, n: int = 30, name: str = "tsfragment.csv") -> Path:
    """TSFragment layout: Text, OT (the series as a list string)."""
    rows = [[f"Fragment {i}: a gentle trend with daily cycles.", str(_walk(36, 200 + i).round(3).tolist())]
            for i in range(n)]
    return _write_csv(folder / name, ["Text", "OT"], rows)


def write_cats(root: Path, n_train: int = 12, n_test: int = 5, empty_test: bool = False) -> Path:
    """CaTS-Bench layout: {train,test}/{time series,gt_captions,metadata,plots}/<domain>_<idx>_<split>.*"""
    for split, n in (("train", n_train), ("test", n_test)):
        for sub in ("time series", "gt_captions", "metadata", "plots"):
            (root / split / sub).mkdir(parents=True, exist_ok=True)
        if split == "test" and empty_test:
            continue
        for i in range(n):
            stem = f"{'air_quality' if i % 2 else 'traffic'}_{i}_{split}"
            vals = _walk(20, 300 + i + (100 if split == "test" else 0)).round(2)
            (root / split / "time series" / f"{stem}.txt").write_text(", ".join(map(str, vals)))
            (root / split / "gt_captions" / f"{stem}.txt").write_text(f"The {stem} series trends upward.")
            (root / split / "metadata" / f"{stem}.json").write_text(json.dumps({"domain": stem.rsplit("_", 2)[0]}))
    return root


def write_jsonl(folder: Path, n: int = 24) -> Path:
    p = folder / "items.jsonl"
    folder.mkdir(parents=True, exist_ok=True)
    with p.open("w") as f:
        for i in range(n):
            split = "train" if i < 12 else "val" if i < 18 else "test"
            f.write(json.dumps({"id": f"x{i}", "series": _walk(16, 400 + i).round(2).tolist(),
                                "caption": f"item {i}", "next": [1.0, 2.0], "split": split}) + "\n")
    return p


def run_prepare(tmp_path: Path, source: str, path: Path, **kw) -> tuple[dict, Path]:
    out = tmp_path / f"prep-{source}"
    cfg = PrepareConfig(source=source, path=str(path), out=str(out), quiet=True, **kw)
    return prepare(cfg), out


def _check_folder(manifest: dict, out: Path) -> None:
    """Manifest numbers equal the files; every lineup is K same-length series of one split."""
    prepared = load_prepared(out)
    k = manifest["candidates"]["k"]
    for split in ("train", "val", "test"):
        table = pq.read_table(out / f"{split}.parquet").to_pylist()
        assert len(table) == manifest["counts"][split]["prepared"] == len(prepared.items[split])
    sets, series = load_candidate_file(out / "candidates.jsonl")
    assert len(sets) == sum(manifest["counts"][s]["prepared"] for s in ("train", "val", "test"))
    for cs in sets:
        assert cs.k == k
        lineup = [series[i] for i in cs.candidate_ids()]
        assert len({len(s) for s in lineup}) == 1
        assert len({s.split for s in lineup}) == 1
        assert cs.item_id not in cs.distractor_ids
    for f in manifest["files_read"]:
        assert f["bytes"] > 0 and len(f["sha256"]) == 64
    assert {"rule", "min", "max"} <= set(manifest["lengths"])


# ------------------------------------------------------------------------------------------ each layout
def test_ett_split_12_4_4_months_windows_with_next(tmp_path):
    src = write_ett(tmp_path / "ett")
    m, out = run_prepare(tmp_path, "ett", src, length=96, horizon=24)
    _check_folder(m, out)
    assert m["splits"]["rows"] == {"train": 8640, "val": 2880, "test": 2880}
    assert m["splits"]["freq"] == "h"
    # windows inside each split: 8640 // 96 train windows with a complete 24-step target (the last loses it)
    assert m["counts"]["train"]["prepared"] == (8640 - 24) // 96
    assert m["counts"]["test"]["prepared"] == (2880 - 24) // 96
    items = load_prepared(out).items
    raw = np.loadtxt(src, delimiter=",", skiprows=1, usecols=7)
    w = items["val"][0]
    assert w.start == 8640 and np.allclose(w.values, raw[8640:8736])
    assert np.allclose(w.meta["next"], raw[8736:8760])  # next = the 24 values after the window
    assert all(it.start + 96 + 24 <= 8640 for it in items["train"])  # no target crosses into val
    assert m["lengths"]["rule"] == "window" and m["windows"]["horizon"] == 24


def test_electricity_and_saugeen_time_split_recorded(tmp_path):
    m, out = run_prepare(tmp_path, "electricity", write_electricity(tmp_path / "e"), length=24, horizon=8, target="all")
    _check_folder(m, out)
    assert m["splits"]["fractions"] == [0.7, 0.1, 0.2] and m["windows"]["columns"] == ["0", "1", "2", "OT"]
    assert m["splits"]["rows"] == {"train": 420, "val": 60, "test": 120}
    # 4 columns x windows per split; val: 60 rows -> 2 windows with an 8-step target per column
    assert m["counts"]["val"]["prepared"] == 4 * ((60 - 8) // 24)
    m2, out2 = run_prepare(tmp_path, "saugeen", write_saugeen(tmp_path / "s"), length=30, horizon=7)
    _check_folder(m2, out2)
    assert all(len(it.meta["next"]) == 7 for it in load_prepared(out2).items["test"])


def test_bedtime_length_buckets_skip_small_buckets_and_say_so(tmp_path):
    m, out = run_prepare(tmp_path, "bedtime", write_bedtime(tmp_path / "b"), splits=[1.0, 0.0, 0.0],
                         n_val=0, n_test=0)
    _check_folder(m, out)
    assert m["lengths"]["rule"] == "bucket" and (m["lengths"]["min"], m["lengths"]["max"]) == (24, 32)
    assert m["counts"]["train"] == {"read": 13, "eligible": 12, "requested": None, "prepared": 12}
    skip = [s for s in m["skipped"] if s.get("split") == "train"]
    assert skip and skip[0]["lengths"] == {40: 1}
    items = load_prepared(out).items["train"]
    assert items[0].meta["captions"][0].startswith("A series of")


def test_resample_rule_keeps_every_item(tmp_path):
    m, out = run_prepare(tmp_path, "bedtime", write_bedtime(tmp_path / "b"), splits=[1.0, 0.0, 0.0],
                         n_val=0, n_test=0, lengths="resample", length=16)
    _check_folder(m, out)
    assert m["counts"]["train"]["prepared"] == 13
    assert (m["lengths"]["min"], m["lengths"]["max"], m["lengths"]["original_max"]) == (16, 16, 40)
    assert {it.meta["orig_length"] for it in load_prepared(out).items["train"]} == {24, 32, 40}
    s = Series("a", np.array([0.0, 10.0]))
    assert resample(s, 5).values.tolist() == [0.0, 2.5, 5.0, 7.5, 10.0]


def test_tsfragment_item_split_seeded_and_exact_counts(tmp_path):
    src = write_tsfragment(tmp_path / "t", n=40)
    m, out = run_prepare(tmp_path, "tsfragment", src, n_train=20, n_val=4, n_test=8)
    _check_folder(m, out)
    assert m["splits"]["rule"].startswith("seeded item split") and m["splits"]["fractions"] == [0.7, 0.1, 0.2]
    assert [m["counts"][s]["prepared"] for s in ("train", "val", "test")] == [20, 4, 8]
    _, out2 = run_prepare(tmp_path / "again", "tsfragment", src, n_train=20, n_val=4, n_test=8)
    assert [it.id for it in load_prepared(out).items["test"]] == [it.id for it in load_prepared(out2).items["test"]]


def test_tsfragment_folder_split_by_file_names(tmp_path):
    folder = tmp_path / "t"
    write_tsfragment(folder, 20, "tsfragment_train.csv")
    write_tsfragment(folder, 6, "tsfragment_val.csv")
    write_tsfragment(folder, 8, "tsfragment_test.csv")
    m, _ = run_prepare(tmp_path, "tsfragment", folder)
    assert [m["counts"][s]["prepared"] for s in ("train", "val", "test")] == [20, 6, 8]
    assert m["splits"]["files"]["tsfragment_val.csv"] == "val" and len(m["files_read"]) == 3


def test_cats_bench_keeps_its_train_test_folders(tmp_path):
    root = write_cats(tmp_path / "cats", n_train=14, n_test=5)
    m, out = run_prepare(tmp_path, "cats-bench", root, val_fraction=0.3)
    _check_folder(m, out)
    items = load_prepared(out).items
    assert all(it.id.endswith("_test") for it in items["test"]) and len(items["test"]) == 5
    assert all(it.id.endswith("_train") for it in items["train"] + items["val"])
    assert (len(items["train"]), len(items["val"])) == (10, 4)
    assert "val" in m["splits"] and items["test"][0].meta["captions"][0].startswith("The ")
    assert {f["path"].split("/")[0] for f in m["files_read"]} == {"train", "test"}


def test_jsonl_split_field_and_next(tmp_path):
    m, out = run_prepare(tmp_path, "jsonl", write_jsonl(tmp_path / "j"))
    _check_folder(m, out)
    assert [m["counts"][s]["prepared"] for s in ("train", "val", "test")] == [12, 6, 6]
    assert load_prepared(out).items["test"][0].meta["next"] == [1.0, 2.0]


def test_random_rule_ablation(tmp_path):
    m, out = run_prepare(tmp_path, "jsonl", write_jsonl(tmp_path / "j"), rule="random", k=3)
    _check_folder(m, out)
    assert m["candidates"]["rule"] == "random" and m["candidates"]["k"] == 3


def test_allocation_is_exact_and_respects_k():
    a = allocate({24: 10, 32: 10, 40: 3}, 12, 4)
    assert sum(a.values()) == 12 and all(v == 0 or v >= 4 for v in a.values())


# ------------------------------------------------------------------------------------------ bad inputs
def _fails(tmp_path, source, path, *needles, exc=DataError, **kw):
    with pytest.raises(exc) as e:
        run_prepare(tmp_path, source, path, **kw)
    for n in needles:
        assert n in str(e.value), str(e.value)
    assert "Fix:" in str(e.value)
    return str(e.value)


def test_missing_column_names_file_and_column(tmp_path):
    bad = _write_csv(tmp_path / "b" / "bedtime.csv", ["idx", "series"], [[0, "[1, 2, 3, 4]"]])
    _fails(tmp_path, "bedtime", bad, "bedtime.csv:row 1", "['annotations']")


def test_wrong_layout_says_which_layout_it_is(tmp_path):
    msg = _fails(tmp_path, "tsfragment", write_bedtime(tmp_path / "b"), "is not a tsfragment file", "source=bedtime")
    assert "bedtime.csv" in msg
    _fails(tmp_path, "saugeen", write_ett(tmp_path / "e", rows=40), "is not a Saugeen file", "source=ett")
    _fails(tmp_path, "cats-bench", tmp_path / "b", "is not a CaTS-Bench folder")


def test_nan_names_file_row_and_column(tmp_path):
    _fails(tmp_path, "ett", write_ett(tmp_path / "e", nan_row=57), "ETTh1.csv:row 57, column OT", "fill=interpolate")
    _fails(tmp_path, "bedtime", write_bedtime(tmp_path / "b", nan_at=2), "bedtime.csv:row 4, column series")


def test_nan_interpolated_when_asked_and_recorded(tmp_path):
    m, out = run_prepare(tmp_path, "bedtime", write_bedtime(tmp_path / "b", nan_at=2), fill="interpolate",
                         splits=[1.0, 0.0, 0.0], n_val=0, n_test=0)
    assert m["counts"]["train"]["prepared"] == 12
    assert m["filled_values"]["train"] == {"items": 1, "values": 1} and m["fill"] == "interpolate"
    filled = [it for it in load_prepared(out).items["train"] if it.meta.get("filled")]
    assert len(filled) == 1 and filled[0].meta["gaps"] == [[3, 4]]


def test_empty_split_fails(tmp_path):
    _fails(tmp_path, "cats-bench", write_cats(tmp_path / "c", empty_test=True), "empty split", "test")
    _fails(tmp_path, "bedtime", write_bedtime(tmp_path / "b"), "empty split", "n_val=0", splits=[1.0, 0.0, 0.0])


def test_too_few_items_for_k(tmp_path):
    _fails(tmp_path, "cats-bench", write_cats(tmp_path / "c", n_test=3), "too few items for K=4", "lower k")
    _fails(tmp_path, "tsfragment", write_tsfragment(tmp_path / "t"), "too few items for K=4", n_test=2)


def test_more_items_than_exist_names_both_numbers(tmp_path):
    _fails(tmp_path, "tsfragment", write_tsfragment(tmp_path / "t", n=30), "asks for 100 train items but only 21 exist",
           n_train=100)


def test_download_and_existing_out_fail(tmp_path):
    _fails(tmp_path, "ett", tmp_path, "downloads nothing", "ETDataset", exc=ConfigError, download=True)
    src = write_jsonl(tmp_path / "j")
    run_prepare(tmp_path, "jsonl", src)
    _fails(tmp_path, "jsonl", src, "exists and is not empty", "overwrite=true", exc=ConfigError)
    assert run_prepare(tmp_path, "jsonl", src, overwrite=True)[0]["counts"]["train"]["prepared"] == 12
    (tmp_path / "prep-jsonl" / "notes.txt").write_text("mine")
    _fails(tmp_path, "jsonl", src, "notes.txt", exc=ConfigError, overwrite=True)


# ------------------------------------------------------------------------------------------ consumers
def test_prepared_folder_feeds_lineup_training_rows(tmp_path):
    _, out = run_prepare(tmp_path, "ett", write_ett(tmp_path / "e"), length=64, horizon=16)
    data = build_lineup_data(LineupDataConfig(prepared=str(out), n_train=10, n_val=4, n_test=6), k=4, seed=0)
    assert [len(data.rows[s]) for s in ("train", "val", "test")] == [10, 4, 6]
    row = data.rows["test"][0]
    assert len(row["candidates"]) == 4 and {len(c) for c in row["candidates"]} == {64}
    assert all(data.pool[i].split == "test" for i in row["candidate_ids"])
    assert row["candidates"][0] == row["series"]
    with pytest.raises(DataError, match="asks for 999 test items but only"):
        build_lineup_data(LineupDataConfig(prepared=str(out), n_test=999), k=4, seed=0)
    with pytest.raises(DataError, match="holds lineups of K=4"):
        build_lineup_data(LineupDataConfig(prepared=str(out)), k=6, seed=0)
    with pytest.raises(DataError, match=r"no manifest\.json"):
        build_lineup_data(LineupDataConfig(prepared=str(tmp_path)), k=4, seed=0)


def test_variable_length_prepared_folder_feeds_lineup_rows(tmp_path):
    _, out = run_prepare(tmp_path, "bedtime", write_bedtime(tmp_path / "b"), splits=[1.0, 0.0, 0.0], n_val=0, n_test=0)
    data = build_lineup_data(LineupDataConfig(prepared=str(out), n_test=0), k=4, seed=0)
    assert {len(r["series"]) for r in data.rows["train"]} == {24, 32}


def test_cli_prepare_then_caption_with_describer(tmp_path, capsys):
    src = write_saugeen(tmp_path / "s")
    out = tmp_path / "prep"
    assert main(["data", "prepare", "source=saugeen", f"path={src}", f"out={out}", "length=30", "horizon=7",
                 "quiet=true"]) == 0
    assert "prepared saugeen" in capsys.readouterr().out
    caps = tmp_path / "caps.jsonl"
    assert main(["caption", f"prepared={out}", "captioner=describer", f"out={caps}", "limit=5"]) == 0
    recs = [json.loads(line) for line in caps.read_text().splitlines()]
    test_ids = {it.id for it in load_prepared(out).items["test"]}
    assert len(recs) == 5 and {r["id"] for r in recs} <= test_ids
    assert all(len(r["next"]) == 7 and r["caption"] for r in recs)
    # a bad input through the CLI: exit 2 with the message, no traceback
    assert main(["data", "prepare", "source=ett", f"path={src}", f"out={tmp_path / 'x'}"]) == 2
    assert "is not a ett file" in capsys.readouterr().err


def test_lineup_training_on_a_prepared_folder_fails_before_any_model(tmp_path, monkeypatch):
    """`train lineup` with data.prepared: too many items asked is a DataError raised with model loads forbidden."""
    from captionrl.config import load_config
    from captionrl.train import lineup
    from captionrl.train.lineup import LineupConfig

    monkeypatch.setenv("CAPTIONRL_FORBID_MODEL_CALLS", "1")
    _, out = run_prepare(tmp_path, "jsonl", write_jsonl(tmp_path / "j"))
    cfg = load_config(LineupConfig, None, [f"data.prepared={out}", "data.n_train=50", "data.n_test=6", "reward.k=4",
                                           f"train.out_dir={tmp_path / 'run'}"])
    with pytest.raises(DataError) as err:
        lineup.run(cfg)
    assert err.value.field == "data.n_train" and "asks for 50 train items but only 12 exist" in str(err.value)


@pytest.mark.slow
def test_eval_identify_reads_the_prepared_lineups(tmp_path, embedded_backend, monkeypatch):
    """`eval identify prepared=DIR`: items captioned by the describer, lineups taken from the folder."""
    _, out = run_prepare(tmp_path, "jsonl", write_jsonl(tmp_path / "j"))
    monkeypatch.setattr("captionrl.eval.identification.backend_from_spec", lambda spec: embedded_backend)
    res = tmp_path / "ident"
    assert main(["eval", "identify", f"prepared={out}", f"out={res}", "captioner=none", "directions=[c2s]",
                 "ks=[3]", "controls=false"]) == 0
    prepared = load_prepared(out)
    lineups = {cs.item_id: cs.candidate_ids(3) for cs in prepared.sets}
    recs = [json.loads(line) for line in (res / "records.jsonl").read_text().splitlines()]
    assert len(recs) == 6 and {r["item_id"] for r in recs} == {it.id for it in prepared.items["test"]}
    assert all(r["candidate_ids"] == lineups[r["item_id"]] for r in recs)
    assert main(["eval", "identify", f"prepared={out}", f"out={res}", "ks=[8]"]) == 2  # K above the folder's


def test_ett_frequency_from_the_file_name(tmp_path):
    """ETTm1/ETTm2 are 15-minute data (4x the rows per month); an unknown name asks for freq."""
    short = write_ett(tmp_path / "m", name="ETTm2.csv", rows=14400)
    _fails(tmp_path, "ett", short, "57600 rows at freq='15min'")
    odd = write_ett(tmp_path / "o", name="transformer.csv", rows=14400)
    _fails(tmp_path, "ett", odd, "freq=h", exc=ConfigError)
    m, _ = run_prepare(tmp_path, "ett", odd, freq="h", length=96, horizon=0)
    assert m["splits"]["freq"] == "h" and m["windows"]["horizon"] == 0


def test_repeated_id_names_both_rows(tmp_path):
    rows = [[0, "[1, 2, 3, 4, 5]", "a"], [1, "[2, 3, 4, 5, 6]", "b"], [0, "[3, 4, 5, 6, 1]", "c"]]
    bad = _write_csv(tmp_path / "b" / "bedtime.csv", ["idx", "series", "annotations"], rows)
    _fails(tmp_path, "bedtime", bad, "bedtime.csv:row 2 and bedtime.csv:row 4")


def test_python_written_nan_is_named_as_nan_not_as_a_parse_error(tmp_path):
    rows = [[i, str([1.0, 2.0, float("nan") if i == 5 else 3.0, 4.0, 5.0]), "c"] for i in range(8)]
    bad = _write_csv(tmp_path / "b" / "bedtime.csv", ["idx", "series", "annotations"], rows)
    msg = _fails(tmp_path, "bedtime", bad, "bedtime.csv:row 7, column series", "missing or non-finite")
    assert "[2]" in msg


def test_too_many_test_items_names_a_count_it_can_take(tmp_path):
    """Only n_train takes null; the fix for another split offers a count, not a value its field refuses."""
    _, out = run_prepare(tmp_path, "jsonl", write_jsonl(tmp_path / "j"))
    cfg = LineupDataConfig(prepared=str(out), n_train=4, n_test=500)
    with pytest.raises(DataError) as err:
        build_lineup_data(cfg, 4, 0)
    assert err.value.field == "data.n_test" and "null" not in str(err.value)
    assert "set data.n_test:" in str(err.value) and "or less" in str(err.value)
