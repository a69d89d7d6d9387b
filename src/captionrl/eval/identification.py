"""Identification evaluation (LineupRL Tables 1, 7, 8, 9): c->s and s->c under one or more verifiers.

Input: captions of one or more captioners (``{id, series, caption}`` JSONL), or, out of the box, captions
of the embedded corpus's test windows written by the deterministic describer and by the embedded model.
Each item gets K-1 distractors mined from the pool (the captions file's own series unless ``--pool``
names another source). Every judgment is a record; the table reports per verifier and their mean,
caption length in characters, and the reward discrimination of Table 9, accuracy above chance
``(acc - 1/K) / (1 - 1/K)``. Controls are always reported beside each captioner: the empty caption and
shuffled captions (another item's caption) must score at chance.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from captionrl.backends import Backend
from captionrl.config import help_field
from captionrl.errors import ConfigError, DataError
from captionrl.eval.common import backend_from_spec, check_fits_context, check_spec, split_spec
from captionrl.eval.result import EvalResult, result_text, write_result
from captionrl.eval.stats import mean_interval
from captionrl.judges.identification import IdentifyConfig, identification_judge
from captionrl.records import RecordWriter, read_jsonl
from captionrl.types import Series

logger = logging.getLogger(__name__)


@dataclass
class IdentifyEvalConfig:
    """Settings of ``captionrl eval identify`` (saved into summary.json)."""

    captions: list[str] = help_field([], "JSONL files of {id, series, caption}, one per captioner ([NAME=]FILE); empty: the embedded corpus captioned by the describer and by captioner")
    out: str = help_field("runs/eval-identify", "output folder (rerun with the same folder to resume)")
    pool: str | None = help_field(None, "distractor pool: 'embedded' or a corpus path (default: the files' own series)")
    prepared: str | None = help_field(None, "a folder written by 'captionrl data prepare': its lineups and pool (and, without captions files, its items to caption)")
    split: str = help_field("test", "split of the prepared folder to evaluate")
    verifiers: list[str] = help_field(["hf:embedded"], "evaluation verifier specs: model backends (hf:embedded, openai:http://127.0.0.1:8000/v1#MODEL, ...) or claims:rules (code-checked claims, offline, no model); their mean is the c2s/s2c column", flags=("--verifier",))
    train_verifier: str | None = help_field(None, "backend spec of the verifier that produced the captioner's training reward: scored in its own column (c2s[train]) and never in the mean")
    modes: list[str] = help_field(["likelihood"], "verifier modes: likelihood and/or letter", flags=("--mode",))
    directions: list[str] = help_field(["c2s", "s2c"], "c2s (caption -> series) and/or s2c (series -> caption)", flags=("--direction",))
    ks: list[int] = help_field([4], "candidate-set sizes K; distractors of a smaller K are a prefix of a larger K's", flags=("--k",))
    rule: str = help_field("nearest", "distractor rule: nearest (by summary statistics) or random (ablation)")
    seed: int = help_field(0, "seed of distractor mining, the item sample and shuffled-caption controls")
    precision: int = help_field(2, "decimals when printing series to the verifier")
    controls: bool = help_field(True, "also score the empty-caption and shuffled-caption controls")
    batch_items: int = help_field(8, "items judged per verifier call (progress granularity)")
    length: int = help_field(24, "window length of the embedded default")
    limit: int | None = help_field(None, "items to evaluate, a seeded sample (default: 32 embedded windows, or every item of the caption files)",
                                   renamed_from=("max_items",))
    captioner: str = help_field("hf:embedded", "captioner of the embedded default (backend spec, or 'none')")

    def __post_init__(self) -> None:
        for k in self.ks:
            if int(k) < 2:
                raise ConfigError("ks", k, "K must be at least 2", "use e.g. --k 4")
        for m in self.modes:
            IdentifyConfig(mode=m)
        for d in self.directions:
            IdentifyConfig(direction=d)
        if self.batch_items < 1:
            raise ConfigError("batch_items", self.batch_items, "must be at least 1", "set batch_items=8")
        if self.rule not in ("nearest", "random"):
            raise ConfigError("rule", self.rule, "unknown distractor rule", "use nearest or random")
        if self.split not in ("train", "val", "test"):
            raise ConfigError("split", self.split, "unknown split", "use train, val or test")
        if not self.verifiers:
            raise ConfigError("verifiers", [], "needs at least one verifier", "use e.g. --verifier hf:embedded")
        for v in self.verifiers:
            check_spec("verifiers", v, claims=True)
        if self.train_verifier:
            check_spec("train_verifier", self.train_verifier)
        if self.captioner != "none":
            check_spec("captioner", self.captioner)
        if self.limit is not None and self.limit < 1:
            raise ConfigError("limit", self.limit, "must be >= 1", "give a positive number of items, or omit it")


CONFIG = IdentifyEvalConfig


@dataclass
class CaptionSet:
    """The captions of one system (captioner or control) over the evaluation items."""

    name: str
    captions: dict[str, str]
    control: bool = False
    meta: dict[str, Any] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict, repr=False)
    """item id -> where its caption came from (``file:line N``), for errors that must name the line."""


def controls_for(system: CaptionSet, item_ids: Sequence[str], seed: int) -> list[CaptionSet]:
    """The empty caption and shuffled captions (a derangement: no item keeps its own caption)."""
    ids = list(item_ids)
    rng = np.random.default_rng(seed)
    perm = list(rng.permutation(len(ids)))
    for i in range(len(ids)):  # turn the permutation into a derangement
        if perm[i] == i:
            j = (i + 1) % len(ids)
            perm[i], perm[j] = perm[j], perm[i]
    shuffled = {ids[i]: system.captions[ids[perm[i]]] for i in range(len(ids))}
    return [
        CaptionSet(f"{system.name}/empty", dict.fromkeys([*ids, *system.captions], ""), control=True),
        CaptionSet(f"{system.name}/shuffled", shuffled, control=True, meta={"seed": seed}),
    ]


def above_chance(acc: float, k: int) -> float:
    """Table 9's reward discrimination: 0 at chance, 1 when every question is answered right."""
    return (acc - 1.0 / k) / (1.0 - 1.0 / k)


def run_identification(
    items: Sequence[Series],
    systems: Sequence[CaptionSet],
    distractors: Mapping[str, Sequence[str]],
    pool: Mapping[str, Series],
    verifiers: Mapping[str, Backend],
    cfg: IdentifyEvalConfig,
    out_dir: str | Path,
    *,
    train_verifier: str | None = None,
) -> EvalResult:
    """Judge every (system, verifier, mode, direction, K, item); resumable; writes and returns the result.

    ``distractors[item_id]`` lists at least max(K)-1 pool ids, nearest first. ``train_verifier`` names the
    entry of ``verifiers`` that produced the captioners' training reward: it is scored and reported in its
    own column but never averaged into the held-out mean (a run must not grade itself). s->c items whose
    distractors have no caption from the system are counted per system (``s2c_uncaptioned``) and named
    in the notes, never dropped silently.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    writer = RecordWriter(out / "records.jsonl")
    all_systems = list(systems)
    if cfg.controls:
        for s in systems:
            if not s.control:
                all_systems.extend(controls_for(s, [it.id for it in items], cfg.seed))
    combos = [(v, m, d, int(k)) for v in verifiers for m in cfg.modes for d in cfg.directions for k in cfg.ks]
    total = len(combos) * len(all_systems) * len(items)
    bar = tqdm(total=total, desc="identify", unit="judgment")
    uncaptioned: dict[str, set[str]] = {}
    check_fits_context({s.origins.get(i, f"captions of {s.name}, item {i}"): c
                        for s in systems for i, c in s.captions.items()}, verifiers)  # before any forward pass
    for vname, mode, direction, k in combos:
        judge = identification_judge(verifiers[vname], IdentifyConfig(mode=mode, direction=direction, k=k,
                                                                      precision=cfg.precision))
        # Item-major order: the captions of every system for one item sit together, so the verifier sees
        # each candidate context once per batch and the backend shares it (prefix cache, dedup).
        todo, skipped = [], 0
        for it in items:
            for system in all_systems:
                if writer.has(_key(system.name, vname, mode, direction, k, it.id)):
                    skipped += 1
                elif direction == "s2c" and any(d not in system.captions for d in distractors[it.id][: k - 1]):
                    skipped += 1  # distractors from an external pool have no captions: s2c is undefined
                    uncaptioned.setdefault(system.name, set()).add(it.id)
                else:
                    todo.append((system, it))
        bar.update(skipped)
        step = cfg.batch_items * len(all_systems)
        for start in range(0, len(todo), step):
            chunk = todo[start : start + step]
            captions = [system.captions[it.id] for system, it in chunk]
            columns = {
                "candidates": [[it.values.tolist(), *[pool[d].values.tolist() for d in distractors[it.id][: k - 1]]]
                               for _, it in chunk],
                "series": [it.values.tolist() for _, it in chunk],
                "distractor_captions": [[system.captions.get(d, "") for d in distractors[it.id][: k - 1]]
                                        for system, it in chunk],
            }
            t0 = time.perf_counter()
            judgments = judge.judge(captions, columns)
            dt = (time.perf_counter() - t0) / len(chunk)
            writer.write_many({
                "key": _key(system.name, vname, mode, direction, k, it.id),
                "system": system.name, "control": system.control, "verifier": vname, "mode": mode,
                "direction": direction, "k": k, "item_id": it.id, "caption": cap,
                "candidate_ids": [it.id, *distractors[it.id][: k - 1]], "seconds": round(dt, 4),
                **j.to_record(),
            } for (system, it), cap, j in zip(chunk, captions, judgments, strict=True))
            bar.update(len(chunk))
    bar.close()
    writer.close()
    result = summarise(writer.records(), [s.name for s in all_systems], list(verifiers), cfg,
                       train_verifier=train_verifier, uncaptioned={k: len(v) for k, v in uncaptioned.items()},
                       series={it.id: it.values for it in items})
    return write_result(replace(result, records=str(out / "records.jsonl")), out)


def _key(system: str, verifier: str, mode: str, direction: str, k: int, item: str) -> str:
    return f"{system}|{verifier}|{mode}|{direction}|K{k}|{item}"


def summarise(records: Sequence[Mapping[str, Any]], systems: Sequence[str], verifiers: Sequence[str],
              cfg: IdentifyEvalConfig, *, train_verifier: str | None = None,
              uncaptioned: Mapping[str, int] | None = None, series: Mapping[str, Any] | None = None) -> EvalResult:
    """Rows per (system, mode, K): each verifier's c->s / s->c accuracy, the mean over the held-out
    verifiers (every verifier but ``train_verifier``), above-chance, length, the count of s->c items left
    unjudged because their distractors were not captioned (``uncaptioned``: system -> items), and (given each
    item's ``series``) the transcription guard's columns: a caption that copies the numbers wins a
    likelihood verifier, so its accuracy is read next to how much it copied."""
    uncaptioned = dict(uncaptioned or {})
    rows: list[dict[str, Any]] = []
    columns: list[str] = []
    for system in systems:
        for mode in cfg.modes:
            for k in cfg.ks:
                recs = [r for r in records if r["system"] == system and r["mode"] == mode and r["k"] == int(k)]
                if not recs:
                    continue
                row: dict[str, Any] = {"system": system, "mode": mode, "K": int(k)}
                for d in cfg.directions:
                    means = []
                    for v in verifiers:
                        sel = [r for r in recs if r["direction"] == d and r["verifier"] == v and r.get("hard") is not None]
                        if not sel:
                            continue
                        acc = float(np.mean([r["hard"] for r in sel]))
                        row[f"{d}[{v}]"] = round(acc, 4)
                        ci = mean_interval([float(r["hard"]) for r in sel])  # over items: 95% t-interval
                        row[f"{d}[{v}]_ci"] = [round(ci[1], 4), round(ci[2], 4)]
                        row[f"{d}_soft[{v}]"] = round(float(np.mean([r["soft"] for r in sel])), 4)
                        if v != train_verifier:
                            means.append(acc)
                    if means:
                        row[d] = round(float(np.mean(means)), 4)
                        row[f"{d}_above_chance"] = round(above_chance(float(np.mean(means)), int(k)), 4)
                row["unscored"] = sum(r.get("score") is None for r in recs)
                if "s2c" in cfg.directions:
                    row["s2c_uncaptioned"] = uncaptioned.get(system, 0)
                caps = {r["item_id"]: r["caption"] for r in recs}
                row["length_chars"] = round(float(np.mean([len(c) for c in caps.values()])), 1) if caps else 0.0
                if series is not None:
                    row.update(transcription_columns(caps, series))
                rows.append(row)
                for key in row:
                    if key not in columns and key != "system":
                        columns.append(key)
    better: dict[str, str | None] = {c: "higher" for c in columns if c.startswith(("c2s", "s2c")) and not c.endswith("_ci")}
    better.update(unscored="lower", length_chars=None, s2c_uncaptioned="lower", transcription="lower",
                  copied_values="lower", run_frac="lower")
    chance = {str(k): 1.0 / int(k) for k in cfg.ks}
    held_out = [v for v in verifiers if v != train_verifier]
    notes = ["accuracy is hard identification accuracy averaged over items (chance "
             + ", ".join(f"K={k}: {v:.3f}" for k, v in chance.items())
             + "); *_above_chance is (acc - 1/K) / (1 - 1/K); *_soft is the mean probability of the truth",
             "transcription: share of the series' values the captions copy (the training guard's rule, "
             "judges.transcription); copied_values: copied numbers per caption; run_frac: captions with a run "
             "of consecutive series values"]
    if train_verifier is not None:
        notes.append(f"c2s/s2c: mean over the held-out verifiers {held_out or '(none)'}; {train_verifier} produced the "
                     f"training reward and is reported only in its own column (c2s[{train_verifier}])")
    for name, n in sorted(uncaptioned.items()):
        notes.append(f"s2c: {n} item(s) of {name} not judged: their distractors have no caption from {name} "
                     "(caption the distractor series too, e.g. eval paper's distractor_captioners)")
    return EvalResult("identification", rows, columns, better=better, labels=["mode", "K"],
                      config={**asdict(cfg), "verifier_names": list(verifiers), "train_verifier_name": train_verifier},
                      notes=notes, extra={"chance": chance, "held_out_verifiers": held_out})


def transcription_columns(captions: Mapping[str, str], series: Mapping[str, Any]) -> dict[str, float]:
    """The transcription guard's measurement of one system's captions (item id -> caption), by its own rule."""
    from captionrl.judges.transcription import transcription

    found = [transcription(c, series[i]) for i, c in captions.items() if i in series]
    if not found:
        return {}
    return {"transcription": round(float(np.mean([t.share for t in found])), 4),
            "copied_values": round(float(np.mean([t.copied for t in found])), 2),
            "run_frac": round(float(np.mean([t.has_run for t in found])), 4)}


# ---------------------------------------------------------------------- the protocol
def _load_caption_files(specs: Sequence[str]) -> tuple[list[Series], list[CaptionSet]]:
    from captionrl.domains.corpora import load_jsonl

    items: dict[str, Series] = {}
    systems = []
    for spec in specs:
        name, path = split_spec(spec)
        loaded = load_jsonl(path)
        lines = {str(rec.get("id", f"{Path(path).stem}_{n - 1}")): n for n, rec in enumerate(read_jsonl(path), start=1)}
        caps = {}
        for s in loaded:
            captions = s.meta.get("captions") or []
            if not captions:
                raise DataError(f"{path}:{s.id}.caption", None, "item has no caption", 'add a "caption" field to every line')
            caps[s.id] = captions[0]
            if s.id in items and not np.array_equal(items[s.id].values, s.values):
                raise DataError(f"{path}:{s.id}.series", s.values.tolist()[:6], "differs from the same id in another file",
                                "compare captioners on the same items (same ids, same series)")
            items.setdefault(s.id, s)
        systems.append(CaptionSet(name, caps, origins={i: f"{path}:line {lines.get(i, '?')}" for i in caps}))
    common = set.intersection(*(set(s.captions) for s in systems))
    _note_dropped(systems, common)
    return [items[i] for i in items if i in common], systems


def _note_dropped(systems: Sequence[CaptionSet], common: set[str]) -> None:
    """Say which items are left out because not every captions file has them (never drop them silently)."""
    for s in systems:
        extra = sorted(set(s.captions) - common)
        if extra:
            logger.warning(f"note: {len(extra)} item(s) of {s.name} skipped (not in every captions file, so not comparable): "
                           f"{', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}")


def run(cfg: IdentifyEvalConfig, *, verifiers: Mapping[str, Backend] | None = None,
        captioner: Backend | None = None) -> EvalResult:
    """The whole evaluation: items and captions (files, or the embedded default), distractors, judging.

    ``verifiers`` (name -> backend) and ``captioner`` replace the configured specs (tests inject them).
    """
    from captionrl.backends import parse_backend_spec
    from captionrl.backends.startup import probe_server
    from captionrl.domains.candidates import mine_candidates
    from captionrl.domains.captioning import DESCRIBER, caption_series
    from captionrl.judges.claims_verifier import is_claims_spec

    if verifiers is None:  # an unreachable server is a named error now, not a table of unscored judgments
        for v in cfg.verifiers:
            if not is_claims_spec(v):
                probe_server(parse_backend_spec(v), field="verifiers")
        if cfg.train_verifier and not is_claims_spec(cfg.train_verifier):
            probe_server(parse_backend_spec(cfg.train_verifier), field="train_verifier")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    prepared = None
    if cfg.prepared:
        from captionrl.domains.prepare import load_prepared

        prepared = load_prepared(cfg.prepared)
        if prepared.k < max(cfg.ks):
            raise ConfigError("ks", cfg.ks, f"{cfg.prepared} holds lineups of K={prepared.k}",
                              f"use K <= {prepared.k}, or prepare again with k={max(cfg.ks)}")
    if cfg.captions:
        items, systems = _load_caption_files(cfg.captions)
        all_items = list(items)  # the distractor pool stays the whole file
        if cfg.limit is not None and len(items) > cfg.limit:
            keep = set(random.Random(cfg.seed).sample(sorted(it.id for it in items), cfg.limit))
            items = [it for it in items if it.id in keep]
    else:
        from captionrl.domains.datasets import eval_windows, sample

        n = 32 if cfg.limit is None else cfg.limit
        items = (sample(prepared.items[cfg.split], cfg.limit, cfg.seed) if prepared is not None
                 else eval_windows("embedded", cfg.length, "test", n, cfg.seed))
        all_items = list(items)
        systems = [CaptionSet(DESCRIBER, caption_series(items, DESCRIBER, out / "captions-describer.jsonl"))]
        if captioner is not None or cfg.captioner != "none":
            name = cfg.captioner.replace(":", "-").replace("/", "_")
            model = captioner if captioner is not None else backend_from_spec(cfg.captioner)
            systems.append(CaptionSet(name, caption_series(items, model, out / f"captions-{name}.jsonl")))
    if prepared is not None:
        by_item = {cs.item_id: list(cs.distractor_ids) for cs in prepared.sets}
        unknown = [it.id for it in items if it.id not in by_item]
        if unknown:
            raise DataError("captions", unknown[:3], f"{len(unknown)} captioned item(s) are not in {cfg.prepared}",
                            "caption the prepared items (captionrl caption prepared=...)")
        return run_identification(items, systems, {it.id: by_item[it.id] for it in items}, prepared.pool,
                                  _verifiers(cfg, verifiers), cfg, out, train_verifier=_train_name(cfg))
    if cfg.pool:
        from captionrl.domains.datasets import split_windows

        pool_items = [w for ws in split_windows(cfg.pool, len(items[0])).values() for w in ws]
    else:
        pool_items = all_items
    sets = mine_candidates(items, pool_items, k=max(cfg.ks), rule=cfg.rule, seed=cfg.seed)
    distractors = {cs.item_id: list(cs.distractor_ids) for cs in sets}
    return run_identification(items, systems, distractors, {p.id: p for p in pool_items}, _verifiers(cfg, verifiers),
                              cfg, out, train_verifier=_train_name(cfg))


def run_command(cfg: IdentifyEvalConfig) -> int:
    result = run(cfg)
    print(result_text(result, cfg.out))
    return 0 if result.rows else 1


TRAIN = "train"
"""The training verifier's name in tables: its columns are ``c2s[train]`` / ``s2c[train]``."""


def _verifiers(cfg: IdentifyEvalConfig, given: Mapping[str, Backend] | None) -> dict[str, Backend]:
    """The evaluation verifiers by name, plus the training verifier as ``train`` when one is configured."""
    if given is not None:
        return dict(given)
    out = {_verifier_name(v): backend_from_spec(v) for v in cfg.verifiers}
    if cfg.train_verifier:
        out[TRAIN] = backend_from_spec(cfg.train_verifier)
    return out


def _train_name(cfg: IdentifyEvalConfig) -> str | None:
    return TRAIN if cfg.train_verifier else None


def _verifier_name(spec: str) -> str:
    """The table's name of a verifier spec: ``hf:embedded``, ``openai:MODEL``, ``claims:rules``."""
    from captionrl.backends import parse_backend_spec
    from captionrl.judges.claims_verifier import is_claims_spec, parse_claims_spec

    if is_claims_spec(spec):
        return parse_claims_spec(spec).spec
    cfg = parse_backend_spec(spec)
    return f"{cfg.kind}:{Path(cfg.model).name}"
