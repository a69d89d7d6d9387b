"""Distractor mining for identification (LineupRL Figure 2(c), Tables 3, 13, 14).

For each item x we choose K-1 distractors from a pool of other real windows of the same length. The
``nearest`` rule picks the windows closest to x in a space of summary statistics (mean, std, min, max,
first, last, slope, lag-1 autocorrelation by default), each standardised over the pool, so a caption must
name what really sets x apart; ``random`` is the Table 3/14 ablation.

Choices, and why:
- **Overlap limit** ``max_overlap=0.0`` (default): a distractor from the same source may share no time step
  with x (overlap = shared steps / length). Overlapping windows are shifted copies of x: a caption that
  names values at key points cannot separate them, so they would punish a correct caption. A pool of
  thousands of windows leaves plenty of non-overlapping neighbours, so the strict limit costs nothing.
  With ``mutual=True`` (default) the limit also holds between distractors, so the K-1 distractors are not
  near-copies of each other (a lineup of three shifts of one window is one distractor, not three).
  Windows with values identical to x (duplicated data) are never distractors: the question would have
  no answer.
- **Prefix consistency** (Table 13): mining at K_max and slicing gives the sets of every smaller K, and
  the greedy rules below are built so that mining at K directly gives exactly that prefix.
- **Determinism**: ``nearest`` breaks exact distance ties by a seeded permutation of the pool; ``random``
  draws from a generator seeded by ``(seed, crc32(item id))``, so an item's distractors do not depend on
  which other items are mined with it. The seed, rule, statistics and overlap limit are saved with every set.
- **Speed**: a k-d tree over the standardised statistics (scipy) finds the nearest windows, with the number
  of neighbours asked for sized from the overlap counts and doubled only for items that need more; the
  result equals the naive scan exactly (``mine_candidates_naive``, tested). 100,000 windows take seconds.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from captionrl.config import help_field
from captionrl.domains.timeseries import DEFAULT_STATS, STATS, Fill, summary_stats
from captionrl.errors import ConfigError, DataError
from captionrl.records import RecordWriter, read_jsonl, write_json
from captionrl.types import Series

RULES = ("nearest", "random")
_RANDOM_CHUNK = 64  # fixed draw size: the random stream must not depend on k (prefix consistency)


@dataclass(frozen=True)
class CandidateSet:
    """The distractors of one item, nearest first (or in draw order for ``random``), with how they were made.

    ``distances`` are Euclidean distances in the standardised statistic space, one per distractor, kept for
    both rules so the two can be compared. ``candidate_ids(k)`` is the identification lineup: the item and
    its first k-1 distractors.
    """

    item_id: str
    distractor_ids: tuple[str, ...]
    rule: str
    seed: int
    stats: tuple[str, ...]
    max_overlap: float
    mutual: bool = True
    distances: tuple[float, ...] = field(default=())

    @property
    def k(self) -> int:
        return len(self.distractor_ids) + 1

    def candidate_ids(self, k: int | None = None) -> list[str]:
        return [self.item_id, *self.prefix(k or self.k).distractor_ids]

    def prefix(self, k: int) -> CandidateSet:
        """The set for a smaller K (Table 13: mine once at K_max, slice)."""
        if not 2 <= k <= self.k:
            raise ConfigError("k", k, f"must be between 2 and the mined k={self.k}", f"mine again with k>={k}")
        return CandidateSet(self.item_id, self.distractor_ids[: k - 1], self.rule, self.seed, self.stats,
                            self.max_overlap, self.mutual, self.distances[: k - 1])

    def to_record(self) -> dict[str, Any]:
        return {"key": self.item_id, "item_id": self.item_id, "distractor_ids": list(self.distractor_ids),
                "k": self.k, "rule": self.rule, "seed": self.seed, "stats": list(self.stats),
                "max_overlap": self.max_overlap, "mutual": self.mutual, "distances": list(self.distances)}

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> CandidateSet:
        try:
            return cls(str(rec["item_id"]), tuple(rec["distractor_ids"]), str(rec["rule"]), int(rec["seed"]),
                       tuple(rec["stats"]), float(rec["max_overlap"]), bool(rec.get("mutual", True)),
                       tuple(float(d) for d in rec.get("distances", ())))
        except KeyError as exc:
            raise DataError("candidates record", sorted(rec), f"missing field {exc.args[0]!r}",
                            "regenerate candidates.jsonl with `captionrl candidates`") from None


def save_candidates(sets: Sequence[CandidateSet], path: str | Path, series: Mapping[str, Series]) -> int:
    """Append the sets not yet in ``path`` (JSONL keyed by item id, resumable); returns how many were written.

    This is the one candidate-file format: each line is a ``CandidateSet`` record plus the item's own
    window (``series``: its values; ``split``, ``source``, ``start``, ``domain``), so a file is
    self-contained when every distractor is itself an item of the file (``mine_within_splits`` makes it
    so). ``captionrl candidates`` writes it, LineupRL's ``data.candidates_file`` reads it
    (``load_candidate_file``), and so can an evaluation. The new lines go out in one write and one fsync
    (``RecordWriter.write_many``): 100,000 per-line fsyncs would take minutes.
    """
    with RecordWriter(path) as w:
        new = [cs for cs in sets if not w.has(cs.item_id)]
        w.write_many(_file_record(cs, series) for cs in new)
    return len(new)


def _file_record(cs: CandidateSet, series: Mapping[str, Series]) -> dict[str, Any]:
    if cs.item_id not in series:
        raise DataError("series", cs.item_id, "the item of a candidate set is not among the given windows",
                        "pass the windows the sets were mined from")
    s = series[cs.item_id]
    return {**cs.to_record(), "split": s.split, "series": s.values.tolist(), "source": s.source,
            "start": s.start, "domain": s.domain}


def load_candidate_file(path: str | Path, field: str = "candidates") -> tuple[list[CandidateSet], dict[str, Series]]:
    """Candidate sets and the windows they name (id -> ``Series``, with its ``split``) from one file.

    Every distractor must be an item of the same file (its values are on that item's line); a line
    without its ``series`` or a distractor the file does not hold fails naming the line and the fix.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(field, str(p), "does not exist", "run `captionrl candidates --out DIR` first")
    sets: list[CandidateSet] = []
    series: dict[str, Series] = {}
    for n, rec in enumerate(read_jsonl(p), start=1):
        where = f"{p.name}:{n}"
        if "series" not in rec:
            raise DataError(f"{where}.series", sorted(rec), "the line has no series values",
                            "write the file with `captionrl candidates` (one line per item with its series)")
        cs = CandidateSet.from_record(rec)
        if cs.item_id in series:
            raise DataError(f"{where}.item_id", cs.item_id, "repeats an earlier line's item_id (which lineup counts?)",
                            "give every item one line (captionrl candidates writes each once)")
        series[cs.item_id] = Series(id=cs.item_id, values=np.asarray(rec["series"], dtype=float),
                                    source=str(rec.get("source") or cs.item_id), start=int(rec.get("start", 0)),
                                    domain=str(rec.get("domain", "")), split=str(rec.get("split", "")))
        sets.append(cs)
    for n, cs in enumerate(sets, start=1):
        missing = [d for d in cs.distractor_ids if d not in series]
        if missing:
            raise DataError(f"{p.name}:{n}.distractor_ids", missing[:3], "names windows that are not items of the file",
                            "mine items and distractors from the same windows (captionrl candidates does)")
    return sets, series


def candidate_series(cs: CandidateSet, by_id: Mapping[str, Series], k: int | None = None) -> list[Series]:
    """The lineup as series (item first); fails clearly when the pool it was mined from is not given."""
    out = []
    for sid in cs.candidate_ids(k):
        if sid not in by_id:
            raise DataError("candidate id", sid, "not in the given series", "window the same corpus with the "
                            "same length and stride as when mining")
        out.append(by_id[sid])
    return out


# ------------------------------------------------------------------------------------------- mining
@dataclass
class _Arrays:
    """Pool or items as arrays: standardised statistics, time keys, duplicate groups.

    ``key = source_code * span + start``: two windows of one source conflict when their keys differ by
    less than ``lim`` (see ``_limit``), and windows of different sources never do, because ``span``
    exceeds every start difference by more than ``lim``. ``dup`` is equal for windows with identical values.
    """

    ids: list[str]
    z: np.ndarray
    key: np.ndarray
    dup: np.ndarray


def _check(items: Sequence[Series], pool: Sequence[Series], k: int, rule: str, max_overlap: float,
           stats: Sequence[str]) -> int:
    if rule not in RULES:
        raise ConfigError("rule", rule, "unknown distractor rule", f"use one of {', '.join(RULES)}")
    if not isinstance(k, int) or k < 2:
        raise ConfigError("k", k, "needs at least 2 candidates (the item and one distractor)", "use k>=2, e.g. 4")
    if not 0.0 <= max_overlap <= 1.0:
        raise ConfigError("max_overlap", max_overlap, "must be a fraction in [0, 1]", "use 0.0 (no shared step)")
    bad = [s for s in stats if s not in STATS]
    if bad or not stats:
        raise ConfigError("stats", list(stats), f"unknown statistic(s) {bad}" if bad else "empty list",
                          f"choose from {', '.join(STATS)}")
    if not pool:
        raise DataError("pool", [], "is empty", "pass the windows to draw distractors from")
    if k > len(pool):
        raise DataError("k", k, f"is larger than the pool of {len(pool)} window(s): a lineup needs K distinct "
                        "windows", f"use a K of at most {len(pool)}, or a larger pool (more series, a smaller stride)")
    length = len(pool[0])
    for name, seq in (("pool", pool), ("items", items)):
        for i, s in enumerate(seq):
            if len(s) != length:
                raise DataError(f"{name}[{i}] ({s.id})", len(s), f"length differs from the pool's {length} "
                                f"(pool[0] = {pool[0].id})", "window items and pool with the same --length")
    return length


def _build(items: Sequence[Series], pool: Sequence[Series], stats: Sequence[str], lim: int,
           ) -> tuple[_Arrays, _Arrays, bool]:
    """Arrays of pool and items in the pool's standardised statistic space; also whether the pool holds
    duplicated windows (only then must distractors be checked against each other for equal values)."""
    xp = np.stack([s.values for s in pool])
    raw = summary_stats(xp, stats)
    mu, sd = raw.mean(axis=0), raw.std(axis=0)
    sd = np.where(sd > 0, sd, 1.0)
    zi = (summary_stats(np.stack([s.values for s in items]), stats) - mu) / sd if items else np.zeros((0, len(stats)))
    codes: dict[str, int] = {}
    src_p = np.array([codes.setdefault(s.source or s.id, len(codes)) for s in pool], dtype=np.int64)
    src_i = np.array([codes.get(s.source or s.id, -1 - i) for i, s in enumerate(items)], dtype=np.int64)
    st_p = np.array([s.start for s in pool], dtype=np.int64)
    st_i = np.array([s.start for s in items], dtype=np.int64)
    lo = min(st_p.min(), st_i.min() if items else st_p.min())
    span = max(st_p.max(), st_i.max() if items else st_p.max()) - lo + lim + 1
    groups: dict[bytes, int] = {}
    dup_p = np.array([groups.setdefault(s.values.tobytes(), len(groups)) for s in pool], dtype=np.int64)
    has_dups = len(groups) < len(pool)
    dup_i = np.array([groups.setdefault(s.values.tobytes(), len(groups)) for s in items], dtype=np.int64)
    return (_Arrays([s.id for s in pool], (raw - mu) / sd, src_p * span + (st_p - lo), dup_p),
            _Arrays([s.id for s in items], zi, src_i * span + (st_i - lo), dup_i), has_dups)


def _limit(length: int, max_overlap: float) -> int:
    """Windows of one source conflict when their starts differ by less than this many steps.

    Overlap fraction = (length - |delta|) / length > max_overlap  <=>  |delta| < length * (1 - max_overlap).
    """
    return math.ceil(length * (1.0 - max_overlap) - 1e-9)


def _conflicts(key_a: Any, dup_a: Any, key_b: Any, dup_b: Any, lim: int, dups: bool = True) -> Any:
    """Broadcast: True where b may not sit in a lineup with a (overlap above the limit, or same values)."""
    out = np.abs(key_a - key_b) < lim
    return out | (dup_a == dup_b) if dups else out


def _not_enough(item_id: str, got: int, need: int, n: int) -> DataError:
    return DataError(f"candidates[{item_id}]", got, f"only {got} eligible distractor(s) in a pool of {n}; need "
                     f"{need}", "use a larger pool (smaller --stride, more series), a smaller --k or a higher "
                     "--max-overlap")


def mine_candidates(items: Sequence[Series], pool: Sequence[Series], k: int = 4, rule: str = "nearest",
                    seed: int = 0, max_overlap: float = 0.0, stats: Sequence[str] = DEFAULT_STATS,
                    mutual: bool = True, progress: bool = True, batch: int = 2048) -> list[CandidateSet]:
    """K-1 distractors for each item from ``pool`` (see the module docstring for the rules and choices).

    ``items`` may be the pool itself (every window gets a lineup) or other windows of the same length
    (test items against a training pool). Raises ``DataError`` on a length mismatch or when the pool has
    too few eligible windows for an item.
    """
    stats = tuple(stats)
    length = _check(items, pool, k, rule, max_overlap, stats)
    if not items:
        return []
    lim = _limit(length, max_overlap)
    p, it, dups = _build(items, pool, stats, lim)
    need = k - 1
    if rule == "random":
        chosen = _mine_random(it, p, need, seed, lim, mutual, dups, progress)
    else:
        chosen = _mine_nearest(it, p, need, lim, mutual, dups, seed, progress, batch)
    idx = np.asarray(chosen, dtype=np.int64).reshape(len(items), need)
    dist = np.sqrt(((p.z[idx] - it.z[:, None, :]) ** 2).sum(axis=-1)).tolist()
    ids = p.ids
    return [CandidateSet(it.ids[i], tuple(ids[j] for j in row), rule, seed, stats, max_overlap, mutual,
                         tuple(dist[i])) for i, row in enumerate(idx.tolist())]


def mine_within_splits(windows: Mapping[str, Sequence[Series]], k: int = 4, rule: str = "nearest", seed: int = 0,
                       max_overlap: float = 0.0, stats: Sequence[str] = DEFAULT_STATS, mutual: bool = True,
                       progress: bool = True) -> list[CandidateSet]:
    """Each split's windows mined against themselves: an item's distractors come from its own split only, so
    no test window ever lines up with a training window. ``captionrl candidates`` and LineupRL's dataset
    build both mine this way, so a candidates file and on-the-fly mining give the same lineups."""
    out: list[CandidateSet] = []
    for split, items in windows.items():
        if not items:
            continue
        if len(items) < k:
            raise DataError(f"windows[{split}]", len(items), f"too few {split} windows for K={k} candidates",
                            "use a shorter window, a smaller stride, more series, or a smaller k")
        out.extend(mine_candidates(items, items, k=k, rule=rule, seed=seed, max_overlap=max_overlap, stats=stats,
                                   mutual=mutual, progress=progress))
    return out


def _tie_rank(n: int, seed: int) -> np.ndarray:
    """Seeded priority that breaks exact distance ties (identical statistics)."""
    return np.random.default_rng(seed).permutation(n)


def _mine_nearest(it: _Arrays, p: _Arrays, need: int, lim: int, mutual: bool, dups: bool, seed: int,
                  progress: bool, batch: int) -> list[list[int]]:
    """Nearest rule, vectorised over a batch of items: tree query, then ``need`` greedy steps on arrays.

    Each greedy step takes every row's first surviving neighbour and drops the neighbours that conflict
    with it, which is exactly the sequential scan of ``mine_candidates_naive``. A row is final when the
    last window it took is strictly nearer than its m-th neighbour (nothing unseen could precede it);
    otherwise it is asked again with twice as many neighbours.
    """
    from scipy.spatial import cKDTree

    n = len(p.ids)
    tie = _tie_rank(n, seed)
    tree = cKDTree(p.z)
    keys = np.sort(p.key)
    # The item's own exclusions (same-source windows within lim steps), +1 for a duplicate of the item,
    # plus a margin; rows whose greedy scan needs more are asked again with twice as many neighbours.
    base = np.searchsorted(keys, it.key + lim, side="left") - np.searchsorted(keys, it.key - lim, side="right")
    want = np.minimum(n, base + 1 + 2 * need + 8)
    result: list[list[int]] = [[] for _ in it.ids]
    todo = np.arange(len(it.ids))
    bar = tqdm(total=len(todo), desc="mining nearest distractors", disable=not progress, unit="item")
    while todo.size:
        retry: list[np.ndarray] = []
        order = todo[np.argsort(want[todo], kind="stable")]
        for b0 in range(0, order.size, batch):
            rows = order[b0:b0 + batch]
            m = int(want[rows].max())
            dist, nbr = tree.query(it.z[rows], k=m)
            dist, nbr = np.asarray(dist).reshape(len(rows), m), np.asarray(nbr).reshape(len(rows), m)
            srt = np.lexsort((tie[nbr], dist), axis=-1)
            nbr, dist = np.take_along_axis(nbr, srt, -1), np.take_along_axis(dist, srt, -1)
            key, dup = p.key[nbr], p.dup[nbr]
            alive = ~_conflicts(it.key[rows, None], it.dup[rows, None], key, dup, lim)
            chosen = np.full((len(rows), need), -1, dtype=np.int64)
            last = np.zeros(len(rows), dtype=np.int64)
            r_all = np.arange(len(rows))
            for step in range(need):
                pos = alive.argmax(axis=1)
                has = alive[r_all, pos]
                chosen[has, step] = nbr[has, pos[has]]
                last[has] = pos[has]
                if mutual:
                    hit = _conflicts(key[r_all, pos][:, None], dup[r_all, pos][:, None], key, dup, lim, dups)
                    alive &= ~(hit & has[:, None])
                alive[r_all[has], pos[has]] = False
            complete = chosen[:, -1] >= 0
            final = complete & (dist[r_all, last] < dist[:, -1] * (1 - 1e-9)) if m < n else np.ones_like(complete)
            for r in np.flatnonzero(final):
                if not complete[r]:
                    raise _not_enough(it.ids[rows[r]], int((chosen[r] >= 0).sum()), need, n)
                result[rows[r]] = chosen[r].tolist()
            bar.update(int(final.sum()))
            retry.append(rows[~final])
        todo = np.concatenate(retry)
        want[todo] = np.minimum(n, want[todo] * 2)
    bar.close()
    return result


def _mine_random(it: _Arrays, p: _Arrays, need: int, seed: int, lim: int, mutual: bool, dups: bool,
                 progress: bool) -> list[list[int]]:
    """Random rule: uniform draws per item from a generator seeded by (seed, crc32(item id)), rejecting
    conflicting windows; the draws come in fixed-size chunks so a larger k extends a smaller k's list."""
    n = len(p.ids)
    key, dup = p.key.tolist(), p.dup.tolist()
    out: list[list[int]] = []
    for i in tqdm(range(len(it.ids)), desc="drawing random distractors", disable=not progress, unit="item"):
        rng = np.random.default_rng([seed, zlib.crc32(it.ids[i].encode("utf-8"))])
        members = [(int(it.key[i]), int(it.dup[i]))]
        chosen: list[int] = []
        seen: set[int] = set()
        while len(chosen) < need:
            if len(seen) >= n:
                raise _not_enough(it.ids[i], len(chosen), need, n)
            for j in rng.integers(0, n, size=_RANDOM_CHUNK).tolist():
                if j in seen:
                    continue
                seen.add(j)
                check = members if mutual else members[:1]
                if any(abs(k - key[j]) < lim or d == dup[j] for k, d in check):
                    continue
                chosen.append(j)
                members.append((key[j], dup[j] if dups else -1 - j))
                if len(chosen) == need:
                    break
        out.append(chosen)
    return out


def mine_candidates_naive(items: Sequence[Series], pool: Sequence[Series], k: int = 4, seed: int = 0,
                          max_overlap: float = 0.0, stats: Sequence[str] = DEFAULT_STATS,
                          mutual: bool = True) -> list[CandidateSet]:
    """The ``nearest`` rule by a plain scan, one item at a time: the reference the fast path must equal.

    Kept for tests and ``bench/bench_candidates.py`` (the speed-up is measured against it); it computes
    every distance, sorts the whole pool and walks it in Python, O(n log n) per item.
    """
    stats = tuple(stats)
    length = _check(items, pool, k, "nearest", max_overlap, stats)
    lim = _limit(length, max_overlap)
    p, it, _ = _build(items, pool, stats, lim)
    tie = _tie_rank(len(p.ids), seed)
    out = []
    for i, sid in enumerate(it.ids):
        dist = np.sqrt(((p.z - it.z[i]) ** 2).sum(axis=-1))
        chosen: list[int] = []
        for j in np.lexsort((tie, dist)).tolist():
            members = [i] if not mutual else [i, *chosen]
            keys = [it.key[i]] + [p.key[c] for c in members[1:]]
            dupl = [it.dup[i]] + [p.dup[c] for c in members[1:]]
            if any(abs(kk - p.key[j]) < lim or dd == p.dup[j] for kk, dd in zip(keys, dupl, strict=True)):
                continue
            chosen.append(j)
            if len(chosen) == k - 1:
                break
        if len(chosen) < k - 1:
            raise _not_enough(sid, len(chosen), k - 1, len(p.ids))
        out.append(CandidateSet(sid, tuple(p.ids[j] for j in chosen), "nearest", seed, stats, max_overlap, mutual,
                                tuple(float(dist[j]) for j in chosen)))
    return out


# ---------------------------------------------------------------------------------------------- CLI
@dataclass
class CandidatesConfig:
    """``captionrl candidates``: window a corpus into time-ordered splits and mine each split's lineups."""

    out: str | None = help_field(None, "output folder: candidates.jsonl (the file data.candidates_file reads), summary.json, table.md")
    corpus: str = help_field("embedded", "'embedded' (statsmodels series, no download) or a CSV/JSONL file or CaTS-Bench folder")
    length: int = help_field(32, "window length (every candidate has this length; LineupRL's data.window)")
    stride: int | None = help_field(None, "window stride (null: length, no overlap; LineupRL's data.stride)")
    splits: list[float] = help_field([0.7, 0.1, 0.2], "time-ordered train/val/test fractions of each source series; distractors come from the item's own split")
    k: int = help_field(4, "candidates per lineup: the item and k-1 distractors (a smaller K uses a prefix)")
    rule: str = help_field("nearest", "nearest by statistics, or random (ablation)")
    seed: int = help_field(0, "seed for tie breaking (nearest) or draws (random)")
    max_overlap: float = help_field(0.0, "largest fraction of time steps a same-source distractor may share with the item")
    stats: list[str] = help_field(list(DEFAULT_STATS), f"summary statistics of the nearest rule, from: {', '.join(STATS)}")
    mutual: bool = help_field(True, "apply the overlap limit among distractors too, not only between item and distractor")
    target: str = help_field("OT", "target column of a wide CSV (ETT, LTSF)")
    fill: Fill = help_field("error", "missing values in a user file: error, or interpolate and report the gaps")
    quiet: bool = help_field(False, "no progress bar")

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ConfigError("rule", self.rule, "unknown distractor rule", f"use one of {', '.join(RULES)}")
        if self.fill not in ("error", "interpolate"):
            raise ConfigError("fill", self.fill, "unknown policy", "use error or interpolate")
        if isinstance(self.stats, str):
            self.stats = [x.strip() for x in self.stats.split(",") if x.strip()]
        if len(self.splits) != 3 or abs(sum(self.splits) - 1) > 1e-6 or min(self.splits) <= 0:
            raise ConfigError("splits", self.splits, "need three positive fractions summing to 1", "use [0.7, 0.1, 0.2]")


CONFIG = CandidatesConfig


def run_command(cfg: CandidatesConfig) -> int:
    """Mine, write ``candidates.jsonl`` (resumable), ``summary.json`` and ``table.md``; print one line."""
    if not cfg.out:
        raise ConfigError("out", cfg.out, "is required", "give an output folder, e.g. --out runs/candidates")
    from collections import Counter

    from captionrl.domains.corpora import load_corpus
    from captionrl.domains.datasets import split_windows

    stride = cfg.stride or cfg.length
    config = {"corpus": str(cfg.corpus), "length": cfg.length, "stride": stride, "splits": list(cfg.splits),
              "k": cfg.k, "rule": cfg.rule, "seed": cfg.seed, "max_overlap": cfg.max_overlap, "mutual": cfg.mutual,
              "stats": list(cfg.stats), "target": cfg.target, "fill": cfg.fill}
    out = Path(str(cfg.out))
    summary_path = out / "summary.json"
    if summary_path.is_file():
        import json

        old = json.loads(summary_path.read_text()).get("config", {})
        if old and old != config:
            changed = sorted(k for k in config if old.get(k) != config[k])
            raise ConfigError("out", str(out), f"holds candidates mined with other settings ({', '.join(changed)})",
                              "use a new --out folder, or the same settings to resume")
    series = load_corpus(cfg.corpus, target=cfg.target, fill=cfg.fill)
    windows = split_windows(series, cfg.length, stride=stride, fractions=cfg.splits)
    by_id = {w.id: w for ws in windows.values() for w in ws}
    sets = mine_within_splits(windows, k=cfg.k, rule=cfg.rule, seed=cfg.seed, max_overlap=cfg.max_overlap,
                              stats=cfg.stats, mutual=cfg.mutual, progress=not cfg.quiet)
    written = save_candidates(sets, out / "candidates.jsonl", by_id)
    domain = {w.id: w.domain for w in by_id.values()}
    dist = np.array([cs.distances for cs in sets])
    same = np.mean([[domain[d] == domain[cs.item_id] for d in cs.distractor_ids] for cs in sets])
    row = {"system": cfg.rule, "items": len(sets), "k": cfg.k, "mean_distance": float(dist.mean()),
           "median_distance": float(np.median(dist)), "same_domain_share": float(same)}
    columns = ["system", "items", "k", "mean_distance", "median_distance", "same_domain_share"]
    write_json(summary_path, {"protocol": "candidates", "rows": [row], "columns": columns, "config": config,
                              "items_per_split": {k: len(v) for k, v in windows.items()},
                              "windows_per_domain": dict(Counter(w.domain for w in by_id.values())),
                              "series": len(series)})
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines.append("| " + " | ".join(f"{row[c]:.4f}" if isinstance(row[c], float) else str(row[c]) for c in columns)
                 + " |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print(f"{len(sets)} candidate sets ({written} new) from {len(by_id)} windows of {len(series)} series "
          f"-> {out / 'candidates.jsonl'}; mean distance {row['mean_distance']:.3f}, "
          f"same-domain share {row['same_domain_share']:.2f}")
    return 0
