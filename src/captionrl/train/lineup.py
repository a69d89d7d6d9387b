"""``captionrl train lineup``: LineupRL, RL of a captioner with the caption-to-series identification reward.

Figure 2(b) of the paper: for each series the policy samples a group of G captions; a frozen verifier
reads each caption and the K candidate series (the true one and K-1 mined distractors) and must pick the
described one; the group's rewards drive an RLOO (or GRPO) update. The steps are the shared skeleton's
(``train.skeleton``), the dataset is ``domains.lineup_data`` and the trainer is TRL's (``train.common``);
this module is the recipe: its config, the shaped reward and the end-of-run selection and evaluation.

Reward shaping (length, transcription guard, factuality, numbers-masked pass) is
``captionrl.rewards.shaping.ShapedReward`` around the identification reward: a failed verification stays
``None``, never a penalty-only score.

Run folder (``train.out_dir``): ``config.yaml``, ``preflight.md``/``preflight.json`` (the reward preflight),
``checkpoints/``, ``metrics.jsonl``, ``samples.rank*.jsonl``, ``tensorboard/``, ``curves.png``, ``model/`` and
``eval/`` (records.jsonl, table.md, summary.json, final_checks.md/.json: checks the model was not trained on).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from captionrl.backends import BackendConfig
from captionrl.config import help_field
from captionrl.domains.lineup_data import LineupData, LineupDataConfig, add_charts, build_lineup_data
from captionrl.errors import ConfigError
from captionrl.judges.identification import IdentifyConfig, IdentifyScoring
from captionrl.judges.series_qa import SeriesQuestionsConfig
from captionrl.rewards.bound import RewardBound
from captionrl.rewards.shaping import ShapedReward, ShapingConfig
from captionrl.train import common
from captionrl.train.common import (
    PolicyConfig,
    TrainConfig,
    probe_servers,
    run_summary,
)
from captionrl.train.common import backend_config as _backend_config  # the name evaluate() uses
from captionrl.train.skeleton import Recipe, Run, train

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------- config
FAMILIES = ("identification", "answerability", "judge")
"""Reward families ``train lineup`` trains with: LineupRL's own, and Table 4's two RL baselines."""


@dataclass
class AnswerabilityConfig(SeriesQuestionsConfig):
    """The answerability baseline (Table 4, after CapRL): questions written and verified per series
    (``judges.series_qa``), then the frozen answerer's accuracy on them from the caption alone."""

    n_questions: int = help_field(4, "questions drawn per caption (with replacement) from the series' verified ones")
    cannot_answer: bool = help_field(True, "add a 'cannot be answered from the description' option to every question")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_questions < 1:
            raise ConfigError("reward.answerability.n_questions", self.n_questions, "must be >= 1", "set n_questions: 4")


@dataclass
class JudgeFamilyConfig:
    """The LLM-as-judge baseline (Table 4): the frozen model grades each caption 1-10."""

    mode: str = help_field("generate", "generate (parse an integer grade 1-10, the paper's) or choose (expected grade over the digits 1-9 from the logits; never unparseable)")
    show_series: bool = help_field(True, "show the judge the series' values (as the verifier prints them) before the caption; false: it grades the caption alone")
    max_new_tokens: int = help_field(8, "generate: tokens for the grade")

    def __post_init__(self) -> None:
        if self.mode not in ("generate", "choose"):
            raise ConfigError("reward.judge.mode", self.mode, "unknown mode", "use generate or choose")


@dataclass
class LineupRewardConfig(ShapingConfig, RewardBound, IdentifyScoring):
    """The reward family (identification, or a Table 4 baseline), its settings, the shaping around it and
    the lost-reward bound every recipe shares (``RewardBound``: a run whose verifier stays down stops).

    ``IdentifyScoring``'s mode, k, signal and lam set the identification reward; k also sets the lineups the
    held-out identification evaluation uses under every family. The shaping keys (``reward.length_penalty``,
    ``reward.transcription_penalty``, ...) are ``ShapingConfig``'s, declared once for training, preflight,
    the engine adapters and ``serve reward``."""

    FIELD_PREFIX: ClassVar[str] = "reward"

    family: str = help_field("identification", "identification (LineupRL: find the series among K from the caption), answerability (Table 4 baseline: accuracy on the series' verified questions answered from the caption), or judge (Table 4 baseline: a 1-10 grade of the caption); the verifier is the frozen model of each")
    answerability: AnswerabilityConfig = field(default_factory=AnswerabilityConfig, metadata={"help": "family answerability: question writing, verification and drawing"})
    judge: JudgeFamilyConfig = field(default_factory=JudgeFamilyConfig, metadata={"help": "family judge: how the grade is asked and read"})

    def __post_init__(self) -> None:
        RewardBound.__post_init__(self)  # the bound's checks, then (cooperatively) IdentifyScoring's
        if self.family not in FAMILIES:
            from captionrl.registry import suggest

            raise ConfigError("reward.family", self.family, "unknown reward family", suggest(self.family, list(FAMILIES)))
        self.validate_shaping()


@dataclass
class LineupEvalConfig:
    """The held-out evaluation run at the end of training."""

    enabled: bool = help_field(True, "evaluate the trained captioner on the held-out test items")
    directions: list[str] = help_field(["c2s"], "identification directions: c2s and/or s2c")
    modes: list[str] | None = help_field(None, "verifier modes (null = the training reward's mode)")
    compare_initial: bool = help_field(True, "also caption the test items with the untrained policy, as a baseline row")
    controls: bool = help_field(True, "also score the empty-caption and shuffled-caption controls under every verifier (they must sit at chance; false saves their verifier calls, two thirds of the held-out identification's with compare_initial, and changes no final check)")
    verifiers: dict[str, Any] = help_field({}, "name -> evaluation verifier that took no part in training: claims:rules (code-checked claims, offline, no model), a backend spec (openai:URL#MODEL) or a backend config mapping; the training verifier is scored too (train_verifier), in its own column and never in the mean")
    train_verifier: bool = help_field(True, "also score the test items under the training verifier, in its own column (c2s[train]) and never in the mean; false skips its forward passes (most of the final identification's time with a model verifier) when that column carries no information, as in the main job, where the initial model already scores near 1.0")
    final_checks: bool = help_field(True, "checks the captioner was not trained on: span audit, transcription, full stops, clipped ratio, identification apart from the training verifier")
    bottleneck: bool = help_field(False, "also the caption-only reconstruction bottleneck against the initial model and controls (loads a text encoder)")

    def __post_init__(self) -> None:
        for name, value in self.verifiers.items():  # validated now, before any model loads
            eval_verifier(value, f"eval.verifiers.{name}")
        if self.enabled and not self.train_verifier and not self.verifiers:
            raise ConfigError("eval.train_verifier", False, "no verifier would score the test items",
                              "name one in eval.verifiers (e.g. claims: claims:rules) or set eval.train_verifier=true")


@dataclass
class LineupConfig:
    """A LineupRL run: fully described by its YAML plus overrides, saved as out_dir/config.yaml."""

    seed: int = help_field(0, "one seed for everything: item sampling, distractors, shuffling, sampling of captions")
    seeds: list[int] | str | int = help_field([], "train once per seed (e.g. seeds=0,1,2 or seeds=3) into train.out_dir/seed-N and report the spread over seeds (seeds.md); empty: one run with `seed`")
    check: bool = help_field(False, "validate the config and the data, then stop (loads no model)")
    policy: PolicyConfig = field(default_factory=PolicyConfig, metadata={"help": "the captioner being trained"})
    verifier: BackendConfig = field(default_factory=BackendConfig, metadata={"help": "the frozen verifier behind the reward"})
    data: LineupDataConfig = field(default_factory=LineupDataConfig, metadata={"help": "series, windows, candidate sets"})
    reward: LineupRewardConfig = field(default_factory=LineupRewardConfig, metadata={"help": "identification reward and shaping"})
    train: TrainConfig = field(default_factory=TrainConfig, metadata={"help": "TRL trainer settings"})
    eval: LineupEvalConfig = field(default_factory=LineupEvalConfig, metadata={"help": "held-out evaluation at the end"})

    def __post_init__(self) -> None:
        from captionrl.train.seeds import parse_seeds

        self.seeds = parse_seeds(self.seeds)
        if self.train.seed is None:
            self.train.seed = self.seed
        for d in self.eval.directions:
            if d not in ("c2s", "s2c"):
                raise ConfigError("eval.directions", d, "unknown direction", "use c2s and/or s2c")

    def identify_config(self) -> IdentifyConfig:
        """The training reward's judge settings: the reward's scoring, c2s, series printed as the data says."""
        scoring = {f.name: getattr(self.reward, f.name) for f in dataclasses.fields(IdentifyScoring)}
        return IdentifyConfig(**scoring, direction="c2s", precision=self.data.precision, normalise=self.data.normalise)


def eval_verifier(value: Any, field: str) -> Any:
    """One ``eval.verifiers`` entry: a ``ClaimsVerifier`` for ``claims:...``, else a ``BackendConfig`` (from a
    spec string such as ``openai:URL#MODEL`` or a mapping)."""
    from captionrl.judges.claims_verifier import is_claims_spec, parse_claims_spec

    if is_claims_spec(value):
        return parse_claims_spec(value, field)
    if isinstance(value, str):
        from captionrl.backends import parse_backend_spec

        try:
            return parse_backend_spec(value)
        except ConfigError as exc:
            raise ConfigError(field, value, f"is not a verifier spec ({exc.problem})",
                              "write claims:rules, openai:http://HOST:PORT/v1#MODEL or a backend mapping") from exc
    return _backend_config(value, field)


def _eval_backends(cfg: LineupConfig) -> list[tuple[BackendConfig, str]]:
    """The evaluation verifiers that are model backends (servers to probe before anything loads)."""
    out = []
    for name, value in cfg.eval.verifiers.items():
        v = eval_verifier(value, f"eval.verifiers.{name}")
        if isinstance(v, BackendConfig):
            out.append((v, f"eval.verifiers.{name}"))
    return out


# ---------------------------------------------------------------------- reward preflight
PREFLIGHT_KEYS = ("reward.transcription_penalty", "reward.run_penalty", "reward.max_copied_values",
                  "reward.max_numbers", "reward.number_penalty",
                  "reward.factuality_penalty", "reward.factuality_bonus", "reward.masked_weight", "reward.mode", "reward.signal", "verifier")
"""Config keys that change what the reward preflight finds (printed when it refuses a run)."""


FAMILY_KEYS = {"identification": ("reward.mode", "reward.signal"),
               "answerability": ("reward.answerability.generator", "reward.answerability.blind_check",
                                 "reward.answerability.n_questions"),
               "judge": ("reward.judge.mode", "reward.judge.show_series")}
"""The family's own keys that change what the preflight finds (with the shaping keys and the verifier)."""


def preflight_keys(reward: LineupRewardConfig) -> tuple[str, ...]:
    shaping = tuple(k for k in PREFLIGHT_KEYS if k not in ("reward.mode", "reward.signal"))
    return ("reward.family", *FAMILY_KEYS[reward.family], *shaping)


def preflight(cfg: LineupConfig, rows: Sequence[Mapping[str, Any]], reward: Any, out: Path) -> Any:
    """Issue 11's reward preflight on a seeded sample of training rows: the describer's caption must beat
    every hacking probe under ``reward`` (the trainer's own callable); raises ``PreflightError`` otherwise."""
    import os

    from captionrl.preflight import invented_values, run_preflight, sample_rows, series_references

    if cfg.train.preflight_items <= 0:
        return None
    chosen = sample_rows(rows, cfg.train.preflight_items, cfg.seed)
    honest, dumps = series_references(chosen, cfg.data.precision)
    main = int(os.environ.get("RANK", "0")) == 0
    if main:
        logger.info(f"reward preflight under the {cfg.reward.family} reward")
    return run_preflight(reward, chosen, honest, dumps, keys=preflight_keys(cfg.reward), force=cfg.train.force_preflight,
                         out_dir=out if main else None, echo=main,
                         extra={"invented_values": invented_values(chosen, cfg.data.precision)})


# ---------------------------------------------------------------------- run
class LineupRecipe(Recipe):
    """LineupRL in the shared skeleton: lineups as data, the shaped identification reward, and at the end
    checkpoint selection on the validation items and the held-out identification evaluation."""

    title = "LineupRL"

    def __init__(self, cfg: LineupConfig, verifier: Any = None) -> None:
        super().__init__(cfg)
        self.verifier = verifier
        self.use_chart = False
        self.reward: ShapedReward | None = None
        self.samples: Any = None
        self.questions: dict[str, Any] | None = None

    def servers(self) -> list[tuple[Any, str]]:
        cfg = self.cfg  # the evaluation verifiers are only needed (and probed) when the run evaluates
        return [(cfg.verifier, "verifier"), *(_eval_backends(cfg) if cfg.eval.enabled else [])]

    def dataset(self, run: Run) -> LineupData:
        return build_lineup_data(self.cfg.data, self.cfg.reward.k, self.cfg.seed)

    def load_policy(self, run: Run) -> None:
        from captionrl.backends import make_backend

        cfg = self.cfg
        self.verifier = self.verifier if self.verifier is not None else make_backend(cfg.verifier)
        super().load_policy(run)
        self.use_chart = cfg.policy.input == "chart" or (cfg.policy.input == "auto" and run.is_vlm)
        if self.use_chart and not run.is_vlm:
            raise ConfigError("policy.input", "chart", f"{cfg.policy.model} is a language-only model",
                              "set policy.input: numbers, or use a VLM policy")
        if cfg.reward.family == "answerability":
            self.questions = attach_questions(cfg, run.data, self.verifier, run.out)

    def train_dataset(self, run: Run) -> Any:
        from datasets import Dataset

        rows = run.data.rows["train"]
        return Dataset.from_list(add_charts(rows, self.cfg.data.instruction, self.cfg.data.chart_size) if self.use_chart else rows)

    def reward_functions(self, run: Run) -> list[Any]:
        from captionrl.train.logging import SampleLog

        self.samples = SampleLog(run.out)
        self.reward = ShapedReward(family_reward(self.cfg, self.verifier), self.cfg.reward, self.samples,
                                   name="lineup", family=self.cfg.reward.family)
        return [self.reward]

    def summary(self, run: Run) -> dict[str, Any]:
        out: dict[str, Any] = {"reward_family": self.cfg.reward.family}
        if self.questions is not None:
            out["questions"] = self.questions
        return out

    def preflight(self, run: Run) -> None:
        """The describer's caption must beat every hacking probe under the trainer's own reward callable."""
        rows = run.data.rows["train"]
        preflight(self.cfg, add_charts(rows, self.cfg.data.instruction, self.cfg.data.chart_size) if self.use_chart else rows, self.reward, run.out)

    def close(self, run: Run) -> None:
        if self.samples is not None:
            self.samples.close()

    def final_evaluation(self, run: Run) -> dict[str, Any]:
        """Checkpoint selection by the training reward on the validation items (when there are any), then
        the held-out identification evaluation of the selected (or last) policy."""
        cfg, data, out = self.cfg, run.data, run.out
        result: dict[str, Any] = {}
        if data.rows.get("val"):
            best = select_checkpoint(cfg, data, run.processing, self.reward, out, self.use_chart)
            result["selection"] = best
            if best.get("checkpoint"):
                result["model"] = best["checkpoint"]
        if cfg.eval.enabled and data.rows.get("test"):
            best = result.get("selection", {}).get("checkpoint")
            policy = load_checkpoint_policy(cfg, Path(best)) if best else common.unwrap_for_inference(run.trainer)
            result["eval"] = evaluate(cfg, data, policy, run.processing, self.verifier, out / "eval", self.use_chart)
        return result


def family_reward(cfg: LineupConfig, verifier: Any) -> Any:
    """The base reward of ``cfg.reward.family`` (a ``JudgeReward``: ``None`` where its judge could not score),
    named after the family in TRL's logs (``<family>/unscored_frac``, ``<family>/<field>``)."""
    from captionrl.rewards import JudgeReward, make_identification_reward

    family = cfg.reward.family
    if family == "identification":
        return make_identification_reward(verifier, cfg.identify_config())
    if family == "answerability":
        from captionrl.judges.qa import QAConfig, QAJudge

        a = cfg.reward.answerability
        qa = QAConfig(n_questions=a.n_questions, seed=cfg.seed, cannot_answer=a.cannot_answer, subject="time series")
        return JudgeReward(QAJudge(verifier, qa), name="answerability", log_fields=("accuracy", "cannot_answer_rate"))
    from captionrl.judges.scalar import ScalarConfig, ScalarJudge

    j = cfg.reward.judge
    scalar = ScalarConfig(mode=j.mode, use_reference=False, max_new_tokens=j.max_new_tokens, subject="a time series",
                          context_column="series_text" if j.show_series else None)
    return JudgeReward(ScalarJudge(verifier, scalar), name="judge", log_fields=("expected_grade", "grade"))


def attach_questions(cfg: LineupConfig, data: LineupData, backend: Any, out: Path, batch: int = 16) -> dict[str, Any]:
    """The answerability family's data: verified questions for every train and val series (``questions``
    column); series with fewer than ``min_verified`` leave their split. Written to ``questions.jsonl``
    (resumable: a rerun reuses every item's questions) with the counts in ``questions_summary.json``. An
    item whose generation or verification request failed is not written (an outage is not "no questions"):
    it sits out this run and the next run retries it."""
    from captionrl.errors import DataError
    from captionrl.judges.series_qa import SeriesQuestionMaker, question_record
    from captionrl.records import RecordWriter, write_json

    a = cfg.reward.answerability
    maker = SeriesQuestionMaker(backend, a, seed=cfg.seed, precision=cfg.data.precision)
    stats: dict[str, Any] = {"generator": a.generator, "verify": a.verify, "blind_check": a.blind_check,
                             "min_verified": a.min_verified}
    failed: dict[str, str] = {}  # item -> error of a request that failed: not persisted, retried next run
    with RecordWriter(out / "questions.jsonl", key_field="item_id") as writer:
        for split in ("train", "val"):
            rows = data.rows.get(split) or []
            todo = [r for r in rows if not writer.has(r["item_id"])]
            for start in range(0, len(todo), batch):
                chunk = todo[start: start + batch]
                made = maker.generate(chunk)
                checks = maker.verify(chunk, [m.questions for m in made])
                for r, m, ch in zip(chunk, made, checks, strict=True):
                    error = m.error or next((c["error"] for c in ch if c.get("error")), None)
                    if error:
                        failed[r["item_id"]] = error
                        continue
                    writer.write({"item_id": r["item_id"], "split": split,
                                  "generated": [question_record(q) for q in m.questions], "malformed": m.malformed,
                                  "checks": ch,
                                  "verified": [question_record(q) for q, c in zip(m.questions, ch, strict=True) if c["kept"]]})
            recs = {rec["item_id"]: rec for rec in writer.records()}
            n_series = len(rows)
            rows = [r for r in rows if r["item_id"] in recs]  # failed ones sit this run out (retried next run)
            kept = [{**r, "questions": recs[r["item_id"]]["verified"]} for r in rows
                    if len(recs[r["item_id"]]["verified"]) >= a.min_verified]
            stats[split] = {"series": n_series, "kept": len(kept),
                            "generated": sum(len(recs[r["item_id"]]["generated"]) for r in rows),
                            "verified": sum(len(recs[r["item_id"]]["verified"]) for r in rows),
                            "malformed": sum(recs[r["item_id"]]["malformed"] for r in rows)}
            data.rows[split] = kept
    stats["failed"] = {"series": len(failed), "last_error": next(reversed(failed.values()), None)}
    write_json(out / "questions_summary.json", stats)
    if failed:
        logger.warning(f"answerability questions: {len(failed)} series not written because a request failed "
                       f"({stats['failed']['last_error']}); the next run retries them")
    logger.info(f"answerability questions: train {stats['train']['kept']}/{stats['train']['series']} series kept "
                f"({stats['train']['verified']}/{stats['train']['generated']} questions verified)")
    if not data.rows["train"]:
        raise DataError("reward.answerability.min_verified", a.min_verified,
                        f"no training series has {a.min_verified} verified questions ({stats['train']}; "
                        f"{len(failed)} series failed: {stats['failed']['last_error']})",
                        "lower reward.answerability.min_verified, raise n_generated, set blind_check: false, or use a "
                        "stronger verifier (see questions.jsonl in the run folder)")
    return stats


def run(cfg: LineupConfig, verifier: Any = None) -> dict[str, Any]:
    """Train, save, evaluate, plot; returns what the result file holds (paths and a few figures).

    ``verifier`` overrides ``cfg.verifier`` with an already-loaded backend (tests share one model).
    """
    return train(LineupRecipe(cfg, verifier)).result


def load_checkpoint_policy(cfg: LineupConfig, ckpt: Path) -> Any:
    """A checkpoint's policy for inference: full weights, or the base model plus the saved LoRA adapters."""
    import dataclasses

    from captionrl.train.common import load_policy
    from captionrl.train.sharding import to_inference_device

    if (ckpt / "adapter_config.json").exists():
        from peft import PeftModel

        base, _, _ = load_policy(cfg.policy)
        model = PeftModel.from_pretrained(base, str(ckpt)).merge_and_unload()
    else:
        model, _, _ = load_policy(dataclasses.replace(cfg.policy, model=str(ckpt)))
    model.eval()
    return to_inference_device(model)  # the training GPU, not rank 0's CPU


def select_checkpoint(cfg: LineupConfig, data: LineupData, processing: Any, reward: ShapedReward, out: Path,
                      use_chart: bool) -> dict[str, Any]:
    """Paper, Table 4: pick the checkpoint whose greedy captions earn the highest training reward on the
    validation items (no test metric is used). Records are resumable, keyed by (checkpoint, item)."""
    from tqdm.auto import tqdm

    from captionrl.records import RecordWriter, write_json

    rows = add_charts(data.rows["val"], cfg.data.instruction, cfg.data.chart_size) if use_chart else data.rows["val"]
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
                cols = {k: [r[k] for r in todo] for k in ("item_id", "series", "series_text", "candidates", "questions")
                        if k in todo[0]}
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
        rows = add_charts(rows, cfg.data.instruction, cfg.data.chart_size)
    max_new = cfg.train.max_completion_length
    clipped: dict[str, dict[str, bool]] = {"trained": {}, "initial": {}}
    systems = [CaptionSet("trained", generate_captions(policy, processing, rows, max_new, use_chart, "trained",
                                                       clipped["trained"]))]
    if cfg.eval.compare_initial:
        from captionrl.train.common import load_policy
        from captionrl.train.sharding import to_inference_device

        base, base_proc, _ = load_policy(cfg.policy)
        base = to_inference_device(base).eval()
        systems.append(CaptionSet("initial", generate_captions(base, base_proc, rows, max_new, use_chart, "initial",
                                                               clipped["initial"])))
        del base
    items = [data.pool[r["item_id"]] for r in rows]
    distractors = {r["item_id"]: list(r["candidate_ids"][1:]) for r in rows}
    train_name = "train-verifier" if cfg.eval.train_verifier else None
    verifiers = {train_name: verifier} if train_name else {}
    from captionrl.backends import make_backend

    for name, value in cfg.eval.verifiers.items():
        v = eval_verifier(value, f"eval.verifiers.{name}")
        verifiers[name] = make_backend(v) if isinstance(v, BackendConfig) else v
    ecfg = IdentifyEvalConfig(modes=list(cfg.eval.modes or [cfg.reward.mode]), directions=list(cfg.eval.directions),
                              ks=[cfg.reward.k], seed=cfg.seed, precision=cfg.data.precision,
                              controls=cfg.eval.controls)
    # the training verifier keeps its own column and stays out of the held-out mean (issue 14)
    summary = run_identification(items, systems, distractors, data.pool, verifiers, ecfg, out_dir,
                                 train_verifier=train_name)
    result = {"table": str(out_dir / "table.md"), "summary": str(out_dir / "summary.json"),
              "rows": summary.rows, "captions": {s.name: s.captions for s in systems}}
    if cfg.eval.final_checks:
        from captionrl.eval.final_checks import run_final_checks

        checks = run_final_checks({s.name: s.captions for s in systems}, {it.id: it.values for it in items}, out_dir,
                                  identification=summary.summary(), guard=cfg.reward.counting(),
                                  tolerance=cfg.reward.factuality_tolerance, clipped=clipped,
                                  bottleneck=cfg.eval.bottleneck)
        result["final_checks"] = str(out_dir / "final_checks.md")
        result["final_rows"] = checks["rows"]
    return result


# ---------------------------------------------------------------------- command
CONFIG = LineupConfig


def run_command(cfg: LineupConfig) -> int:
    """``captionrl train lineup``: check (data only) or train, then print where everything went."""
    if cfg.check:
        probe_servers([(cfg.verifier, "verifier")])
        data = build_lineup_data(cfg.data, cfg.reward.k, cfg.seed)
        print(json.dumps({k: len(v) for k, v in data.rows.items()}))
        return 0
    if cfg.seeds:
        from captionrl.train.seeds import run_seeds

        summary = run_seeds(cfg, run)
        print(f"over seeds {summary['seeds']}: {summary['table']}")
        print(Path(summary["table"]).read_text())
        return 0
    result = run(cfg)
    if "curves" in result:
        print(run_summary(result, ["model", "curves", "metrics"]))
        ev = result.get("eval")
        if ev:
            print(f"evaluation: {ev['table']}")
            print(Path(ev["table"]).read_text())
    return 0
