"""LineupRL's dataset: time-ordered windows, K-candidate lineups, TRL rows, charts; validated, no model.

The policy captions one window; the identification reward asks a verifier to find that window among K
candidates (the window and K-1 distractors mined from its own split). This module turns the data config,
K and the seed into those rows, either by mining (``domains.candidates.mine_within_splits``) or by reading
a candidates file written by ``captionrl candidates`` (the same lineups for the same settings), and checks
every candidate set before any model loads (``validate_candidate_set``, which the identification judge
also applies to every batch, so a bad set fails with the same message from either side).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from captionrl.config import help_field
from captionrl.domains.candidates import (
    CandidateSet,
    candidate_series,
    load_candidate_file,
    mine_within_splits,
)
from captionrl.domains.captioning import CAPTION_INSTRUCTION, caption_messages
from captionrl.domains.datasets import SPLITS, split_windows
from captionrl.domains.describe import overall_direction
from captionrl.domains.timeseries import render_chart, render_numbers
from captionrl.errors import ConfigError, DataError
from captionrl.types import Series


@dataclass
class LineupDataConfig:
    """Which series the captioner learns on, and how they are cut and shown."""

    corpus: str = help_field("embedded", "'embedded' (real series shipped in statsmodels), or a CSV / JSONL / CaTS-Bench folder path")
    series: list[str] | None = help_field(None, "embedded corpus only: names of the series to use (null = all)")
    window: int = help_field(32, "values per series window (the paper's charts: the benchmark's lengths)")
    stride: int | None = help_field(None, "step between windows (null = window, no overlap)")
    splits: list[float] = help_field([0.7, 0.1, 0.2], "time-ordered train/val/test fractions of each source series")
    precision: int = help_field(2, "decimals when printing values (to the captioner and the verifier)")
    normalise: str | None = help_field(None, "print values as they are (null), or zscore / minmax normalised")
    n_train: int | None = help_field(None, "training items (null = all train windows; a seeded sample otherwise)")
    n_val: int = help_field(0, "validation items for checkpoint selection by the training reward (0 = keep the last checkpoint)")
    n_test: int = help_field(32, "held-out test items of the final identification evaluation")
    candidates_file: str | None = help_field(None, "candidates.jsonl written by 'captionrl candidates' (mine there with --length data.window --stride data.stride) instead of mining here")
    distractors: str = help_field("nearest", "distractor rule: nearest (by summary statistics, the paper's) or random (ablation)")
    instruction: str | None = help_field(None, "the captioning instruction after the numbers (null = the default of captionrl.domains.captioning); a short-answer instruction lets a small model finish its caption within the token budget")
    prepared: str | None = help_field(None, "a folder written by 'captionrl data prepare': its splits, items and lineups (corpus, window, splits, candidates_file and distractors are then unused)")
    balance: str | None = help_field(None, "direction: draw the training items in equal numbers per overall direction (rises, falls, stays flat; as far as the split has them), so that one direction said of every window is right a third of the time, not as often as the corpus rises; null: a plain seeded sample")
    pin_endpoints: bool = help_field(False, "lay every distractor on its true window's start, end and trend, keeping the distractor's own shape between them (captionrl.domains.pinned), so that naming the start, the end and the direction no longer picks the window out and only what lies between them does; false: the mined windows as they are (the paper's)")
    test_corpora: list[str] | None = help_field(None, "held-out corpora whose windows are the test items, never trained on: names of captionrl.domains.held_out (fertility, stocks, eeg; other domains than the embedded corpus), drawn in equal numbers per corpus and reported per corpus; null: the test split of data.corpus (later windows of the training series)")
    rl_rescale_share: float = help_field(0.0, "share of the training lineups that RL and its preflight see rescaled to another level and spread, and mirrored for half of them (captionrl.domains.rescale): drawn per window from the run's seed, each window's map the one warm_start.rescale_share shows it under, applied to every candidate alike so the lineup's answer stays; a warm start taught on rescaled windows then meets the same windows in RL. The warm start and the held-out windows are unaffected (0 = every window as it is)")
    chart_size: list[int] = help_field([448, 448], "chart width and height in pixels for a chart-reading policy (policy.input: chart); the LineupRL authors' config draws 600x300")

    def __post_init__(self) -> None:
        if self.window < 4:
            raise ConfigError("data.window", self.window, "too short to caption", "set data.window: 32")
        if self.distractors not in ("nearest", "random"):
            raise ConfigError("data.distractors", self.distractors, "unknown rule", "use nearest or random")
        if len(self.splits) != 3 or abs(sum(self.splits) - 1) > 1e-6 or min(self.splits) <= 0:
            raise ConfigError("data.splits", self.splits, "need three positive fractions summing to 1", "set data.splits: [0.7, 0.1, 0.2]")
        if self.prepared and self.candidates_file:
            raise ConfigError("data.candidates_file", self.candidates_file, "set together with data.prepared",
                              "use one: a prepared folder carries its own lineups (set candidates_file: null)")
        if self.normalise not in (None, "zscore", "minmax"):
            raise ConfigError("data.normalise", self.normalise, "unknown normalisation", "use null, zscore or minmax")
        if self.balance not in (None, "direction"):
            raise ConfigError("data.balance", self.balance, "unknown balance", "use direction, or null")
        if not 0.0 <= self.rl_rescale_share <= 1.0:
            raise ConfigError("data.rl_rescale_share", self.rl_rescale_share, "must be within [0, 1]",
                              "use 0 (every window as it is) or 1 (every training lineup rescaled)")
        if self.rl_rescale_share > 0 and self.normalise is not None:
            raise ConfigError("data.rl_rescale_share", self.rl_rescale_share, f"is set with data.normalise="
                              f"{self.normalise}, which prints every window at one level and spread already",
                              "set data.rl_rescale_share: 0, or data.normalise: null")
        check_chart_size(self.chart_size, "data.chart_size")
        if self.test_corpora is not None:
            from captionrl.domains.held_out import HELD_OUT

            if isinstance(self.test_corpora, str):  # a key=value override: one name, or names with commas
                self.test_corpora = [c.strip() for c in self.test_corpora.split(",") if c.strip()]
            unknown = [c for c in self.test_corpora if c not in HELD_OUT]
            if unknown or not self.test_corpora:
                from captionrl.registry import suggest

                raise ConfigError("data.test_corpora", self.test_corpora,
                                  f"{unknown[0]!r} is not a held-out corpus" if unknown else "names no held-out corpus",
                                  suggest(unknown[0] if unknown else "", list(HELD_OUT)))
            if self.prepared or self.candidates_file:
                raise ConfigError("data.test_corpora", self.test_corpora, "set together with a prepared folder or "
                                  "a candidates file, which carry their own test items",
                                  "set data.test_corpora: null, or mine here (data.prepared and data.candidates_file null)")
        if self.n_val < 0 or self.n_test < 0 or (self.n_train is not None and self.n_train < 1):
            raise ConfigError("data.n_train/n_val/n_test", (self.n_train, self.n_val, self.n_test),
                              "item counts must be positive (n_val, n_test may be 0)", "set e.g. n_train: 64, n_test: 16")

    def wanted(self) -> dict[str, int | None]:
        """Items per split (``None``: all of them)."""
        return {"train": self.n_train, "val": self.n_val, "test": self.n_test}


@dataclass
class LineupData:
    """Items per split as dataset rows, plus the windows the evaluation needs (every possible candidate)."""

    rows: dict[str, list[dict[str, Any]]]
    pool: dict[str, Series]


# ---------------------------------------------------------------------- validation
def validate_values(values: Any, field: str) -> list[float]:
    """A candidate series as floats: one-dimensional, finite, at least 2 values."""
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1 or arr.size < 2 or not np.isfinite(arr).all():
        raise DataError(field, list(np.ravel(arr))[:6], "must be a finite series of at least 2 values",
                        "check the candidate sets (captionrl candidates) of this item")
    return arr.tolist()


def validate_candidate_set(cands: Sequence[Any], k: int, field: str, k_field: str = "k") -> list[list[float]]:
    """The first K candidates, validated: enough of them, finite, all of the true series' length.

    The dataset build calls it before any model loads; the identification judge calls it on every batch,
    so a candidate set from any source fails with the same message.
    """
    if len(cands) < k:
        raise DataError(field, len(cands), f"has {len(cands)} series but K={k}",
                        f"mine at least K={k} candidates per item, or lower {k_field}")
    out = [validate_values(c, f"{field}[{j}]") for j, c in enumerate(cands[:k])]
    lengths = [len(c) for c in out]
    if len(set(lengths)) != 1:
        raise DataError(field, lengths,
                        "series length mismatch in a candidate set (the verifier would tell them apart by length)",
                        "give every candidate the true series' length (re-mine with captionrl candidates)")
    return out


# ---------------------------------------------------------------------- the build
def build_lineup_data(cfg: LineupDataConfig, k: int, seed: int, *, k_field: str = "reward.k") -> LineupData:
    """Lineups per split (mined, or read from ``cfg.candidates_file`` or a ``cfg.prepared`` folder), a seeded
    sample of each split's items (more than exist is an error), and one validated TRL row per item; no model
    involved."""
    if cfg.prepared:
        sets, pool = _lineups_from_prepared(cfg, k, k_field)
    elif cfg.candidates_file:
        sets, pool = _lineups_from_file(cfg)
    else:
        sets, pool = _mine(cfg, k, seed)
    by_split: dict[str, list[CandidateSet]] = {s: [] for s in SPLITS}
    for cs in sets:
        by_split.setdefault(pool[cs.item_id].split or "train", []).append(cs)
    rows: dict[str, list[dict[str, Any]]] = {}
    for i, (split, n) in enumerate(cfg.wanted().items()):
        found = by_split.get(split, [])
        chosen = range(len(found))
        if n is not None and n > len(found):
            raise DataError(f"data.n_{split}", n, f"asks for {n} {split} items but only {len(found)} exist",
                            f"set data.n_{split}: {len(found)} or less{' (null = all)' if split == 'train' else ''}, "
                            "or prepare/mine more data")
        if split == "train" and cfg.balance == "direction":
            # the describer's and the claim checker's label (slope *and* endpoints), which the reward's and the
            # warm start's directions are: a slope-only label left 49 flat, 41 rising, 38 falling of 128
            labels = [overall_direction(np.asarray(pool[cs.item_id].values, dtype=float)) for cs in found]
            chosen = balanced_choice(labels, n, np.random.default_rng([seed, i]))
        elif split == "test" and cfg.test_corpora:  # as many windows of each held-out corpus as it allows
            chosen = balanced_choice([pool[cs.item_id].domain for cs in found], n, np.random.default_rng([seed, i]))
        elif n is not None and n < len(found):
            rng = np.random.default_rng([seed, i])
            chosen = sorted(rng.choice(len(found), size=n, replace=False).tolist())
        rows[split] = [lineup_row(cfg, pool[found[j].item_id], _distractors(cfg, found[j], pool), k, k_field)
                       for j in chosen]
    if not rows["train"]:
        where = ("data.candidates_file", cfg.candidates_file) if cfg.candidates_file else ("data.n_train", cfg.n_train)
        raise DataError(where[0], where[1], "no training items", "check data.corpus and data.window (and the file's splits)")
    return LineupData(rows=rows, pool=pool)


def _distractors(cfg: LineupDataConfig, cs: CandidateSet, pool: dict[str, Series]) -> list[Series]:
    """The item's distractors, pinned to its endpoints when ``cfg.pin_endpoints`` (added to ``pool``, so an
    evaluation finds every candidate by id)."""
    found = candidate_series(cs, pool, None)[1:]
    if not cfg.pin_endpoints:
        return found
    from captionrl.domains.pinned import pin_endpoints

    pinned = [pin_endpoints(pool[cs.item_id], d, cfg.precision) for d in found]
    pool.update({d.id: d for d in pinned})
    return pinned


def balanced_choice(labels: Sequence[str], n: int | None, rng: np.random.Generator) -> list[int]:
    """Indices of ``n`` items (all the balance allows when ``None``) spread as evenly as the labels allow: each
    label gets an equal share, a label with too few items gives its rest to the others; sorted, seeded."""
    groups: dict[str, list[int]] = {}
    for j, label in enumerate(labels):
        groups.setdefault(label, []).append(j)
    order = {k: rng.permutation(v).tolist() for k, v in sorted(groups.items())}
    total = len(labels) if n is None else min(n, len(labels))
    if n is None:  # equal numbers per label: the rarest label's count each
        total = min(len(v) for v in order.values()) * len(order)
    take = dict.fromkeys(order, 0)
    while sum(take.values()) < total:
        open_ = [k for k in order if take[k] < len(order[k])]
        for k in sorted(open_, key=lambda k: take[k])[: total - sum(take.values())]:
            take[k] += 1
    return sorted(j for k, idx in order.items() for j in idx[: take[k]])


def _mine(cfg: LineupDataConfig, k: int, seed: int) -> tuple[list[CandidateSet], dict[str, Series]]:
    """Window the corpus into time-ordered splits and mine the splits that are asked for."""
    from captionrl.domains.corpora import load_embedded_corpus

    corpus = load_embedded_corpus(cfg.series) if cfg.corpus == "embedded" and cfg.series else cfg.corpus
    windows = split_windows(corpus, cfg.window, stride=cfg.stride, fractions=cfg.splits)
    if cfg.test_corpora:  # whole series of other domains; the training series' own later windows stay unused
        from captionrl.domains.held_out import load_held_out
        from captionrl.domains.timeseries import window

        windows["test"] = [dataclasses.replace(w, split="test") for s in load_held_out(cfg.test_corpora)
                           for w in window(s, cfg.window, cfg.stride)]
    wanted = {split: windows.get(split, []) for split, n in cfg.wanted().items() if n != 0}
    for split, items in wanted.items():
        if len(items) < k:
            raise DataError(f"data.{split}", len(items), f"too few {split} windows for K={k} candidates",
                            "use a shorter data.window, a smaller data.stride, or more series")
    sets = mine_within_splits(wanted, k=k, rule=cfg.distractors, seed=seed, progress=False)
    return sets, {s.id: s for items in wanted.values() for s in items}


def _lineups_from_prepared(cfg: LineupDataConfig, k: int, k_field: str) -> tuple[list[CandidateSet], dict[str, Series]]:
    from captionrl.domains.prepare import load_prepared

    prepared = load_prepared(str(cfg.prepared), field="data.prepared")
    if prepared.k < k:
        raise DataError("data.prepared", str(cfg.prepared), f"holds lineups of K={prepared.k}, fewer than {k_field}={k}",
                        f"set {k_field}: {prepared.k} or less, or prepare again with k={k}")
    return prepared.sets, prepared.pool


def _lineups_from_file(cfg: LineupDataConfig) -> tuple[list[CandidateSet], dict[str, Series]]:
    path = Path(str(cfg.candidates_file))
    if not path.exists():
        raise ConfigError("data.candidates_file", str(path), "file not found",
                          "write it with `captionrl candidates --out DIR` (DIR/candidates.jsonl), or set null to mine here")
    sets, pool = load_candidate_file(path, field="data.candidates_file")
    if not sets:
        raise DataError("data.candidates_file", str(path), "is empty (no candidate sets)",
                        "write it with `captionrl candidates --out DIR`, or set null to mine here")
    odd = next((s for s in pool.values() if len(s) != cfg.window), None)
    if odd is not None:
        lengths = sorted({len(s) for s in pool.values()})
        raise DataError("data.candidates_file", str(path), f"holds windows of length {lengths}, not data.window="
                        f"{cfg.window} (first: item {odd.id}, {len(odd)} values)",
                        f"set data.window: {min(lengths)}, or mine again with captionrl candidates --length {cfg.window}")
    return sets, pool


def lineup_row(cfg: LineupDataConfig, item: Series, distractors: Sequence[Series], k: int,
               k_field: str = "reward.k") -> dict[str, Any]:
    """One dataset row in TRL's shape: chat ``prompt`` plus the columns the reward reads."""
    values = np.asarray(item.values, dtype=float).tolist()
    text, _ = render_numbers(np.asarray(values), precision=cfg.precision, normalise=cfg.normalise)
    cands = [values, *[np.asarray(d.values, dtype=float).tolist() for d in distractors]]
    validate_candidate_set(cands, k, f"candidates[{item.id}]", k_field=k_field)
    return {
        "prompt": caption_messages(text, len(values), instruction=cfg.instruction),
        "item_id": str(item.id),
        "series": values,
        "series_text": text,
        "candidates": cands[:k],
        "candidate_ids": [str(item.id), *[str(d.id) for d in distractors]][:k],
    }


def check_chart_size(size: Any, field: str) -> None:
    """A chart size is [width, height], two whole numbers of pixels, each at least 32."""
    if not (isinstance(size, (list, tuple)) and len(size) == 2 and all(isinstance(v, int) and v >= 32 for v in size)):
        raise ConfigError(field, size, "must be [width, height] in pixels, each >= 32", f"set {field}: [600, 300]")


def add_charts(rows: Sequence[Mapping[str, Any]], instruction: str | None = None,
               size: Sequence[int] = (448, 448)) -> list[dict[str, Any]]:
    """VLM policies read the chart (``size``: width, height in pixels): an ``image`` column and a prompt
    without the numbers."""
    out = []
    for r in rows:
        img = render_chart(np.asarray(r["series"]), size=(int(size[0]), int(size[1])))
        text = f"The chart shows a time series of {len(r['series'])} values. {instruction or CAPTION_INSTRUCTION}"
        out.append({**r, "prompt": [{"role": "user", "content": text}], "image": img})
    return out
