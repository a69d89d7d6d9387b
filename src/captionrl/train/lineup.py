"""``captionrl train lineup``: LineupRL, RL of a captioner with the caption-to-series identification reward.

Figure 2(b) of the paper: for each series the policy samples a group of G captions; a frozen verifier
reads each caption and the K candidate series (the true one and K-1 mined distractors) and must pick the
described one; the group's rewards drive an RLOO (or GRPO) update. Everything trainer-side is TRL
(``train.common``); this module only builds the data, the reward and the end-of-run report.

Reward shaping (length, transcription guard, factuality, numbers-masked pass) is
``captionrl.rewards.shaping.ShapedReward`` around the identification reward: a failed verification stays
``None``, never a penalty-only score.

Run folder (``train.out_dir``): ``config.yaml``, ``preflight.md``/``preflight.json`` (the reward preflight),
``checkpoints/``, ``metrics.jsonl``, ``samples.rank*.jsonl``, ``tensorboard/``, ``curves.png``, ``model/`` and
``eval/`` (records.jsonl, table.md, summary.json, final_checks.md/.json: checks the model was not trained on).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from captionrl.backends import BackendConfig
from captionrl.config import help_field, load_config
from captionrl.errors import ConfigError, DataError
from captionrl.judges.identify import validate_candidate_set
from captionrl.rewards.shaping import ShapedReward, ShapingConfig
from captionrl.train.common import PolicyConfig, TrainConfig


# ---------------------------------------------------------------------- config
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
    candidates_file: str | None = help_field(None, "JSONL of prepared candidate sets ({item_id, split, series, candidates, candidate_ids}) instead of mining")
    distractors: str = help_field("nearest", "distractor rule: nearest (by summary statistics, the paper's) or random (ablation)")
    instruction: str | None = help_field(None, "the captioning instruction after the numbers (null = the default of captionrl.domains.captioning); a short-answer instruction lets a small model finish its caption within the token budget")

    def __post_init__(self) -> None:
        if self.window < 4:
            raise ConfigError("data.window", self.window, "too short to caption", "set data.window: 32")
        if self.distractors not in ("nearest", "random"):
            raise ConfigError("data.distractors", self.distractors, "unknown rule", "use nearest or random")
        if len(self.splits) != 3 or abs(sum(self.splits) - 1) > 1e-6 or min(self.splits) <= 0:
            raise ConfigError("data.splits", self.splits, "need three positive fractions summing to 1", "set data.splits: [0.7, 0.1, 0.2]")
        if self.normalise not in (None, "zscore", "minmax"):
            raise ConfigError("data.normalise", self.normalise, "unknown normalisation", "use null, zscore or minmax")
        if self.n_val < 0 or self.n_test < 0 or (self.n_train is not None and self.n_train < 1):
            raise ConfigError("data.n_train/n_val/n_test", (self.n_train, self.n_val, self.n_test),
                              "item counts must be positive (n_val, n_test may be 0)", "set e.g. n_train: 64, n_test: 16")


@dataclass
class LineupRewardConfig:
    """The identification reward and its shaping."""

    k: int = help_field(4, "K: candidates per identification question (the true series and K-1 distractors)")
    mode: str = help_field("likelihood", "verifier mode: letter (the paper's K-rotation multiple choice; needs a capable verifier) or likelihood (argmax log p(caption | series); works with small verifiers)")
    signal: str = help_field("hard", "reward = lam * hard accuracy (the paper) or soft accuracy (probability on the truth: a denser signal)")
    lam: float = help_field(1.0, "lambda: reward = lambda * accuracy")
    max_caption_chars: int | None = help_field(None, "captions longer than this are penalised (null = no length shaping)")
    length_penalty: float = help_field(0.0, "penalty per 100 characters above max_caption_chars")
    max_copied_values: int = help_field(4, "series values a caption may copy for free, counted in values (start, end, max, min are key values), never a fraction of the series")
    transcription_penalty: float = help_field(0.1, "penalty per copied value beyond max_copied_values (values matched at the caption's rounding; 0 = guard off: copying the numbers wins a likelihood verifier without describing anything)")
    transcription_run: int = help_field(3, "a run of this many consecutive series values, in order, is transcription and is always penalised")
    run_penalty: float = help_field(1.0, "penalty for a caption with such a run (0 = off)")
    factuality_penalty: float = help_field(0.0, "weight of the share of claims the series contradicts (span-audit code checks within factuality_tolerance sigma; 0 = off)")
    factuality_tolerance: float = help_field(0.35, "claims within this many standard deviations of the series are supported")
    claims_extractor: str = help_field("rules", "claim extraction of the factuality term: rules, or llm (needs claims_backend: a capable served model)")
    claims_backend: str | None = help_field(None, "backend spec of the LLM claim extractor, e.g. openai:http://127.0.0.1:8000/v1#MODEL")
    masked_weight: float = help_field(0.0, "numbers-masked pass: base = (1-w)*score + w*score(caption with numbers masked); 0 = off")
    unfinished_penalty: float = help_field(0.0, "penalty for a caption that does not end a sentence (cut by the token budget or trailing off)")

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or self.k < 2:
            raise ConfigError("reward.k", self.k, "K must be at least 2 (the true series and one distractor)", "set reward.k: 4")
        if self.mode not in ("letter", "likelihood"):
            raise ConfigError("reward.mode", self.mode, "unknown verifier mode", "use letter or likelihood")
        if self.signal not in ("hard", "soft"):
            raise ConfigError("reward.signal", self.signal, "unknown signal", "use hard or soft")
        if min(self.length_penalty, self.transcription_penalty, self.run_penalty, self.factuality_penalty,
               self.unfinished_penalty) < 0:
            raise ConfigError("reward.*_penalty", (self.length_penalty, self.transcription_penalty, self.run_penalty,
                                                   self.factuality_penalty),
                              "penalties must be >= 0", "set them to 0 to switch shaping off")
        if self.max_copied_values < 0 or self.transcription_run < 2:
            raise ConfigError("reward.max_copied_values/transcription_run", (self.max_copied_values, self.transcription_run),
                              "need max_copied_values >= 0 and transcription_run >= 2", "set e.g. 4 and 3")
        if self.claims_extractor not in ("rules", "llm"):
            raise ConfigError("reward.claims_extractor", self.claims_extractor, "unknown extractor", "use rules or llm")
        if self.claims_extractor == "llm" and not self.claims_backend:
            raise ConfigError("reward.claims_backend", None, "the llm claim extractor needs a served model",
                              "set reward.claims_backend: openai:URL#MODEL, or reward.claims_extractor: rules")
        if not 0 <= self.masked_weight <= 1:
            raise ConfigError("reward.masked_weight", self.masked_weight, "must be in [0, 1]", "set 0 (off) or e.g. 0.5")


@dataclass
class LineupEvalConfig:
    """The held-out evaluation run at the end of training."""

    enabled: bool = help_field(True, "evaluate the trained captioner on the held-out test items")
    directions: list[str] = help_field(["c2s"], "identification directions: c2s and/or s2c")
    modes: list[str] | None = help_field(None, "verifier modes (null = the training reward's mode)")
    compare_initial: bool = help_field(True, "also caption the test items with the untrained policy, as a baseline row")
    verifiers: dict[str, Any] = help_field({}, "name -> backend config of evaluation verifiers (empty = the training verifier)")
    final_checks: bool = help_field(True, "checks the captioner was not trained on: span audit, transcription, full stops, clipped ratio, identification apart from the training verifier")
    bottleneck: bool = help_field(False, "also the caption-only reconstruction bottleneck against the initial model and controls (loads a text encoder)")


@dataclass
class LineupConfig:
    """A LineupRL run: fully described by its YAML plus overrides, saved as out_dir/config.yaml."""

    seed: int = help_field(0, "one seed for everything: item sampling, distractors, shuffling, sampling of captions")
    policy: PolicyConfig = help_field(None, "the captioner being trained")  # type: ignore[assignment]
    verifier: BackendConfig = help_field(None, "the frozen verifier behind the reward")  # type: ignore[assignment]
    data: LineupDataConfig = help_field(None, "series, windows, candidate sets")  # type: ignore[assignment]
    reward: LineupRewardConfig = help_field(None, "identification reward and shaping")  # type: ignore[assignment]
    train: TrainConfig = help_field(None, "TRL trainer settings")  # type: ignore[assignment]
    eval: LineupEvalConfig = help_field(None, "held-out evaluation at the end")  # type: ignore[assignment]

    def __post_init__(self) -> None:
        self.policy = self.policy or PolicyConfig()
        self.verifier = self.verifier or BackendConfig()
        self.data = self.data or LineupDataConfig()
        self.reward = self.reward or LineupRewardConfig()
        self.train = self.train or TrainConfig()
        self.eval = self.eval or LineupEvalConfig()
        if self.train.seed is None:
            self.train.seed = self.seed
        for d in self.eval.directions:
            if d not in ("c2s", "s2c"):
                raise ConfigError("eval.directions", d, "unknown direction", "use c2s and/or s2c")

    def identify_config(self) -> Any:
        from captionrl.judges.identify import IdentifyConfig

        return IdentifyConfig(mode=self.reward.mode, direction="c2s", k=self.reward.k, signal=self.reward.signal,
                              lam=self.reward.lam, precision=self.data.precision, normalise=self.data.normalise)


def load_lineup_config(path: str | Path | None, overrides: Sequence[str] = ()) -> LineupConfig:
    """YAML + ``key=value`` overrides -> validated ``LineupConfig`` (no model is touched)."""
    return load_config(LineupConfig, path, overrides)


# ---------------------------------------------------------------------- preflight
def probe_openai(cfg: BackendConfig, field: str = "verifier", timeout_s: float = 5.0) -> None:
    """Fail fast, before the policy loads, when an OpenAI-compatible verifier does not answer."""
    if cfg.kind != "openai":
        return
    import os

    import httpx

    url = str(cfg.base_url).rstrip("/") + "/models"
    headers = {}
    key = os.environ.get(cfg.api_key_env)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        resp = httpx.get(url, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise ConfigError(
            f"{field}.base_url", cfg.base_url, f"the verifier server does not answer ({type(exc).__name__}: {exc})",
            f"start it first (e.g. vllm serve {cfg.model} --port PORT) or fix {field}.base_url",
        ) from exc
    if resp.status_code != 200:
        raise ConfigError(f"{field}.base_url", cfg.base_url, f"GET {url} returned HTTP {resp.status_code}",
                          f"check the server and {field}.api_key_env")
    try:
        served = [m.get("id") for m in resp.json().get("data", [])]
    except (ValueError, AttributeError):
        served = []
    if served and cfg.model not in served:
        raise ConfigError(f"{field}.model", cfg.model, f"is not served at {cfg.base_url} (it serves {served})",
                          f"set {field}.model to one of {served}")


# ---------------------------------------------------------------------- data
@dataclass
class LineupData:
    """Items per split as dataset rows, plus the Series objects the evaluation needs."""

    rows: dict[str, list[dict[str, Any]]]
    pool: dict[str, Any]  # id -> Series (every window that can be a candidate)


def build_data(cfg: LineupConfig) -> LineupData:
    """Windows and candidate sets per split, validated; no model involved."""
    if cfg.data.candidates_file:
        return _data_from_file(cfg)
    from captionrl.domains.corpora import load_embedded_corpus
    from captionrl.domains.datasets import split_windows

    corpus = load_embedded_corpus(cfg.data.series) if cfg.data.corpus == "embedded" and cfg.data.series else cfg.data.corpus
    windows = split_windows(corpus, cfg.data.window, stride=cfg.data.stride, fractions=cfg.data.splits)
    want = {"train": cfg.data.n_train, "val": cfg.data.n_val, "test": cfg.data.n_test}
    rows: dict[str, list[dict[str, Any]]] = {}
    pool: dict[str, Any] = {}
    for split, n in want.items():
        items = windows.get(split, [])
        if n == 0:
            rows[split] = []
            continue
        if len(items) < cfg.reward.k:
            raise DataError(f"data.{split}", len(items), f"too few {split} windows for K={cfg.reward.k} candidates",
                            "use a shorter data.window, a smaller data.stride, or more series")
        for s in items:
            pool[s.id] = s
        sets = mine(items, cfg.reward.k, cfg.seed, cfg.data.distractors)
        rng = np.random.default_rng([cfg.seed, ["train", "val", "test"].index(split)])
        chosen = list(range(len(items)))
        if n is not None and n < len(items):
            chosen = sorted(rng.choice(len(items), size=n, replace=False).tolist())
        rows[split] = [make_row(cfg, items[i], [pool[c] for c in sets[items[i].id]]) for i in chosen]
    if not rows["train"]:
        raise DataError("data.n_train", cfg.data.n_train, "no training items", "check data.corpus and data.window")
    return LineupData(rows=rows, pool=pool)


def mine(items: Sequence[Any], k: int, seed: int, rule: str) -> dict[str, list[str]]:
    """item id -> its K-1 distractor ids (nearest first), mined within the item's own split."""
    from captionrl.domains.candidates import mine_candidates

    sets = mine_candidates(items, items, k=k, rule=rule, seed=seed, progress=False)
    return {cs.item_id: list(cs.distractor_ids) for cs in sets}


def make_row(cfg: LineupConfig, item: Any, distractors: Sequence[Any]) -> dict[str, Any]:
    """One dataset row in TRL's shape: chat ``prompt`` plus the columns the reward reads."""
    from captionrl.domains.captioning import caption_messages
    from captionrl.domains.timeseries import render_numbers

    values = np.asarray(item.values, dtype=float).tolist()
    text, _ = render_numbers(np.asarray(values), precision=cfg.data.precision, normalise=cfg.data.normalise)
    cands = [values, *[np.asarray(d.values, dtype=float).tolist() for d in distractors]]
    validate_candidate_set(cands, cfg.reward.k, f"candidates[{item.id}]", k_field="reward.k")
    return {
        "prompt": _instructed(caption_messages(text, len(values)), cfg.data.instruction),
        "item_id": str(item.id),
        "series": values,
        "series_text": text,
        "candidates": cands,
        "candidate_ids": [str(item.id), *[str(d.id) for d in distractors]],
    }


def _instructed(messages: list[dict[str, Any]], instruction: str | None) -> list[dict[str, Any]]:
    """The caption prompt with ``data.instruction`` in place of the default instruction (None: unchanged)."""
    from captionrl.domains.captioning import CAPTION_INSTRUCTION

    if not instruction:
        return messages
    return [{**m, "content": m["content"].replace(CAPTION_INSTRUCTION, instruction)} for m in messages]


def _data_from_file(cfg: LineupConfig) -> LineupData:
    from captionrl.domains.captioning import caption_messages
    from captionrl.domains.timeseries import render_numbers
    from captionrl.records import read_jsonl
    from captionrl.types import Series

    path = Path(str(cfg.data.candidates_file))
    if not path.exists():
        raise ConfigError("data.candidates_file", str(path), "file not found", "give a JSONL of candidate sets, or null to mine them")
    rows: dict[str, list[dict[str, Any]]] = {"train": [], "val": [], "test": []}
    pool: dict[str, Any] = {}
    for n, rec in enumerate(read_jsonl(path)):
        for key in ("item_id", "candidates"):
            if key not in rec:
                raise DataError(f"{path.name}:{n + 1}.{key}", sorted(rec), f"missing {key!r}", "write one JSON object per item with item_id and candidates")
        cands = [list(map(float, c)) for c in rec["candidates"]]
        validate_candidate_set(cands, cfg.reward.k, f"candidates[{rec['item_id']}]", k_field="reward.k")
        ids = [str(x) for x in rec.get("candidate_ids") or [rec["item_id"], *[f"{rec['item_id']}#d{j}" for j in range(1, len(cands))]]]
        for cid, vals in zip(ids, cands, strict=False):
            pool.setdefault(cid, Series(id=cid, values=np.asarray(vals)))
        text, _ = render_numbers(np.asarray(cands[0]), precision=cfg.data.precision, normalise=cfg.data.normalise)
        split = str(rec.get("split", "train"))
        rows.setdefault(split, []).append({
            "prompt": _instructed(caption_messages(text, len(cands[0])), cfg.data.instruction), "item_id": str(rec["item_id"]), "series": cands[0],
            "series_text": text, "candidates": cands[: cfg.reward.k], "candidate_ids": ids[: cfg.reward.k],
        })
    if not rows["train"]:
        raise DataError("data.candidates_file", str(path), "holds no training items (split: train)", "add items with split: train")
    limits = {"train": cfg.data.n_train, "val": cfg.data.n_val, "test": cfg.data.n_test}
    for split, n in limits.items():
        if n is not None:
            rows[split] = rows[split][:n]
    return LineupData(rows=rows, pool=pool)


def add_charts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """VLM policies read the chart: an ``image`` column and a prompt without the numbers."""
    from captionrl.domains.captioning import CAPTION_INSTRUCTION
    from captionrl.domains.timeseries import render_chart

    out = []
    for r in rows:
        img = render_chart(np.asarray(r["series"]))
        text = f"The chart shows a time series of {len(r['series'])} values. {CAPTION_INSTRUCTION}"
        out.append({**r, "prompt": [{"role": "user", "content": text}], "image": img})
    return out


# ---------------------------------------------------------------------- reward shaping
def shaping_config(reward: LineupRewardConfig) -> ShapingConfig:
    """The shaping terms of ``reward`` (lam is applied by the identification judge itself, so 1 here)."""
    from captionrl.judges.transcription import TranscriptionConfig
    from captionrl.rewards.factuality import FactualityTerm

    guard = None
    if reward.transcription_penalty > 0 or reward.run_penalty > 0:
        guard = TranscriptionConfig(max_copied_values=reward.max_copied_values, min_run=reward.transcription_run,
                                    value_penalty=reward.transcription_penalty, run_penalty=reward.run_penalty)
    backend = None
    if reward.claims_extractor == "llm" and reward.factuality_penalty > 0:
        from captionrl.backends import make_backend, parse_backend_spec

        backend = make_backend(parse_backend_spec(str(reward.claims_backend)))
    term = FactualityTerm(weight=reward.factuality_penalty, tolerance=reward.factuality_tolerance,
                          extractor=reward.claims_extractor if backend is not None else "rules", backend=backend)
    return ShapingConfig(lam=1.0, max_caption_chars=reward.max_caption_chars, length_penalty=reward.length_penalty,
                         transcription=guard, factuality=term, masked_weight=reward.masked_weight,
                         unfinished_penalty=reward.unfinished_penalty)


PREFLIGHT_KEYS = ("reward.transcription_penalty", "reward.run_penalty", "reward.max_copied_values",
                  "reward.factuality_penalty", "reward.masked_weight", "reward.mode", "reward.signal", "verifier")
"""Config keys that change what the reward preflight finds (printed when it refuses a run)."""


def preflight(cfg: LineupConfig, rows: Sequence[Mapping[str, Any]], reward: Any, out: Path) -> Any:
    """Issue 11's reward preflight on a seeded sample of training rows: the describer's caption must beat
    every hacking probe under ``reward`` (the trainer's own callable); raises ``PreflightError`` otherwise."""
    import os

    from captionrl.preflight import run_preflight, sample_rows, series_references

    if cfg.train.preflight_items <= 0:
        return None
    chosen = sample_rows(rows, cfg.train.preflight_items, cfg.seed)
    honest, dumps = series_references(chosen, cfg.data.precision)
    main = int(os.environ.get("RANK", "0")) == 0
    return run_preflight(reward, chosen, honest, dumps, keys=PREFLIGHT_KEYS, force=cfg.train.force_preflight,
                         out_dir=out if main else None, echo=main)


# ---------------------------------------------------------------------- run
def run(cfg: LineupConfig, verifier: Any = None) -> dict[str, Any]:
    """Train, save, plot, evaluate; returns the paths of what was written (and a few figures).

    ``verifier`` overrides ``cfg.verifier`` with an already-loaded backend (tests share one model).
    """
    from captionrl.train import common
    from captionrl.train.logging import MetricsLog, SampleLog, plot_curves

    out = Path(cfg.train.out_dir)
    common.quiet_offline_env(out)
    resume_from = common.prepare_run_dir(cfg, out, cfg.train.resume)  # config diff check, before any load
    probe_openai(cfg.verifier)
    for name, vcfg in cfg.eval.verifiers.items():
        probe_openai(_backend_config(vcfg, f"eval.verifiers.{name}"), f"eval.verifiers.{name}")
    data = build_data(cfg)
    common.apply_threads(cfg.train.threads)

    from captionrl.backends import make_backend
    from captionrl.rewards import make_identification_reward

    t0 = time.perf_counter()
    verifier = verifier if verifier is not None else make_backend(cfg.verifier)
    model, processing, is_vlm = common.load_policy(cfg.policy)
    use_chart = cfg.policy.input == "chart" or (cfg.policy.input == "auto" and is_vlm)
    if use_chart and not is_vlm:
        raise ConfigError("policy.input", "chart", f"{cfg.policy.model} is a language-only model", "set policy.input: numbers, or use a VLM policy")
    train_rows = add_charts(data.rows["train"]) if use_chart else data.rows["train"]

    from datasets import Dataset

    dataset = Dataset.from_list(train_rows)
    samples = SampleLog(out)
    reward = ShapedReward(make_identification_reward(verifier, cfg.identify_config()), shaping_config(cfg.reward),
                          samples, name="lineup")
    preflight(cfg, train_rows, reward, out)
    args = common.trainer_args(cfg.train, seed=int(cfg.train.seed or 0))
    trainer = common.build_trainer(
        cfg.train, args, model, processing, [reward], dataset,
        callbacks=[MetricsLog(out / "metrics.jsonl")], peft_config=common.lora_config(cfg.policy),
    )
    if resume_from is not None:
        print(f"resuming from {resume_from}")
    trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    samples.close()
    train_s = time.perf_counter() - t0
    result: dict[str, Any] = {"out_dir": str(out), "train_seconds": round(train_s, 1)}
    model_dir = common.save_final_model(trainer, out / "model")  # every rank: ZeRO-3 gathers the weights
    if not trainer.accelerator.is_main_process:
        return result

    result["model"] = str(model_dir)
    if data.rows.get("val"):
        best = select_checkpoint(cfg, data, processing, reward, out, use_chart)
        result["selection"] = best
        if best.get("checkpoint"):
            result["model"] = best["checkpoint"]
    curves = plot_curves(out / "metrics.jsonl", out / "curves.png")
    result["curves"] = str(curves) if curves else None
    result["tensorboard"] = str(out / "tensorboard") if cfg.train.report_to else None
    if cfg.eval.enabled and data.rows.get("test"):
        best = result.get("selection", {}).get("checkpoint")
        policy = load_checkpoint_policy(cfg, Path(best)) if best else common.unwrap_for_inference(trainer)
        result["eval"] = evaluate(cfg, data, policy, processing, verifier, out / "eval", use_chart)
    from captionrl.records import write_json

    write_json(out / "result.json", result)
    return result


def load_checkpoint_policy(cfg: LineupConfig, ckpt: Path) -> Any:
    """A checkpoint's policy for inference: full weights, or the base model plus the saved LoRA adapters."""
    import dataclasses

    from captionrl.train.common import load_policy

    if (ckpt / "adapter_config.json").exists():
        from peft import PeftModel

        base, _, _ = load_policy(cfg.policy)
        model = PeftModel.from_pretrained(base, str(ckpt)).merge_and_unload()
    else:
        model, _, _ = load_policy(dataclasses.replace(cfg.policy, model=str(ckpt)))
    model.eval()
    return model


def select_checkpoint(cfg: LineupConfig, data: LineupData, processing: Any, reward: ShapedReward, out: Path,
                      use_chart: bool) -> dict[str, Any]:
    """Paper, Table 4: pick the checkpoint whose greedy captions earn the highest training reward on the
    validation items (no test metric is used). Records are resumable, keyed by (checkpoint, item)."""
    from tqdm.auto import tqdm

    from captionrl.records import RecordWriter, write_json

    rows = add_charts(data.rows["val"]) if use_chart else data.rows["val"]
    ckpts = sorted((p for p in (out / "checkpoints").glob("checkpoint-*") if (p / "trainer_state.json").exists()),
                   key=lambda p: int(p.name.split("-")[1]))
    sel = out / "selection"
    writer = RecordWriter(sel / "records.jsonl")
    saved_samples, reward.samples = reward.samples, None
    scores: dict[str, float] = {}
    try:
        for ckpt in tqdm(ckpts, desc="select checkpoint", unit="ckpt"):
            todo = [r for r in rows if not writer.has(f"{ckpt.name}|{r['item_id']}")]
            if todo:
                model = load_checkpoint_policy(cfg, ckpt)
                caps = generate_captions(model, processing, todo, cfg.train.max_completion_length, use_chart, ckpt.name)
                del model
                cols = {k: [r[k] for r in todo] for k in ("item_id", "series", "series_text", "candidates")}
                got = reward(prompts=[r["prompt"] for r in todo], completions=[caps[r["item_id"]] for r in todo], **cols)
                for r, g in zip(todo, got, strict=True):
                    writer.write({"key": f"{ckpt.name}|{r['item_id']}", "checkpoint": ckpt.name,
                                  "item_id": r["item_id"], "caption": caps[r["item_id"]], "reward": g})
            vals = [rec["reward"] for rec in writer.records() if rec["checkpoint"] == ckpt.name and rec["reward"] is not None]
            if vals:
                scores[ckpt.name] = float(np.mean(vals))
    finally:
        reward.samples = saved_samples
        writer.close()
    best = max(scores, key=lambda k: scores[k]) if scores else None
    summary = {"protocol": "checkpoint-selection", "columns": ["system", "val_reward"],
               "rows": [{"system": k, "val_reward": round(v, 4)} for k, v in scores.items()],
               "config": {"n_val": len(rows), "criterion": "mean training reward of greedy captions"},
               "best": best}
    write_json(sel / "summary.json", summary)
    return {"checkpoint": str(out / "checkpoints" / best) if best else None, "scores": scores}


def _backend_config(value: Any, field: str) -> BackendConfig:
    from captionrl.config import from_dict

    if isinstance(value, BackendConfig):
        return value
    return from_dict(BackendConfig, value or {}, prefix=field + ".")


def generate_captions(model: Any, processing: Any, rows: Sequence[Mapping[str, Any]], max_new_tokens: int,
                      use_chart: bool, name: str, clipped: dict[str, bool] | None = None) -> dict[str, str]:
    """Greedy captions of ``rows`` by an in-memory policy (the same prompts it was trained on); ``clipped``
    (if given) receives, per item, whether the caption was cut by the token budget."""
    from captionrl.backends import ChatRequest
    from captionrl.backends.hf import HFBackend

    backend = HFBackend.from_model(model, processing, name=name, batch_size=8)
    reqs = []
    for r in rows:
        msgs = r["prompt"]
        if use_chart:
            text = msgs[0]["content"]
            msgs = [{"role": "user", "content": [{"type": "image", "image": r["image"]}, {"type": "text", "text": text}]}]
        reqs.append(ChatRequest(messages=msgs, max_new_tokens=max_new_tokens, temperature=0.0))
    gens = backend.generate(reqs)
    if clipped is not None:
        clipped.update({str(r["item_id"]): g.finish_reason == "length" for r, g in zip(rows, gens, strict=True)})
    return {str(r["item_id"]): (g.text or "") for r, g in zip(rows, gens, strict=True)}


def evaluate(cfg: LineupConfig, data: LineupData, policy: Any, processing: Any, verifier: Any,
             out_dir: Path, use_chart: bool) -> dict[str, Any]:
    """Held-out identification of the trained captioner (and the untrained one) via ``eval.identification``."""
    from captionrl.eval.identification import CaptionSet, IdentifyEvalConfig, run_identification

    rows = data.rows["test"]
    if use_chart:
        rows = add_charts(rows)
    max_new = cfg.train.max_completion_length
    clipped: dict[str, dict[str, bool]] = {"trained": {}, "initial": {}}
    systems = [CaptionSet("trained", generate_captions(policy, processing, rows, max_new, use_chart, "trained",
                                                       clipped["trained"]))]
    if cfg.eval.compare_initial:
        from captionrl.train.common import load_policy

        base, base_proc, _ = load_policy(cfg.policy)
        base.eval()
        systems.append(CaptionSet("initial", generate_captions(base, base_proc, rows, max_new, use_chart, "initial",
                                                               clipped["initial"])))
        del base
    items = [data.pool[r["item_id"]] for r in rows]
    distractors = {r["item_id"]: list(r["candidate_ids"][1:]) for r in rows}
    verifiers = {"train-verifier": verifier}
    from captionrl.backends import make_backend

    for name, vcfg in cfg.eval.verifiers.items():
        verifiers[name] = make_backend(_backend_config(vcfg, f"eval.verifiers.{name}"))
    ecfg = IdentifyEvalConfig(modes=list(cfg.eval.modes or [cfg.reward.mode]), directions=list(cfg.eval.directions),
                              ks=[cfg.reward.k], seed=cfg.seed, precision=cfg.data.precision)
    summary = run_identification(items, systems, distractors, data.pool, verifiers, ecfg, out_dir)
    result = {"table": str(out_dir / "table.md"), "summary": str(out_dir / "summary.json"),
              "rows": summary.get("rows", []), "captions": {s.name: s.captions for s in systems}}
    if cfg.eval.final_checks:
        from captionrl.eval.final_checks import run_final_checks

        checks = run_final_checks({s.name: s.captions for s in systems}, {it.id: it.values for it in items}, out_dir,
                                  identification=summary, guard=_guard(cfg.reward),
                                  tolerance=cfg.reward.factuality_tolerance, clipped=clipped,
                                  bottleneck=cfg.eval.bottleneck)
        result["final_checks"] = str(out_dir / "final_checks.md")
        result["final_rows"] = checks["rows"]
    return result


def _guard(reward: LineupRewardConfig) -> Any:
    """The transcription guard's counting rule (its penalties are irrelevant to the evaluation column)."""
    from captionrl.judges.transcription import TranscriptionConfig

    return TranscriptionConfig(max_copied_values=reward.max_copied_values, min_run=reward.transcription_run)


# ---------------------------------------------------------------------- CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="YAML run config, e.g. configs/lineup-cpu.yaml")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.max_steps=10 train.out_dir=runs/x")
    p.add_argument("--check", action="store_true", help="validate the config and the data, then stop (loads no model)")


def main(args: argparse.Namespace) -> int:
    cfg = load_lineup_config(args.config, args.overrides)
    if args.check:
        probe_openai(cfg.verifier)
        data = build_data(cfg)
        print(json.dumps({k: len(v) for k, v in data.rows.items()}))
        return 0
    result = run(cfg)
    if "model" in result:
        print(f"model:      {result['model']}")
        print(f"curves:     {result.get('curves')}")
        if result.get("tensorboard"):
            print(f"tensorboard: tensorboard --logdir {result['tensorboard']}")
        ev = result.get("eval")
        if ev:
            print(f"evaluation: {ev['table']}")
            print(Path(ev["table"]).read_text())
            if ev.get("final_checks"):
                print(f"checks the model was not trained on: {ev['final_checks']}")
                print(Path(ev["final_checks"]).read_text())
    return 0
