"""``captionrl data prepare``'s settings and the facts about each layout it reads (names, columns, where
to get the files). The lowest module of the package: the readers and the build import it."""

from __future__ import annotations

from dataclasses import dataclass

from captionrl.config import help_field
from captionrl.domains.candidates import RULES
from captionrl.domains.timeseries import DEFAULT_STATS, STATS
from captionrl.errors import ConfigError

SPLITS = ("train", "val", "test")
SOURCES = ("tsfragment", "bedtime", "cats-bench", "ett", "electricity", "saugeen", "jsonl")
FORECASTING = ("ett", "electricity", "saugeen")
LENGTH_RULES = ("bucket", "resample")
ETT_COLUMNS = ("date", "HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT")
WHERE_TO_GET = {
    "tsfragment": "the TSFragment-600K CSV files (columns Text, OT) from the authors' release",
    "bedtime": "the BEDTime CSV files (columns idx, series, annotations) from the BEDTime release",
    "cats-bench": "the CaTS-Bench folder (train/ and test/, each with 'time series' and gt_captions)",
    "ett": "ETTh1.csv, ETTh2.csv, ETTm1.csv or ETTm2.csv from github.com/zhouhaoyi/ETDataset",
    "electricity": "electricity.csv of the LTSF benchmark (Autoformer/LTSF-Linear dataset archive)",
    "saugeen": "the Saugeen River daily flow CSV (columns Date, saugeenRiverflows)",
    "jsonl": "a JSONL file of {id, series, caption?, next?, split?} lines (your own data)",
}


@dataclass
class PrepareConfig:
    """Settings of ``captionrl data prepare`` (all of them are saved in manifest.json)."""

    source: str = help_field("", f"benchmark layout of the input: {', '.join(SOURCES)}")
    path: str = help_field("", "your local copy: a file, or a folder (CaTS-Bench root; a folder of CSVs named *train*/*val*/*test*)")
    out: str = help_field("", "output folder of the prepared dataset (must be new or empty, unless overwrite)")
    download: bool = help_field(False, "not supported (machines may be offline): the error says what to fetch by hand")
    target: str = help_field("OT", "column of a wide CSV to use (ETT, Electricity): a name, or 'all' for every column")
    freq: str | None = help_field(None, "ETT only: 'h' (hourly) or '15min'; null = from the file name (ETTh*, ETTm*)")
    length: int = help_field(64, "window length of forecasting corpora; the target length of lengths=resample")
    stride: int | None = help_field(None, "step between forecasting windows (null = length, no overlap)")
    horizon: int = help_field(16, "values of the 'next' forecasting target after each window (0 = none)")
    lengths: str = help_field("bucket", "variable-length series: bucket (lineups within one exact length; buckets with < k items skipped) or resample (linear interpolation to length)")
    min_length: int = help_field(4, "series shorter than this are skipped (recorded in the manifest)")
    splits: list[float] = help_field([0.7, 0.1, 0.2], "train/val/test fractions where the benchmark has no split of its own (time-ordered for a long series, seeded by item for a collection)")
    val_fraction: float = help_field(0.1, "share of a benchmark's train split held out as val when it has none (CaTS-Bench, train/test files); seeded")
    n_train: int | None = help_field(None, "train items to keep (null = all; more than exist is an error)")
    n_val: int | None = help_field(None, "val items to keep (null = all; 0 = none)")
    n_test: int | None = help_field(None, "test items to keep (null = all; 0 = none)")
    k: int = help_field(4, "candidates per lineup (the item and k-1 distractors); smaller K are prefixes")
    rule: str = help_field("nearest", "distractor rule: nearest (summary statistics, the paper's) or random (ablation)")
    max_overlap: float = help_field(0.0, "largest fraction of time steps a same-source distractor may share with the item")
    stats: list[str] = help_field(list(DEFAULT_STATS), f"summary statistics of the nearest rule, from: {', '.join(STATS)}")
    mutual: bool = help_field(True, "apply the overlap limit among distractors too")
    fill: str = help_field("error", "missing values: error (named by file and row), or interpolate and record the gaps")
    seed: int = help_field(0, "seed of item splits, samples and distractor mining")
    overwrite: bool = help_field(False, "replace an existing prepared folder at out")
    quiet: bool = help_field(False, "no progress bar")

    def __post_init__(self) -> None:
        if self.source and self.source not in SOURCES:
            from captionrl.registry import suggest

            raise ConfigError("source", self.source, "unknown benchmark layout", suggest(self.source, list(SOURCES)))
        if self.lengths not in LENGTH_RULES:
            raise ConfigError("lengths", self.lengths, "unknown length rule", "use bucket or resample")
        if self.rule not in RULES:
            raise ConfigError("rule", self.rule, "unknown distractor rule", f"use one of {', '.join(RULES)}")
        if self.fill not in ("error", "interpolate"):
            raise ConfigError("fill", self.fill, "unknown policy", "use error or interpolate")
        if self.length < 2 or self.horizon < 0 or self.min_length < 2:
            raise ConfigError("length/horizon/min_length", (self.length, self.horizon, self.min_length),
                              "need length >= 2, horizon >= 0, min_length >= 2", "use e.g. length=64 horizon=16")
        if self.k < 2:
            raise ConfigError("k", self.k, "needs at least 2 candidates", "use k=4")
        if len(self.splits) != 3 or min(self.splits) < 0 or abs(sum(self.splits) - 1) > 1e-6:
            raise ConfigError("splits", self.splits, "need three non-negative fractions summing to 1", "use [0.7, 0.1, 0.2]")
        if not 0 <= self.val_fraction < 1:
            raise ConfigError("val_fraction", self.val_fraction, "must be in [0, 1)", "use 0.1 (or 0: no val split)")
        for name in ("n_train", "n_val", "n_test"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ConfigError(name, v, "must be >= 0 or null (all)", f"set {name}=null")
        if isinstance(self.stats, str):
            self.stats = [x.strip() for x in self.stats.split(",") if x.strip()]

    def wanted(self) -> dict[str, int | None]:
        return {"train": self.n_train, "val": self.n_val, "test": self.n_test}

