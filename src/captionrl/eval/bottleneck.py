"""Information bottleneck (LineupRL Table 2, Criterion 3): how much of a series survives in its caption.

A caption-only predictor, which never sees the series, learns caption -> target on training items and is
scored by test MSE on held-out items:

- ``reconstruct``: the target is the captioned window itself;
- ``forecast``: the target is the window that follows it (``next``), which the caption never saw.

**Targets are standardised per corpus** with the mean and standard deviation of the *training* split's
series values (one scalar pair per corpus, never per item), so a predictor that knows nothing and outputs
the corpus mean scores an MSE near 1, the scale of the paper's table, and corpora of different units
share one table. Window-to-window level changes stay in the target: that is what a caption must carry.

The caption is embedded by a frozen text encoder (all-MiniLM-L6-v2 shipped offline, see
``captionrl.encoders``) and a small head (an MLP with early stopping on a validation slice of the
training split, or ridge regression) is fitted on top, once per predictor seed (5 by default). Seeds
change the head's initialisation, dropout and validation slice only, and seed ``s`` is the same for every
captioner, so captioners are compared by paired tests across seeds (``captionrl.eval.stats``).

Baselines in the same table: ``naive`` (last-value persistence for forecasting, the mean training
window for reconstruction; it reads the series, it is the no-caption yardstick), ``empty caption``
(every caption is the empty string) and ``shuffled caption`` (captions permuted among items of the same
corpus and split, with a recorded seed, in training and test alike). The controls should land near the
mean-window predictor; a captioner helps only as far as it lands below them.

Every (system, task, corpus, seed) result is a record in ``records.jsonl``; rerunning with the same
``out`` skips finished ones, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from captionrl.config import help_field
from captionrl.errors import ConfigError, DataError
from captionrl.eval.common import split_spec
from captionrl.eval.result import EvalResult, result_text, write_result
from captionrl.records import RecordWriter, check_caption, digest, read_jsonl

logger = logging.getLogger(__name__)

PROTOCOL = "bottleneck"
TASKS = ("forecast", "reconstruct")
NAIVE, EMPTY, SHUFFLED = "naive", "empty caption", "shuffled caption"
DESCRIBER = "describer"
EMBEDDED_CORPORA = ("co2", "sunspots", "elec_equip", "elnino")


# ----------------------------------------------------------------------------------------------- data
@dataclass(frozen=True)
class Item:
    """One captioned window: its values, the following window (``next``, optional) and its split."""

    id: str
    corpus: str
    series: np.ndarray
    next: np.ndarray | None
    split: str  # "train" or "test"


@dataclass
class BottleneckConfig:
    """Settings of one bottleneck run (saved as ``summary.json["config"]``)."""

    captions: list[str] = help_field([], "JSONL files, one line per item {id, series, caption, next?, corpus?, split?}, one per captioner ([NAME=]FILE); empty: the embedded corpus captioned by the deterministic describer")
    out: str = help_field("runs/eval-bottleneck", "output folder (rerun with the same folder to resume)")
    corpora: list[str] = help_field(list(EMBEDDED_CORPORA), "embedded series of the default run (no captions given)")
    length: int = help_field(16, "window length of the embedded default")
    horizon: int = help_field(8, "forecast horizon of the embedded default")
    max_windows: int = help_field(150, "about this many windows per corpus in the embedded default")
    quiet: bool = help_field(False, "no progress bars")
    tasks: list[str] = help_field(list(TASKS), "which targets to predict: forecast, reconstruct")
    seeds: list[int] = help_field([0, 1, 2, 3, 4], "predictor seeds, e.g. --seeds 0 1 2 3 4 (the paper uses 5)")
    encoder: str = help_field("minilm", "caption encoder: 'minilm' (offline all-MiniLM-L6-v2) or an HF encoder folder")
    head: str = help_field("mlp", "regression head on the caption embedding: 'mlp' or 'ridge'")
    hidden: int = help_field(256, "MLP hidden width")
    lr: float = help_field(1e-3, "MLP learning rate (AdamW, full batch)")
    weight_decay: float = help_field(1e-2, "MLP weight decay")
    dropout: float = help_field(0.1, "MLP dropout")
    max_epochs: int = help_field(1000, "MLP epoch limit")
    patience: int = help_field(50, "stop after this many epochs without a better validation loss")
    val_fraction: float = help_field(0.2, "share of training items held out (per seed) for early stopping")
    ridge_alpha: float = help_field(1.0, "ridge penalty when head='ridge'")
    test_fraction: float = help_field(0.3, "test share for items without a 'split' field")
    split_seed: int = help_field(0, "seed of the train/test split for items without a 'split' field")
    shuffle_seed: int = help_field(0, "seed of the shuffled-caption control")
    shuffle_from: str = help_field("", "captioner whose captions are shuffled (default: the first)")
    controls: bool = help_field(True, "also run the naive, empty-caption and shuffled-caption baselines")
    reference: str = help_field("", "row the Rel. column divides by (empty: no Rel. column)")

    def __post_init__(self) -> None:
        bad = [t for t in self.tasks if t not in TASKS]
        if bad or not self.tasks:
            raise ConfigError("tasks", self.tasks, "unknown or empty task list", f"use some of {list(TASKS)}")
        if not self.seeds:
            raise ConfigError("seeds", self.seeds, "needs at least one seed", "use e.g. --seeds 0 1 2 3 4")
        if self.head not in ("mlp", "ridge"):
            raise ConfigError("head", self.head, "unknown head", "use 'mlp' or 'ridge'")
        if not 0.0 < self.val_fraction < 0.5:
            raise ConfigError("val_fraction", self.val_fraction, "must be in (0, 0.5)", "use e.g. 0.2")
        if not 0.0 < self.test_fraction < 1.0:
            raise ConfigError("test_fraction", self.test_fraction, "must be in (0, 1)", "use e.g. 0.3")

    def fingerprint(self) -> str:
        """Hash of what changes a predictor's result (not the list of seeds or tasks)."""
        keys = ("encoder", "head", "hidden", "lr", "weight_decay", "dropout", "max_epochs", "patience",
                "val_fraction", "ridge_alpha", "test_fraction", "split_seed", "shuffle_seed")
        d = asdict(self)
        return digest({k: d[k] for k in keys})[:10]


CONFIG = BottleneckConfig


@dataclass
class Study:
    """Items (shared by all systems) and each system's caption per item id."""

    items: list[Item]
    captions: dict[str, dict[str, str]] = field(default_factory=dict)
    source: str = ""


def _array(value: Any, field_name: str) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise DataError(field_name, value, "is not a list of numbers", "write the values as a JSON list") from None
    if arr.ndim != 1 or arr.size < 2 or not np.isfinite(arr).all():
        raise DataError(field_name, value, "must be a flat list of at least 2 finite numbers",
                        "clean the item (no NaN, no nesting) or drop it")
    return arr


def parse_captions_arg(specs: Sequence[str]) -> list[tuple[str, Path]]:
    """``a.jsonl`` or ``name=path`` -> (system name, path); names default to file stems and must differ."""
    out: list[tuple[str, Path]] = []
    for spec in specs:
        name, path = split_spec(spec)
        p = Path(path)
        if not p.exists():
            raise DataError("--captions", spec, "file not found", "give JSONL files with {id, series, caption, next?}")
        out.append((name, p))
    names = [n for n, _ in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError("--captions", specs, f"system names {dup} repeat",
                          "name them explicitly: --captions mine=a/items.jsonl theirs=b/items.jsonl")
    return out


def load_caption_files(files: Sequence[tuple[str, Path]], cfg: BottleneckConfig) -> Study:
    """Read captioner files (one JSONL line per item: ``{id, series, caption, next?, corpus?, split?}``).

    Items are matched by ``id`` across files and their series must agree; only ids present in every file
    are evaluated (so every captioner is scored on the same items). Items without ``split`` are split
    per corpus into train/test by a seeded permutation of their sorted ids.
    """
    items: dict[str, Item] = {}
    captions: dict[str, dict[str, str]] = {}
    for name, path in files:
        caps: dict[str, str] = {}
        for n, rec in enumerate(read_jsonl(path, unique_key="id"), 1):
            where = f"{path.name}:{n}"
            for key in ("id", "series", "caption"):
                if key not in rec:
                    raise DataError(f"{where}.{key}", sorted(rec), f"missing field {key!r}",
                                    "write one JSON object per line with id, series, caption (and next)")
            iid = str(rec["id"])
            if iid in caps:
                raise DataError(f"{where}.id", iid, "repeats an earlier line's id (which caption counts?)",
                                "give every item one line per captions file")
            series = _array(rec["series"], f"{where}.series")
            nxt = _array(rec["next"], f"{where}.next") if rec.get("next") is not None else None
            first = next(iter(items.values()), None)
            if first is not None and len(series) != len(first.series):
                raise DataError(f"{where}.series", len(series), f"length differs from the {len(first.series)} values "
                                f"of item {first.id} (a predictor needs one input and target length)",
                                "window every item to the same length")
            split = str(rec.get("split") or "")
            if split and split not in ("train", "test", "val"):
                raise DataError(f"{where}.split", split, "unknown split", "use train, val or test (val counts as train)")
            item = Item(iid, str(rec.get("corpus") or rec.get("domain") or "all"), series, nxt,
                        "train" if split == "val" else split)
            if iid in items:
                old = items[iid]
                if old.series.shape != series.shape or not np.allclose(old.series, series):
                    raise DataError(f"{where}.series", iid, "differs from the same id in another captions file",
                                    "pass files captioning the same items (same id -> same series)")
            else:
                items[iid] = item
            caps[iid] = check_caption(rec["caption"], f"{where}.caption", allow_none=True)
        if not caps:
            raise DataError("--captions", str(path), "holds no items", "write one JSON object per line")
        captions[name] = caps
    common = set.intersection(*(set(c) for c in captions.values()))
    if not common:
        raise DataError("--captions", [str(p) for _, p in files], "no item id is shared by every file",
                        "caption the same items with every captioner")
    for name, c in captions.items():
        extra = sorted(set(c) - common)
        if extra:
            logger.warning(f"note: {len(extra)} item(s) of {name} skipped (not in every captions file, so not comparable): "
                           f"{', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}")
    chosen = [items[i] for i in sorted(common)]
    return Study(_assign_splits(chosen, cfg), {n: {i: c[i] for i in common} for n, c in captions.items()},
                 source=",".join(str(p) for _, p in files))


def _assign_splits(items: list[Item], cfg: BottleneckConfig) -> list[Item]:
    out: list[Item] = []
    by_corpus: dict[str, list[Item]] = {}
    for it in items:
        by_corpus.setdefault(it.corpus, []).append(it)
    for corpus, group in sorted(by_corpus.items()):
        todo = sorted((it for it in group if not it.split), key=lambda it: it.id)
        rng = np.random.default_rng([cfg.split_seed, _stable_int(corpus)])
        order = rng.permutation(len(todo))
        n_test = max(1, round(cfg.test_fraction * len(todo))) if todo else 0
        test_ids = {todo[i].id for i in order[:n_test]}
        for it in group:
            split = it.split or ("test" if it.id in test_ids else "train")
            out.append(Item(it.id, it.corpus, it.series, it.next, split))
    return out


def _stable_int(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


def embedded_study(corpora: Sequence[str] = EMBEDDED_CORPORA, length: int = 16, horizon: int = 8,
                   max_windows: int = 150, test_fraction: float = 0.3, split_seed: int = 0) -> Study:
    """The out-of-the-box study: embedded statsmodels series, windowed, captioned by the describer.

    Each series is cut into contiguous blocks of ``2 * (length + horizon)`` steps and a seeded ~30% of
    the blocks go to test; windows (and their forecasting targets) are cut inside a block, so nothing
    crosses a train/test boundary. Blocks rather than one time cut, because trending series (co2) would
    otherwise put every test level outside the training range and measure extrapolation from text,
    not what the caption carries. The stride is chosen so each corpus yields about ``max_windows``
    windows in all (a bounded run time on 2 CPU cores).
    """
    from captionrl.domains.corpora import load_embedded_corpus
    from captionrl.domains.describe import describe_series
    from captionrl.domains.timeseries import window
    from captionrl.types import Series

    items: list[Item] = []
    caps: dict[str, str] = {}
    block = 2 * (length + horizon)
    for s in load_embedded_corpus(list(corpora)):
        n_blocks = len(s) // block
        if n_blocks < 2:
            raise DataError(f"corpus[{s.id}]", len(s), f"too short for 2 blocks of {block} steps",
                            "use a shorter --length/--horizon or another corpus")
        rng = np.random.default_rng([split_seed, _stable_int(s.id)])
        test_blocks = set(rng.permutation(n_blocks)[: max(1, round(test_fraction * n_blocks))].tolist())
        per_block = block - length - horizon + 1
        stride = max(1, math.ceil(n_blocks * per_block / max_windows))
        for k in range(n_blocks):
            split = "test" if k in test_blocks else "train"
            a = k * block
            seg = Series(id=f"{s.id}:b{k}", values=s.values[a:a + block], source=s.id, start=a,
                         domain=s.domain, split=split)
            for w in window(seg, length, stride, next_length=horizon):
                items.append(Item(w.id, s.id, np.asarray(w.values), np.asarray(w.meta["next"]), split))
                caps[w.id] = describe_series(w)
    return Study(items, {DESCRIBER: caps}, source=f"embedded:{','.join(corpora)}")


# ------------------------------------------------------------------------------------------ predictor
def fit_predict(x_tr: np.ndarray, y_tr: np.ndarray, x_te: np.ndarray, cfg: BottleneckConfig,
                seed: int) -> tuple[np.ndarray, dict[str, Any]]:
    """Fit the caption -> target head on training rows and predict the test rows."""
    if cfg.head == "ridge":
        return _ridge(x_tr, y_tr, x_te, cfg.ridge_alpha), {"head": "ridge"}
    return _mlp(x_tr, y_tr, x_te, cfg, seed)


def _ridge(x_tr: np.ndarray, y_tr: np.ndarray, x_te: np.ndarray, alpha: float) -> np.ndarray:
    mx, my = x_tr.mean(0), y_tr.mean(0)
    a = x_tr - mx
    w = np.linalg.solve(a.T @ a + alpha * np.eye(a.shape[1]), a.T @ (y_tr - my))
    return (x_te - mx) @ w + my


def _mlp(x_tr: np.ndarray, y_tr: np.ndarray, x_te: np.ndarray, cfg: BottleneckConfig,
         seed: int) -> tuple[np.ndarray, dict[str, Any]]:
    import torch

    torch.manual_seed(seed)  # the head's initialisation and dropout masks
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(x_tr))
    n_val = max(1, round(cfg.val_fraction * len(x_tr)))
    val, fit = order[:n_val], order[n_val:]
    xt = torch.tensor(x_tr, dtype=torch.float32)
    yt = torch.tensor(y_tr, dtype=torch.float32)
    model = torch.nn.Sequential(  # built after manual_seed: the same seed gives the same initial head
        torch.nn.Linear(x_tr.shape[1], cfg.hidden), torch.nn.GELU(), torch.nn.Dropout(cfg.dropout),
        torch.nn.Linear(cfg.hidden, y_tr.shape[1]),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    best_loss, best_state, best_epoch = math.inf, None, 0
    fit_t, val_t = torch.as_tensor(fit), torch.as_tensor(val)
    for epoch in range(cfg.max_epochs):
        model.train()
        opt.zero_grad()
        loss = ((model(xt[fit_t]) - yt[fit_t]) ** 2).mean()
        loss.backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            v = float(((model(xt[val_t]) - yt[val_t]) ** 2).mean())
        if v < best_loss - 1e-7:
            best_loss, best_epoch = v, epoch
            best_state = {k: t.clone() for k, t in model.state_dict().items()}
        elif epoch - best_epoch >= cfg.patience:
            break
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    with torch.no_grad():
        pred = model(torch.tensor(x_te, dtype=torch.float32)).numpy().astype(np.float64)
    return pred, {"head": "mlp", "best_epoch": best_epoch, "val_mse": best_loss}


# ------------------------------------------------------------------------------------------------ run
@dataclass
class _Corpus:
    name: str
    train: list[Item]
    test: list[Item]
    mean: float
    std: float


def _corpora(items: Sequence[Item]) -> list[_Corpus]:
    by: dict[str, list[Item]] = {}
    for it in items:
        by.setdefault(it.corpus, []).append(it)
    out = []
    for name, group in sorted(by.items()):
        train = [it for it in group if it.split == "train"]
        test = [it for it in group if it.split == "test"]
        if len(train) < 5 or not test:
            raise DataError(f"corpus[{name}]", {"train": len(train), "test": len(test)},
                            "needs at least 5 training and 1 test item", "add items or change the split")
        lengths = {len(it.series) for it in group}
        if len(lengths) > 1:
            raise DataError(f"corpus[{name}].series", sorted(lengths), "windows of one corpus differ in length",
                            "cut every item of a corpus to the same length (or give them different 'corpus' values)")
        vals = np.concatenate([it.series for it in train])
        std = float(vals.std())
        out.append(_Corpus(name, train, test, float(vals.mean()), std if std > 0 else 1.0))
    return out


def _windows(c: _Corpus, items: Sequence[Item], task: str) -> list[np.ndarray] | None:
    """The raw target windows of ``items`` (None: some item of the corpus has no ``next`` to forecast)."""
    if task == "reconstruct":
        return [it.series for it in items]
    nexts = [it.next for it in c.train + c.test]
    if any(n is None for n in nexts):
        return None
    if len({len(n) for n in nexts if n is not None}) > 1:
        raise DataError(f"corpus[{c.name}].next", "ragged", "forecast targets differ in length",
                        "give every item of a corpus a 'next' window of the same length")
    return [it.next for it in items if it.next is not None]


def _targets(c: _Corpus, items: Sequence[Item], task: str) -> np.ndarray | None:
    """Standardised targets of ``items`` (None when the corpus cannot be forecast)."""
    windows = _windows(c, items, task)
    return None if windows is None else (np.stack(windows) - c.mean) / c.std


def naive_predictions(c: _Corpus, task: str) -> np.ndarray:
    """Last-value persistence (forecast) or the mean standardised training window (reconstruct)."""
    if task == "forecast":
        windows = _windows(c, c.test, task)
        if windows is None:
            raise DataError(f"corpus[{c.name}].next", None, "items have no next window", "give 'next' or skip forecast")
        return np.stack([np.full(len(w), (it.series[-1] - c.mean) / c.std) for w, it in zip(windows, c.test, strict=True)])
    mean_window = ((np.stack([it.series for it in c.train]) - c.mean) / c.std).mean(0)
    return np.tile(mean_window, (len(c.test), 1))


def system_captions(study: Study, cfg: BottleneckConfig) -> dict[str, dict[str, str]]:
    """Every row's captions: the captioners, then the empty and shuffled controls."""
    rows = dict(study.captions)
    if not cfg.controls:
        return rows
    ids = [it.id for it in study.items]
    rows[EMPTY] = dict.fromkeys(ids, "")
    src = cfg.shuffle_from or next(iter(study.captions))
    if src not in study.captions:
        raise ConfigError("shuffle_from", src, "is not one of the captioners", f"choose one of {sorted(study.captions)}")
    shuffled: dict[str, str] = {}
    groups: dict[tuple[str, str], list[str]] = {}
    for it in study.items:
        groups.setdefault((it.corpus, it.split), []).append(it.id)
    for (corpus, split), gids in sorted(groups.items()):
        rng = np.random.default_rng([cfg.shuffle_seed, _stable_int(corpus), _stable_int(split)])
        perm = rng.permutation(len(gids))
        for i, j in zip(gids, perm, strict=True):
            shuffled[i] = study.captions[src][gids[j]]
    rows[SHUFFLED] = shuffled
    return rows


def study_for(cfg: BottleneckConfig) -> Study:
    """The configured study: the user's caption files, or the embedded corpus captioned by the describer."""
    if cfg.captions:
        return load_caption_files(parse_captions_arg(cfg.captions), cfg)
    return embedded_study(cfg.corpora, cfg.length, cfg.horizon, cfg.max_windows, cfg.test_fraction, cfg.split_seed)


def run(cfg: BottleneckConfig, *, study: Study | None = None,
        fit: Callable[..., tuple[np.ndarray, dict[str, Any]]] | None = None) -> EvalResult:
    """Run every (system, task, corpus, seed) not yet in ``out/records.jsonl``; write table and summary.

    ``study`` replaces the configured one; ``fit`` the predictor (tests count or interrupt fits).
    """
    from tqdm.auto import tqdm

    from captionrl.embedded import cache_dir
    from captionrl.encoders import TextEncoder

    study = study if study is not None else study_for(cfg)
    progress = not cfg.quiet
    fit = fit or fit_predict
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    corpora = _corpora(study.items)
    rows = system_captions(study, cfg)
    fp = cfg.fingerprint()
    encoder = TextEncoder(cfg.encoder, cache=cache_dir() / "embeddings")
    jobs = [(system, task, c, seed) for system in rows for task in cfg.tasks for c in corpora for seed in cfg.seeds]
    t0 = time.perf_counter()
    with RecordWriter(out / "records.jsonl") as writer:
        for c in corpora:  # the naive baseline has no seed and no caption
            for task in cfg.tasks:
                key = f"{NAIVE}|{task}|{c.name}|-|{fp}"
                y_te = _targets(c, c.test, task)
                if not cfg.controls or writer.has(key) or y_te is None:
                    continue
                err = ((naive_predictions(c, task) - y_te) ** 2).mean(1)
                writer.write({"key": key, "system": NAIVE, "task": task, "corpus": c.name, "seed": None,
                              "mse": float(err.mean()), "n_train": len(c.train), "n_test": len(c.test),
                              "item_mse": dict(zip([it.id for it in c.test], err.tolist(), strict=True))})
        todo = [j for j in jobs if not writer.has(_key(j, fp))]
        embeddings: dict[str, dict[str, np.ndarray]] = {}
        vectors: dict[str, np.ndarray] = {}  # text -> vector, shared by all rows
        bar = tqdm(total=len(jobs), initial=len(jobs) - len(todo), desc="bottleneck", disable=not progress)
        for system, task, c, seed in todo:
            y_tr, y_te = _targets(c, c.train, task), _targets(c, c.test, task)
            if y_tr is None or y_te is None:
                bar.update(1)
                continue
            if system not in embeddings:
                embeddings[system] = _embed(encoder, rows[system], vectors, progress)
            emb = embeddings[system]
            x_tr = np.stack([emb[it.id] for it in c.train])
            x_te = np.stack([emb[it.id] for it in c.test])
            t1 = time.perf_counter()
            pred, info = fit(x_tr, y_tr, x_te, cfg, seed)
            err = ((pred - y_te) ** 2).mean(1)
            writer.write({"key": _key((system, task, c, seed), fp), "system": system, "task": task,
                          "corpus": c.name, "seed": seed, "mse": float(err.mean()), "n_train": len(c.train),
                          "n_test": len(c.test), "fit_s": round(time.perf_counter() - t1, 3), **info,
                          "item_mse": dict(zip([it.id for it in c.test], err.tolist(), strict=True))})
            bar.update(1)
        bar.close()
        records = [r for r in writer.records() if str(r["key"]).endswith(f"|{fp}")]
    result = summarise(records, cfg, [c.name for c in corpora], list(rows),
                       meta={"source": study.source, "encoder": encoder.id, "fingerprint": fp,
                              "n_items": len(study.items), "wall_s": round(time.perf_counter() - t0, 1),
                              "standardisation": "per corpus: mean/std of the training split's series values"})
    write_result(result, out)
    _plot(result, out / "bottleneck.png")
    return result


def _embed(encoder: Any, captions: Mapping[str, str], vectors: dict[str, np.ndarray],
           progress: bool) -> dict[str, np.ndarray]:
    """Item id -> caption vector; each distinct text is encoded once (controls reuse the captioners')."""
    new = sorted({t for t in captions.values() if t not in vectors})
    if new:
        vectors.update(zip(new, encoder.encode(new, progress=progress), strict=True))
    return {i: vectors[t] for i, t in captions.items()}


def _key(job: tuple[str, str, _Corpus, int], fp: str) -> str:
    system, task, c, seed = job
    return f"{system}|{task}|{c.name}|{seed}|{fp}"


# -------------------------------------------------------------------------------------------- summary
def column(task: str, corpus: str) -> str:
    return f"{task}:{corpus}"


def summarise(records: Sequence[Mapping[str, Any]], cfg: BottleneckConfig, corpora: Sequence[str],
              systems: Sequence[str], meta: Mapping[str, Any] | None = None) -> EvalResult:
    """Rows of mean/std test MSE per (task, corpus), per-seed values, bold marks, Rel. and p-values."""
    from captionrl.eval import stats

    cells: dict[tuple[str, str], dict[int | None, float]] = {}
    for r in records:
        cells.setdefault((r["system"], column(r["task"], r["corpus"])), {})[r["seed"]] = float(r["mse"])
    order = ([NAIVE] if cfg.controls else []) + list(systems)
    columns = [column(t, c) for t in cfg.tasks for c in corpora if any((s, column(t, c)) in cells for s in order)]
    rows: list[dict[str, Any]] = []
    for s in order:
        row: dict[str, Any] = {"system": s, "baseline": s in (NAIVE, EMPTY, SHUFFLED), "per_seed": {}, "std": {}}
        for col in columns:
            vals = cells.get((s, col))
            if not vals:
                continue
            seeds = [k for k in cfg.seeds if k in vals] if s != NAIVE else [None]
            v = [vals[k] for k in seeds if k in vals]
            if not v:
                continue
            row[col] = float(np.mean(v))
            row["std"][col] = float(np.std(v, ddof=1)) if len(v) > 1 else 0.0
            if s != NAIVE:
                row["per_seed"][col] = v
        rows.append(row)
    by_name = {r["system"]: r for r in rows}
    # Rel. (geometric mean over corpora of the ratio to the reference row), one column per task.
    rel_cols = []
    if cfg.reference:
        if cfg.reference not in by_name:
            raise ConfigError("reference", cfg.reference, "is not a row", f"choose one of {sorted(by_name)}")
        for t in cfg.tasks:
            keys = [c for c in columns if c.startswith(t + ":")]
            if not keys:
                continue
            rel = f"{t}:Rel."
            rel_cols.append(rel)
            for r in rows:
                if all(k in r for k in keys) and all(k in by_name[cfg.reference] for k in keys):
                    r[rel] = stats.geometric_rel(r, by_name[cfg.reference], keys)
    # Bold: captioner rows not significantly worse than the best captioner (paired across seeds).
    marks: dict[str, list[str]] = {}
    pvalues: dict[str, dict[str, float]] = {}
    n_seeds = len(cfg.seeds)
    for col in columns:
        cand = {r["system"]: r["per_seed"][col] for r in rows
                if not r["baseline"] and len(r["per_seed"].get(col, [])) == n_seeds}
        if not cand:
            continue
        if n_seeds >= 2:
            res = stats.not_worse_than_best(cand)
            marks[col] = [s for s, v in res.items() if v["marked"]]
            pvalues[col] = {s: float(v["p"]) for s, v in res.items()}
        else:
            marks[col] = [stats.best_row({s: float(np.mean(v)) for s, v in cand.items()})]
    note = ("test MSE of the caption-only predictor (targets z-scored per corpus with the training split's "
            f"mean/std; {len(cfg.seeds)} predictor seeds; lower is better); bold: not significantly worse than "
            "the best captioner (paired t-test across seeds, p >= 0.05)")
    return EvalResult(PROTOCOL, rows, columns + rel_cols, better=dict.fromkeys(columns + rel_cols, "lower"),
                      config=asdict(cfg), records=str(Path(cfg.out) / "records.jsonl"), notes=[note], marked=marks,
                      extra={"p_vs_best": pvalues, "meta": dict(meta or {})})


def _plot(result: EvalResult, path: Path) -> None:
    """Grouped bars of mean test MSE (error bars: std over seeds), one group per (task, corpus)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = [c for c in result.columns if not c.endswith("Rel.")]
    rows = result.rows
    if not cols or not rows:
        return
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(cols)), 3.5))
    width = 0.8 / len(rows)
    for k, r in enumerate(rows):
        xs = [i + k * width for i, c in enumerate(cols) if c in r]
        ys = [r[c] for c in cols if c in r]
        es = [r["std"].get(c, 0.0) for c in cols if c in r]
        ax.bar(xs, ys, width, yerr=es, label=r["system"])
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cols))], cols, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("test MSE (z-scored)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------ CLI
def run_command(cfg: BottleneckConfig) -> int:
    result = run(cfg)
    print(result_text(result, cfg.out))
    print(f"bottleneck.png in {cfg.out} ({result.extra['meta']['wall_s']} s)")
    return 0


def cross_fitted_reconstruction(captions: Mapping[str, Mapping[str, str]], series: Mapping[str, Any], *,
                                folds: int = 5, seed: int = 0, alpha: float = 1.0,
                                encoder: str = "minilm") -> dict[str, dict[str, float]]:
    """Caption-only reconstruction error of *every* item, by cross-fitting: system -> item id -> MSE.

    The end-of-run check has tens of held-out windows, too few to spare a third for testing (12 of 40
    gave a column that could only be called indicative). Here the items are cut into ``folds`` folds; a
    ridge head from caption embedding to the standardised window is fitted on the other folds and predicts
    the held-out fold, so each item gets one out-of-fold prediction and the mean has an interval over all
    items. Standardisation (mean, std of the values) comes from the training folds only. Systems share
    the folds, so their per-item errors are paired. ``captions`` may include controls (empty, shuffled).
    """
    from captionrl.embedded import cache_dir
    from captionrl.encoders import TextEncoder

    ids = sorted(set(series).intersection(*(set(c) for c in captions.values())))
    lengths = {len(np.asarray(series[i])) for i in ids}
    if len(lengths) != 1:
        raise DataError("series", sorted(lengths), "cross-fitted reconstruction needs windows of one length",
                        "evaluate windows of one length")
    if len(ids) < max(2 * folds, 10):
        raise DataError("items", len(ids), f"too few items for {folds}-fold cross-fitting",
                        f"evaluate at least {max(2 * folds, 10)} windows (data.n_test)")
    y = np.stack([np.asarray(series[i], dtype=float) for i in ids])
    order = np.random.default_rng(seed).permutation(len(ids))
    fold_of = np.empty(len(ids), dtype=int)
    fold_of[order] = np.arange(len(ids)) % folds
    enc = TextEncoder(encoder, cache=cache_dir() / "embeddings")
    vectors: dict[str, np.ndarray] = {}
    out: dict[str, dict[str, float]] = {}
    for system, caps in captions.items():
        emb = _embed(enc, {i: caps[i] for i in ids}, vectors, progress=False)
        x = np.stack([emb[i] for i in ids])
        err = np.empty(len(ids))
        for f in range(folds):
            te, tr = fold_of == f, fold_of != f
            mu, sd = float(y[tr].mean()), float(y[tr].std()) or 1.0
            pred = _ridge(x[tr], (y[tr] - mu) / sd, x[te], alpha)
            err[te] = (((pred - (y[te] - mu) / sd)) ** 2).mean(1)
        out[system] = dict(zip(ids, err.tolist(), strict=True))
    return out
