"""``captionrl eval paper``: the LineupRL paper's evaluation of a set of captioners from one command.

Input: one caption file per captioner (the JSONL ``captionrl caption`` writes: ``{id, series, caption,
next?, domain}``; ``[NAME=]FILE``), and where the lineups come from: a prepared dataset (``prepared``:
its lineups and pool) or the caption files' own series (distractors mined here by ``rule``).

Outputs, one folder per table, each written by ``EvalResult`` (so ``captionrl report OUT`` gathers them):

- ``identification/``: Tables 1, 7, 8: c->s and s->c per evaluation verifier, their mean over the
  *evaluation* verifiers only; the training verifier (``train_verifier``), when given, is scored in its own
  column ``c2s[train]`` and never averaged in. s->c needs every distractor captioned by the same system:
  ``identify.distractor_captioners`` captions the missing ones, otherwise the count is a column and a note.
- ``entailment/``: the fraction of reference captions a caption entails (Table 1's Ent.).
- ``reward-accuracy/``: Table 3's first row: identification accuracy above chance of reference captions
  under the training verifier, nearest against random distractors (a re-scoring pass), and, for every
  training run in ``reward.runs``, the mean logged reward accuracy of its ``metrics.jsonl``.
- ``bottleneck/`` (Tables 2 and 6: MSE ± std over predictor seeds, bold, ``Rel.`` to ``reference``) and
  ``bottleneck-pvalues/`` (Table 5: paired p-values of ``reference`` against every other row).

Every stage is resumable (records files), so rerunning the same command finishes an interrupted run.
"""

from __future__ import annotations

import random
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from captionrl.config import help_field
from captionrl.errors import ConfigError, DataError
from captionrl.eval.common import check_spec, split_spec
from captionrl.eval.result import EvalResult, markdown, write_result

PROTOCOL_P = "bottleneck-pvalues"
PROTOCOL_REWARD = "reward-accuracy"
TRAIN = "train"
RULES = ("nearest", "random")


@dataclass
class PaperIdentify:
    """Identification (c->s, s->c) settings of the paper evaluation."""

    enabled: bool = help_field(True, "run c->s / s->c identification")
    modes: list[str] = help_field(["letter"], "verifier modes (the paper: letter)")
    directions: list[str] = help_field(["c2s", "s2c"], "c2s and/or s2c")
    controls: bool = help_field(True, "also score empty and shuffled captions (must land at chance)")
    batch_items: int = help_field(8, "items per verifier call")
    distractor_captioners: dict[str, str] = help_field({}, "system name -> captioner spec (or 'describer') that captions the distractor series it has no caption for, so s->c judges every item")


@dataclass
class PaperEntail:
    """Entailment (Table 1's Ent.) settings."""

    enabled: bool = help_field(True, "score entailment of reference captions")
    backend: str = help_field("hf:embedded", "judge LLM spec")
    method: str = help_field("yesno", "yesno, letters or nli")
    references: str | None = help_field(None, "JSONL {id, references: [...]}; default: the caption files' 'references' fields, else the deterministic describer's sentences (an offline stand-in, said in the notes)")
    batch: int = help_field(8, "captions per judge call")


@dataclass
class PaperReward:
    """Table 3: reward accuracy above chance, nearest against random distractors."""

    enabled: bool = help_field(True, "re-score reference captions under the training verifier with both distractor rules")
    system: str = help_field("", "captioner whose captions are re-scored (default: the first caption file; the paper: reference captions)")
    verifier: str | None = help_field(None, "verifier spec of the re-scoring (default: train_verifier, else the first evaluation verifier)")
    mode: str = help_field("letter", "verifier mode of the re-scoring")
    rules: list[str] = help_field(list(RULES), "distractor rules compared")
    runs: list[str] = help_field([], "training run folders (train lineup out_dir): their metrics.jsonl reward accuracy is tabled too")


@dataclass
class PaperBottleneck:
    """Criterion 3 (Tables 2, 5, 6): caption-only forecasting and reconstruction."""

    enabled: bool = help_field(True, "run the bottleneck (needs >= 5 training items per corpus in the caption files)")
    seeds: list[int] = help_field([0, 1, 2, 3, 4], "predictor seeds (>= 2 for p-values)")
    tasks: list[str] = help_field(["forecast", "reconstruct"], "forecast and/or reconstruct")
    head: str = help_field("mlp", "mlp or ridge")
    max_epochs: int = help_field(1000, "MLP epoch limit")
    patience: int = help_field(50, "MLP early-stopping patience")
    encoder: str = help_field("minilm", "caption encoder")
    test_fraction: float = help_field(0.3, "test share for items without a split")


@dataclass
class PaperEvalConfig:
    """Settings of ``captionrl eval paper`` (saved into every table's summary.json)."""

    captions: list[str] = help_field([], "caption files, one per captioner ([NAME=]FILE, JSONL {id, series, caption, next?, domain} as 'captionrl caption' writes)")
    out: str = help_field("runs/eval-paper", "output folder, one subfolder per table (rerun to resume)")
    prepared: str | None = help_field(None, "a 'captionrl data prepare' folder: lineups and distractor pool (default: the caption files' own series)")
    verifiers: list[str] = help_field(["hf:embedded"], "evaluation verifiers, [NAME=]SPEC (the paper: GLM-4-9B and Phi-4-14B); the c2s/s2c mean is over these only", flags=("--verifier",))
    train_verifier: str | None = help_field(None, "spec of the verifier the captioners were trained against: own column c2s[train], never in the mean")
    k: int = help_field(4, "candidates per identification question")
    rule: str = help_field("nearest", "distractor rule when no prepared folder is given: nearest or random")
    reference: str = help_field("", "the chosen row (LineupRL): Rel. divides by it and the p-values are its tests against every other row")
    limit: int | None = help_field(None, "identification/entailment on a seeded sample of this many items (the bottleneck uses every item)",
                                   renamed_from=("max_items",))
    precision: int = help_field(2, "decimals when printing series to the verifier")
    seed: int = help_field(0, "seed of samples, distractor mining and controls")
    identify: PaperIdentify = field(default_factory=PaperIdentify, metadata={"help": "identification"})
    entail: PaperEntail = field(default_factory=PaperEntail, metadata={"help": "entailment"})
    reward: PaperReward = field(default_factory=PaperReward, metadata={"help": "Table 3"})
    bottleneck: PaperBottleneck = field(default_factory=PaperBottleneck, metadata={"help": "Tables 2, 5, 6"})

    def __post_init__(self) -> None:
        if not self.captions:
            raise ConfigError("captions", [], "no caption files given",
                              "caption the test items first (captionrl caption out=FILE ...) and pass captions=[FILE,...]")
        if self.k < 2:
            raise ConfigError("k", self.k, "K must be at least 2", "set k=4")
        if self.rule not in RULES:
            raise ConfigError("rule", self.rule, "unknown distractor rule", "use nearest or random")
        if not self.verifiers:
            raise ConfigError("verifiers", [], "needs at least one evaluation verifier",
                              "list held-out verifiers (the training verifier goes in train_verifier)")
        for spec in self.verifiers:
            check_spec("verifiers", verifier_spec(spec)[1], claims=True)
        if self.train_verifier:
            check_spec("train_verifier", self.train_verifier)
        for r in self.reward.rules:
            if r not in RULES:
                raise ConfigError("reward.rules", r, "unknown distractor rule", "use nearest and/or random")
        for name, spec in self.identify.distractor_captioners.items():
            if spec != "describer":
                check_spec(f"identify.distractor_captioners.{name}", spec)
        if self.bottleneck.enabled and self.reference and len(self.bottleneck.seeds) < 2:
            raise ConfigError("bottleneck.seeds", self.bottleneck.seeds, "p-values need at least 2 predictor seeds",
                              "use e.g. bottleneck.seeds=[0,1,2,3,4]")


CONFIG = PaperEvalConfig


def verifier_spec(text: str) -> tuple[str | None, str]:
    """``NAME=SPEC`` -> (NAME, SPEC); a bare spec (which may hold ``,key=value``) -> (None, SPEC)."""
    name, sep, rest = text.partition("=")
    if sep and re.fullmatch(r"[A-Za-z0-9_.\-]+", name) and (":" in rest or rest.startswith("tiny")):
        return name, rest
    return None, text


def verifier_names(specs: Sequence[str]) -> list[tuple[str, str]]:
    """(table name, spec) per evaluation verifier; unnamed ones are named after their model, made unique."""
    from captionrl.backends import parse_backend_spec

    out: list[tuple[str, str]] = []
    for text in specs:
        name, spec = verifier_spec(text)
        if name is None:
            bc = parse_backend_spec(spec)
            name = f"{bc.kind}:{Path(bc.model).name}"
        if name == TRAIN:
            raise ConfigError("verifiers", text, "'train' names the training verifier's column",
                              "give the training verifier as train_verifier=SPEC")
        base, n = name, 2
        while name in {x for x, _ in out}:
            name, n = f"{base}#{n}", n + 1
        out.append((name, spec))
    return out


# ---------------------------------------------------------------------- stages
def _backends(cfg: PaperEvalConfig, given: Mapping[str, Any] | None) -> dict[str, Any]:
    """Table name -> backend: the evaluation verifiers, then ``train`` (``given`` maps specs to backends)."""
    from captionrl.eval.common import backend_from_spec  # claims:rules too

    given = dict(given or {})

    def build(spec: str) -> Any:
        return given[spec] if spec in given else backend_from_spec(spec)

    out = {name: build(spec) for name, spec in verifier_names(cfg.verifiers)}
    if cfg.train_verifier:
        out[TRAIN] = build(cfg.train_verifier)
    return out


def _lineups(cfg: PaperEvalConfig, items: Sequence[Any], all_items: Sequence[Any], rule: str) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """Distractor ids per item and the pool they come from: the prepared lineups (nearest rule), or mined."""
    from captionrl.domains.candidates import mine_candidates

    if cfg.prepared:
        from captionrl.domains.prepare import load_prepared

        prepared = load_prepared(cfg.prepared)
        if prepared.k < cfg.k:
            raise ConfigError("k", cfg.k, f"{cfg.prepared} holds lineups of K={prepared.k}",
                              f"use k <= {prepared.k}, or prepare again with k={cfg.k}")
        by_item = {cs.item_id: list(cs.distractor_ids) for cs in prepared.sets}
        unknown = [it.id for it in items if it.id not in by_item]
        if unknown:
            raise DataError("captions", unknown[:3], f"{len(unknown)} captioned item(s) are not in {cfg.prepared}",
                            "caption the prepared items (captionrl caption prepared=...)")
        pool = prepared.pool
        if rule == "nearest":
            return {it.id: by_item[it.id] for it in items}, pool
        split_pool = [s for s in pool.values() if s.split == items[0].split] or list(pool.values())
        sets = mine_candidates(items, split_pool, k=cfg.k, rule=rule, seed=cfg.seed)
        return {cs.item_id: list(cs.distractor_ids) for cs in sets}, pool
    sets = mine_candidates(items, all_items, k=cfg.k, rule=rule, seed=cfg.seed)
    return {cs.item_id: list(cs.distractor_ids) for cs in sets}, {s.id: s for s in all_items}


def _caption_distractors(cfg: PaperEvalConfig, systems: Sequence[Any], distractors: Mapping[str, Sequence[str]],
                         pool: Mapping[str, Any], out: Path) -> None:
    """Caption, with each system's configured captioner, the distractor series it has no caption of."""
    from captionrl.backends import backend_from_spec
    from captionrl.domains.captioning import DESCRIBER, caption_series

    needed = sorted({d for ds in distractors.values() for d in ds[: cfg.k - 1]})
    for s in systems:
        spec = cfg.identify.distractor_captioners.get(s.name)
        missing = [pool[d] for d in needed if d not in s.captions]
        if spec is None or not missing:
            continue
        captioner = DESCRIBER if spec == DESCRIBER else backend_from_spec(spec)
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", s.name)
        s.captions.update(caption_series(missing, captioner, out / "distractor-captions" / f"{safe}.jsonl",
                                         precision=cfg.precision, seed=cfg.seed))


def identification(cfg: PaperEvalConfig, items: Sequence[Any], all_items: Sequence[Any], systems: Sequence[Any],
                   backends: Mapping[str, Any], out: Path) -> EvalResult:
    from captionrl.eval.identification import IdentifyEvalConfig, run_identification

    distractors, pool = _lineups(cfg, items, all_items, cfg.rule if not cfg.prepared else "nearest")
    if "s2c" in cfg.identify.directions:
        _caption_distractors(cfg, systems, distractors, pool, out)
    icfg = IdentifyEvalConfig(verifiers=[spec for _, spec in verifier_names(cfg.verifiers)],
                              train_verifier=cfg.train_verifier, modes=list(cfg.identify.modes),
                              directions=list(cfg.identify.directions), ks=[cfg.k], rule=cfg.rule, seed=cfg.seed,
                              precision=cfg.precision, controls=cfg.identify.controls,
                              batch_items=cfg.identify.batch_items, captioner="none", out=str(out / "identification"))
    return run_identification(items, systems, distractors, pool, backends, icfg, out / "identification",
                              train_verifier=TRAIN if TRAIN in backends else None)


def entailment(cfg: PaperEvalConfig, items: Sequence[Any], systems: Sequence[Any], out: Path,
               given: Mapping[str, Any] | None = None) -> EvalResult:
    from captionrl.domains.describe import describe_series
    from captionrl.eval import entailment as ent
    from captionrl.judges.entailment import EntailmentJudge

    _, refs = ent.load_inputs([f"{n}={p}" for n, p in (split_spec(c) for c in cfg.captions)], cfg.entail.references)
    ids = [it.id for it in items]
    notes = []
    missing = [it for it in items if it.id not in refs]
    if missing:  # the offline stand-in: the sentences of the deterministic describer's caption of the series
        for it in missing:
            refs[it.id] = [s for s in re.split(r"(?<=\.)\s+", describe_series(it)) if s]
        notes.append(f"{len(missing)} item(s) had no reference captions: their references are the sentences of the "
                     "deterministic describer's caption (give entail.references for the benchmark's own)")
    ecfg = ent.EntailEvalConfig(captions=list(cfg.captions), references=cfg.entail.references, out=str(out / "entailment"),
                                backend=cfg.entail.backend, method=cfg.entail.method, batch=cfg.entail.batch, quiet=True)
    caps = {s.name: {i: s.captions[i] for i in ids} for s in systems}
    judge = None
    if cfg.entail.method != "nli":
        backend = (given or {}).get(cfg.entail.backend) or _backends_from([cfg.entail.backend])[0]
        judge = EntailmentJudge(backend, method=cfg.entail.method)
    result = ent.run(ecfg, judge=judge, inputs=(caps, {i: refs[i] for i in ids}))
    if notes:
        result = write_result(EvalResult(result.protocol, result.rows, result.columns, better=result.better,
                                         labels=result.labels, config=result.config, records=result.records,
                                         notes=[*result.notes, *notes], marked=result.marked, extra=result.extra),
                              out / "entailment")
    return result


def reward_accuracy(cfg: PaperEvalConfig, items: Sequence[Any], all_items: Sequence[Any], systems: Sequence[Any],
                    backends: Mapping[str, Any], given: Mapping[str, Any] | None, out: Path) -> EvalResult:
    """Table 3's reward row: c->s accuracy above chance of one system's captions per distractor rule (a
    re-scoring pass under the training verifier), plus the logged reward accuracy of training runs."""
    from captionrl.eval.identification import CaptionSet, IdentifyEvalConfig, above_chance, run_identification

    rows: list[dict[str, Any]] = []
    name = cfg.reward.system or systems[0].name
    by_name = {s.name: s for s in systems}
    if name not in by_name:
        raise ConfigError("reward.system", name, "is not one of the captioners", f"choose one of {sorted(by_name)}")
    if cfg.reward.verifier:
        vname, spec = "verifier", cfg.reward.verifier
        backend = (given or {}).get(spec) or _backends_from([spec])[0]
    elif TRAIN in backends:
        vname, backend = TRAIN, backends[TRAIN]
    else:
        vname, backend = next(iter(backends.items()))
    for rule in cfg.reward.rules:
        distractors, pool = _lineups(cfg, items, all_items, rule)
        icfg = IdentifyEvalConfig(modes=[cfg.reward.mode], directions=["c2s"], ks=[cfg.k], rule=rule, seed=cfg.seed,
                                  precision=cfg.precision, controls=False, captioner="none",
                                  out=str(out / PROTOCOL_REWARD / rule))
        res = run_identification(items, [CaptionSet(name, by_name[name].captions)], distractors, pool,
                                 {vname: backend}, icfg, out / PROTOCOL_REWARD / rule)
        acc = res.rows[0].get(f"c2s[{vname}]") if res.rows else None
        rows.append({"system": f"{rule} distractors", "source": f"re-scored {name}", "K": cfg.k,
                     "reward_acc": acc, "reward_above_chance": None if acc is None else round(above_chance(acc, cfg.k), 4)})
    for run_dir in cfg.reward.runs:
        rows.append(run_reward_row(Path(run_dir)))
    result = EvalResult(PROTOCOL_REWARD, rows, ["source", "K", "reward_acc", "reward_above_chance"],
                        better={"reward_acc": "higher", "reward_above_chance": "higher"}, labels=["source", "K"],
                        config=asdict(cfg),
                        notes=[f"reward accuracy: c->s hard accuracy under {vname} ({cfg.reward.mode} mode); above chance "
                               "is (acc - 1/K) / (1 - 1/K); training runs: mean over logged steps of metrics.jsonl"])
    return write_result(result, out / PROTOCOL_REWARD)


def _backends_from(specs: Sequence[str]) -> list[Any]:
    from captionrl.backends import backend_from_spec

    return [backend_from_spec(s) for s in specs]


def run_reward_row(run_dir: Path) -> dict[str, Any]:
    """One training run's logged reward accuracy (``<reward>/hard`` in metrics.jsonl) and its K and rule."""
    from captionrl.config import load_yaml
    from captionrl.eval.identification import above_chance
    from captionrl.records import load_metrics

    metrics_path, cfg_path = run_dir / "metrics.jsonl", run_dir / "config.yaml"
    if not metrics_path.is_file() or not cfg_path.is_file():
        raise DataError("reward.runs", str(run_dir), "holds no metrics.jsonl and config.yaml",
                        "give the out_dir of a 'captionrl train lineup' run")
    conf = load_yaml(cfg_path)
    k = int((conf.get("reward") or {}).get("k", 4))
    rule = str((conf.get("data") or {}).get("distractors", "nearest"))
    vals = [float(m[key]) for m in load_metrics(metrics_path) for key in m
            if key.endswith("/hard") and isinstance(m[key], (int, float))]
    if not vals:
        raise DataError(f"{metrics_path}", "*/hard", "no logged reward accuracy", "train with the identification reward")
    acc = float(np.mean(vals))
    return {"system": f"{rule} distractors ({run_dir.name})", "source": f"training log {run_dir.name}", "K": k,
            "reward_acc": round(acc, 4), "reward_above_chance": round(above_chance(acc, k), 4)}


def bottleneck(cfg: PaperEvalConfig, out: Path) -> tuple[EvalResult, EvalResult | None]:
    """Tables 2/6 (bottleneck with Rel.) and Table 5 (paired p-values of ``reference`` against every row)."""
    from captionrl.eval import bottleneck as bn

    b = cfg.bottleneck
    bcfg = bn.BottleneckConfig(captions=list(cfg.captions), out=str(out / "bottleneck"), quiet=True, tasks=list(b.tasks),
                               seeds=list(b.seeds), encoder=b.encoder, head=b.head, max_epochs=b.max_epochs,
                               patience=b.patience, test_fraction=b.test_fraction, split_seed=cfg.seed,
                               shuffle_seed=cfg.seed, reference=cfg.reference)
    result = bn.run(bcfg)
    if not cfg.reference:
        return result, None
    return result, write_result(pvalues(result, cfg.reference), out / PROTOCOL_P)


def pvalues(result: EvalResult, reference: str) -> EvalResult:
    """Table 5: for every MSE column, ``stats.pvalue_table`` of ``reference`` against every other row with
    per-seed values; bold (the paper's †) where the other row has the lower mean."""
    from captionrl.eval import stats

    cols = [c for c in result.columns if not c.endswith("Rel.")]
    others = [r["system"] for r in result.rows if r["system"] != reference and r.get("per_seed")]
    rows = {s: {"system": s} for s in others}
    marked: dict[str, list[str]] = {}
    for col in cols:
        per_seed = {r["system"]: r["per_seed"][col] for r in result.rows if col in (r.get("per_seed") or {})}
        if reference not in per_seed:
            continue
        n = len(per_seed[reference])
        table = stats.pvalue_table({k: v for k, v in per_seed.items() if len(v) == n}, reference)
        for s, v in table.items():
            rows[s][col] = float(v["p"])
            if v["other_ahead"]:
                marked.setdefault(col, []).append(s)
    return EvalResult(PROTOCOL_P, list(rows.values()), cols, better=dict.fromkeys(cols), marked=marked,
                      config={"reference": reference, "source": result.records},
                      notes=[f"two-sided paired t-test p-values of {reference} against every other row, paired across "
                             "predictor seeds; bold (the paper's dagger): the other row has the lower mean MSE"],
                      extra={"reference": reference, "p_display": {s: {c: stats.format_p(r[c]) for c in cols if c in r}
                                                                   for s, r in rows.items()}})


# ---------------------------------------------------------------------- the command
def load_captioners(cfg: PaperEvalConfig) -> tuple[list[Any], list[Any], list[Any]]:
    """(evaluated items, every captioned item, caption sets): the files' shared items; a seeded sample."""
    from captionrl.eval.identification import _load_caption_files

    all_items, systems = _load_caption_files(cfg.captions)
    items = list(all_items)
    if cfg.limit is not None and len(items) > cfg.limit:
        keep = set(random.Random(cfg.seed).sample(sorted(it.id for it in items), cfg.limit))
        items = [it for it in items if it.id in keep]
    if len(all_items) < cfg.k and not cfg.prepared:
        raise DataError("captions", len(all_items), f"fewer captioned items than K={cfg.k} (no distractors to mine)",
                        "caption more items, lower k, or give a prepared folder")
    return items, all_items, systems


def run(cfg: PaperEvalConfig, *, backends: Mapping[str, Any] | None = None) -> dict[str, EvalResult]:
    """Every table of the paper's evaluation; ``backends`` maps spec strings to loaded backends (tests share
    one model). Returns protocol -> result and writes ``paper.md`` with all tables."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    items, all_items, systems = load_captioners(cfg)
    results: dict[str, EvalResult] = {}
    verifiers = _backends(cfg, backends) if cfg.identify.enabled or cfg.reward.enabled else {}
    if cfg.identify.enabled:
        results["identification"] = identification(cfg, items, all_items, systems, verifiers, out)
    if cfg.entail.enabled:
        results["entailment"] = entailment(cfg, items, systems, out, backends)
    if cfg.reward.enabled:
        results[PROTOCOL_REWARD] = reward_accuracy(cfg, items, all_items, systems, verifiers, backends, out)
    if cfg.bottleneck.enabled:
        res, pv = bottleneck(cfg, out)
        results["bottleneck"] = res
        if pv is not None:
            results[PROTOCOL_P] = pv
    (out / "paper.md").write_text("\n".join(markdown(r) for r in results.values()))
    return results


def run_command(cfg: PaperEvalConfig) -> int:
    results = run(cfg)
    print(Path(cfg.out, "paper.md").read_text())
    print(f"{len(results)} table(s) in {cfg.out} (one folder each); gather them with: captionrl report {cfg.out} --out DIR",
          file=sys.stderr)
    return 0
