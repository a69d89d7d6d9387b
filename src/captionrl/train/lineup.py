"""``captionrl train lineup``: LineupRL, RL of a captioner with the caption-to-series identification reward.

Figure 2(b) of the paper: for each series the policy samples a group of G captions; a frozen verifier
reads each caption and the K candidate series (the true one and K-1 mined distractors) and must pick the
described one; the group's rewards drive an RLOO (or GRPO) update. The steps are the shared skeleton's
(``train.skeleton``), the dataset is ``domains.lineup_data`` and the trainer is TRL's (``train.common``);
this module is the recipe: its config, the shaped reward and the end-of-run selection and evaluation.

Reward shaping is a *wrapper* around the identification reward, not extra TRL reward functions: TRL sums
several reward functions with ``nansum`` and treats a row as unscored only when *all* of them return
``None``, so a separate length penalty would turn a verifier failure into a penalty-only score (a silent 0
the policy learns from). The wrapper subtracts its penalties only from scored captions and leaves a
failed verification ``None``. It logs caption length and the fraction of the series transcribed.

Run folder (``train.out_dir``): ``config.yaml``, ``checkpoints/``, ``metrics.jsonl``, ``samples.rank*.jsonl``,
``tensorboard/``, ``curves.png``, ``model/`` and ``eval/`` (records.jsonl, table.md, summary.json).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from captionrl.backends import BackendConfig
from captionrl.config import help_field
from captionrl.domains.lineup_data import LineupData, LineupDataConfig, add_charts, build_lineup_data
from captionrl.errors import ConfigError
from captionrl.judges.identify import IdentifyConfig, IdentifyScoring
from captionrl.train import common
from captionrl.train.common import (
    PolicyConfig,
    TrainConfig,
    print_result,
    probe_servers,
)
from captionrl.train.common import backend_config as _backend_config  # the name evaluate() uses
from captionrl.train.skeleton import Recipe, Run, train

NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")


# ---------------------------------------------------------------------- config
@dataclass
class LineupRewardConfig(IdentifyScoring):
    """The identification reward (``IdentifyScoring``'s mode, k, signal and lam) and its shaping."""

    FIELD_PREFIX: ClassVar[str] = "reward"

    max_caption_chars: int | None = help_field(None, "captions longer than this are penalised (null = no length shaping)")
    length_penalty: float = help_field(0.0, "penalty per 100 characters above max_caption_chars")
    max_transcription: float = help_field(0.25, "free fraction of the series' values a caption may copy verbatim (key values are welcome)")
    transcription_penalty: float = help_field(1.0, "penalty per unit of transcribed fraction above max_transcription (copying the numbers wins a likelihood verifier without describing anything)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.length_penalty < 0 or self.transcription_penalty < 0:
            raise ConfigError("reward.*_penalty", (self.length_penalty, self.transcription_penalty),
                              "penalties must be >= 0", "set them to 0 to switch shaping off")
        if not 0 <= self.max_transcription <= 1:
            raise ConfigError("reward.max_transcription", self.max_transcription, "must be in [0, 1]", "set e.g. 0.25")


@dataclass
class LineupEvalConfig:
    """The held-out evaluation run at the end of training."""

    enabled: bool = help_field(True, "evaluate the trained captioner on the held-out test items")
    directions: list[str] = help_field(["c2s"], "identification directions: c2s and/or s2c")
    modes: list[str] | None = help_field(None, "verifier modes (null = the training reward's mode)")
    compare_initial: bool = help_field(True, "also caption the test items with the untrained policy, as a baseline row")
    verifiers: dict[str, Any] = help_field({}, "name -> backend config of evaluation verifiers (empty = the training verifier)")


@dataclass
class LineupConfig:
    """A LineupRL run: fully described by its YAML plus overrides, saved as out_dir/config.yaml."""

    seed: int = help_field(0, "one seed for everything: item sampling, distractors, shuffling, sampling of captions")
    check: bool = help_field(False, "validate the config and the data, then stop (loads no model)")
    policy: PolicyConfig = field(default_factory=PolicyConfig, metadata={"help": "the captioner being trained"})
    verifier: BackendConfig = field(default_factory=BackendConfig, metadata={"help": "the frozen verifier behind the reward"})
    data: LineupDataConfig = field(default_factory=LineupDataConfig, metadata={"help": "series, windows, candidate sets"})
    reward: LineupRewardConfig = field(default_factory=LineupRewardConfig, metadata={"help": "identification reward and shaping"})
    train: TrainConfig = field(default_factory=TrainConfig, metadata={"help": "TRL trainer settings"})
    eval: LineupEvalConfig = field(default_factory=LineupEvalConfig, metadata={"help": "held-out evaluation at the end"})

    def __post_init__(self) -> None:
        if self.train.seed is None:
            self.train.seed = self.seed
        for d in self.eval.directions:
            if d not in ("c2s", "s2c"):
                raise ConfigError("eval.directions", d, "unknown direction", "use c2s and/or s2c")

    def identify_config(self) -> IdentifyConfig:
        """The training reward's judge settings: the reward's scoring, c2s, series printed as the data says."""
        scoring = {f.name: getattr(self.reward, f.name) for f in dataclasses.fields(IdentifyScoring)}
        return IdentifyConfig(**scoring, direction="c2s", precision=self.data.precision, normalise=self.data.normalise)


# ---------------------------------------------------------------------- reward shaping
def transcription_fraction(caption: str, series_text: str, n_values: int) -> float:
    """Numbers of the caption that appear verbatim in the rendered series, over the series length (<= 1)."""
    shown = {t.strip() for t in series_text.split(",")}
    hits = sum(1 for m in NUMBER_RE.findall(caption) if m in shown)
    return min(1.0, hits / max(n_values, 1))


class ShapedReward:
    """Identification reward minus length and transcription penalties; ``None`` stays ``None``.

    Logs ``shaping/*`` metrics through TRL's ``log_metric`` and writes one sample record per caption.
    """

    def __init__(self, base: Any, reward: LineupRewardConfig, samples: Any = None) -> None:
        self.base = base
        self.cfg = reward
        self.samples = samples
        self.__name__ = "lineup"
        self._last_judgments: list[Any] = []
        previous = getattr(base, "on_judgments", None)

        def keep(captions: Any, columns: Any, judgments: list[Any]) -> None:
            self._last_judgments = judgments
            if previous is not None:
                previous(captions, columns, judgments)

        if hasattr(base, "on_judgments"):
            base.on_judgments = keep

    def penalties(self, caption: str, series_text: str, n_values: int) -> tuple[float, float, float]:
        """(length penalty, transcription penalty, transcribed fraction) of one caption."""
        c = self.cfg
        length_pen = 0.0
        if c.max_caption_chars is not None and len(caption) > c.max_caption_chars:
            length_pen = c.length_penalty * (len(caption) - c.max_caption_chars) / 100.0
        frac = transcription_fraction(caption, series_text, n_values)
        trans_pen = c.transcription_penalty * max(0.0, frac - c.max_transcription)
        return length_pen, trans_pen, frac

    def __call__(self, prompts: Any = None, completions: Sequence[Any] = (), completion_ids: Any = None,
                 **kwargs: Any) -> list[float | None]:
        from captionrl.rewards import completion_text

        self._last_judgments = []
        base_scores = self.base(prompts, completions, completion_ids, **kwargs)
        captions = [completion_text(c) for c in completions]
        texts = kwargs.get("series_text") or [""] * len(captions)
        series = kwargs.get("series") or [[]] * len(captions)
        out: list[float | None] = []
        rows = []
        stats = {"length_penalty": [], "transcription_penalty": [], "transcription_frac": [], "caption_chars": []}
        for i, cap in enumerate(captions):
            lp, tp, frac = self.penalties(cap, texts[i], len(series[i]))
            base = base_scores[i]
            final = None if base is None or (isinstance(base, float) and math.isnan(base)) else float(base) - lp - tp
            out.append(final)
            stats["length_penalty"].append(lp)
            stats["transcription_penalty"].append(tp)
            stats["transcription_frac"].append(frac)
            stats["caption_chars"].append(float(len(cap)))
            j = self._last_judgments[i] if i < len(self._last_judgments) else None
            rows.append({
                "item_id": (kwargs.get("item_id") or [None] * len(captions))[i], "caption": cap,
                "identification": base, "length_penalty": lp, "transcription_penalty": tp,
                "transcription_frac": frac, "reward": final,
                "hard": j.extra.get("hard") if j is not None else None,
                "soft": j.extra.get("soft") if j is not None else None,
                "error": j.error if j is not None else None,
            })
        log_metric = kwargs.get("log_metric")
        if callable(log_metric):
            for name, vals in stats.items():
                log_metric(f"shaping/{name}", float(np.mean(vals)) if vals else 0.0)
            log_metric("verifier_failures", float(sum(v is None for v in out)))
        if self.samples is not None:
            state = kwargs.get("trainer_state")
            self.samples.write(int(getattr(state, "global_step", -1)) if state is not None else -1, rows)
        return out


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

    def servers(self) -> list[tuple[Any, str]]:
        cfg = self.cfg
        return [(cfg.verifier, "verifier"),
                *[(_backend_config(v, f"eval.verifiers.{n}"), f"eval.verifiers.{n}") for n, v in cfg.eval.verifiers.items()]]

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

    def train_dataset(self, run: Run) -> Any:
        from datasets import Dataset

        rows = run.data.rows["train"]
        return Dataset.from_list(add_charts(rows) if self.use_chart else rows)

    def reward_functions(self, run: Run) -> list[Any]:
        from captionrl.rewards import make_identification_reward
        from captionrl.train.logging import SampleLog

        self.samples = SampleLog(run.out)
        self.reward = ShapedReward(make_identification_reward(self.verifier, self.cfg.identify_config()),
                                   self.cfg.reward, self.samples)
        return [self.reward]

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


def run(cfg: LineupConfig, verifier: Any = None) -> dict[str, Any]:
    """Train, save, evaluate, plot; returns what the result file holds (paths and a few figures).

    ``verifier`` overrides ``cfg.verifier`` with an already-loaded backend (tests share one model).
    """
    return train(LineupRecipe(cfg, verifier)).result


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


def generate_captions(model: Any, processing: Any, rows: Sequence[Mapping[str, Any]], max_new_tokens: int,
                      use_chart: bool, name: str) -> dict[str, str]:
    """Greedy captions of ``rows`` by an in-memory policy (the same prompts it was trained on)."""
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
    return {str(r["item_id"]): (g.text or "") for r, g in zip(rows, gens, strict=True)}


def evaluate(cfg: LineupConfig, data: LineupData, policy: Any, processing: Any, verifier: Any,
             out_dir: Path, use_chart: bool) -> dict[str, Any]:
    """Held-out identification of the trained captioner (and the untrained one) via ``eval.identification``."""
    from captionrl.eval.identification import CaptionSet, IdentifyEvalConfig, run_identification

    rows = data.rows["test"]
    if use_chart:
        rows = add_charts(rows)
    max_new = cfg.train.max_completion_length
    systems = [CaptionSet("trained", generate_captions(policy, processing, rows, max_new, use_chart, "trained"))]
    if cfg.eval.compare_initial:
        from captionrl.train.common import load_policy

        base, base_proc, _ = load_policy(cfg.policy)
        base.eval()
        systems.append(CaptionSet("initial", generate_captions(base, base_proc, rows, max_new, use_chart, "initial")))
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
    return {"table": str(out_dir / "table.md"), "summary": str(out_dir / "summary.json"),
            "rows": summary.get("rows", [])}


# ---------------------------------------------------------------------- command
CONFIG = LineupConfig


def run_command(cfg: LineupConfig) -> int:
    """``captionrl train lineup``: check (data only) or train, then print where everything went."""
    if cfg.check:
        probe_servers([(cfg.verifier, "verifier")])
        data = build_lineup_data(cfg.data, cfg.reward.k, cfg.seed)
        print(json.dumps({k: len(v) for k, v in data.rows.items()}))
        return 0
    result = run(cfg)
    if "curves" in result:
        print_result(result, ["model", "curves", "metrics"])
        ev = result.get("eval")
        if ev:
            print(f"evaluation: {ev['table']}")
            print(Path(ev["table"]).read_text())
    return 0
