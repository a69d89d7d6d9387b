"""``captionrl train lineup``: LineupRL, RL of a captioner with the caption-to-series identification reward.

Figure 2(b) of the paper: for each series the policy samples a group of G captions; a frozen verifier
reads each caption and the K candidate series (the true one and K-1 mined distractors) and must pick the
described one; the group's rewards drive an RLOO (or GRPO) update. The steps are the shared skeleton's
(``train.run.skeleton``), the dataset is ``domains.lineup_data`` and the trainer is TRL's (``train.run.builder``);
this module is the recipe: the reward, the preflight and the command. Its config is ``train.lineup_config``;
checkpoint selection and the held-out evaluation are ``train.lineup_eval``.

The reward is the one ``Reward`` object (``rewards.reward.build_reward`` from the ``reward`` section: the
family's judge, the shaping, the numbers-masked pass), wrapped by the TRL face (``rewards.RewardFunction``,
which logs and writes the sample records); the preflight and checkpoint selection score through the same
object. A failed verification stays ``None``, never a penalty-only score.

Run folder (``train.out_dir``): ``config.yaml``, ``preflight.md``/``preflight.json`` (the reward preflight),
``checkpoints/``, ``metrics.jsonl``, ``samples.rank*.jsonl``, ``tensorboard/``, ``curves.png``, ``model/`` and
``eval/`` (records.jsonl, table.md, summary.json, final_checks.md/.json: checks the model was not trained on).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from captionrl.backends.startup import probe_servers
from captionrl.domains.lineup_data import LineupData, add_charts, build_lineup_data
from captionrl.errors import ConfigError
from captionrl.eval.final_checks import WARM_START
from captionrl.rewards import RewardFunction
from captionrl.rewards.reward import Reward, build_reward
from captionrl.rewards.spec import RewardSpec
from captionrl.train.lineup_config import LineupConfig, LineupEvalConfig, eval_backends
from captionrl.train.lineup_eval import evaluate, load_checkpoint_policy, select_checkpoint
from captionrl.train.run import builder
from captionrl.train.run.progress import ProgressCallback, RunProgress, Stage
from captionrl.train.run.skeleton import Recipe, Run, run_summary, train

logger = logging.getLogger(__name__)

__all__ = ["CONFIG", "LineupConfig", "LineupEvalConfig", "LineupRecipe", "preflight", "run", "run_command"]

# ---------------------------------------------------------------------- reward preflight
SHAPING_KEYS = ("reward.transcription_penalty", "reward.run_penalty", "reward.max_copied_values",
                "reward.max_numbers", "reward.number_penalty", "reward.factuality_penalty", "reward.factuality_bonus",
                "reward.masked_weight", "reward.false_claim_base")
"""The shaping keys that change what the reward preflight finds (printed, with the family's, on a refusal)."""

FAMILY_KEYS = {"identification": ("reward.mode", "reward.signal"),
               "answerability": ("reward.answerability.generator", "reward.answerability.blind_check",
                                 "reward.answerability.n_questions"),
               "judge": ("reward.judge.mode", "reward.judge.show_series")}
"""The family's own keys that change what the preflight finds (with the shaping keys and the verifier)."""

PREFLIGHT_KEYS = (*SHAPING_KEYS, *FAMILY_KEYS["identification"], "verifier")
"""Every key the identification reward's preflight names (the default family's)."""


def preflight_keys(reward: RewardSpec) -> tuple[str, ...]:
    return ("reward.family", *FAMILY_KEYS[reward.family], *SHAPING_KEYS, "verifier")


def preflight(cfg: LineupConfig, rows: Sequence[Mapping[str, Any]], reward: Any, out: Path) -> Any:
    """The reward preflight on a seeded sample of training rows: the describer's caption must beat every
    hacking probe under ``reward`` (the trainer's own reward function's quiet twin); raises
    ``PreflightError`` otherwise."""
    import os

    from captionrl.preflight import (
        passed_before,
        run_preflight,
        sample_rows,
        series_extra_probes,
        series_references,
    )

    if cfg.train.preflight_items <= 0:
        return None
    chosen = sample_rows(rows, cfg.train.preflight_items, cfg.seed)
    fingerprint = preflight_fingerprint(cfg, chosen)
    main = int(os.environ.get("RANK", "0")) == 0
    if passed_before(out, fingerprint):
        if main:
            logger.info(f"reward preflight: passed before in this run folder with the same reward, verifier and "
                        f"items ({out / 'preflight.json'}); not scored again")
        return None
    honest, dumps = series_references(chosen, cfg.data.precision)
    if main:
        logger.info(f"reward preflight under the {cfg.reward.family} reward")
    return run_preflight(reward, chosen, honest, dumps, keys=preflight_keys(cfg.reward), force=cfg.train.force_preflight,
                         out_dir=out if main else None, echo=main, margin=cfg.train.preflight_margin,
                         extra=series_extra_probes(chosen, cfg.instruction(), cfg.data.precision),
                         fingerprint=fingerprint)


def preflight_fingerprint(cfg: LineupConfig, rows: Sequence[Mapping[str, Any]]) -> str:
    """A digest of everything the preflight's outcome depends on: the package version, the reward and
    verifier settings, the instruction, the printing precision, the margin and the sampled rows' prompts and
    candidates (from which every probe caption is written)."""
    from dataclasses import asdict

    from captionrl import __version__
    from captionrl.records import digest

    return digest({"version": __version__, "reward": asdict(cfg.reward), "verifier": asdict(cfg.verifier),
                   "instruction": cfg.instruction(), "precision": cfg.data.precision,
                   "margin": cfg.train.preflight_margin,
                   "rows": [{k: r.get(k) for k in ("item_id", "prompt", "series_text", "candidates")} for r in rows]})


# ---------------------------------------------------------------------- run
class LineupRecipe(Recipe):
    """LineupRL in the shared skeleton: lineups as data, the shaped identification reward, and at the end
    checkpoint selection on the validation items and the held-out identification evaluation."""

    title = "LineupRL"

    def __init__(self, cfg: LineupConfig, verifier: Any = None) -> None:
        super().__init__(cfg)
        self.verifier = verifier
        self.use_chart = False
        self.reward: Reward | None = None
        self.reward_function: RewardFunction | None = None
        self.samples: Any = None
        self.questions: dict[str, Any] | None = None
        self.warm: dict[str, Any] | None = None  # the warm start's summary, when the run had one
        self.progress: RunProgress | None = None

    def servers(self) -> list[tuple[Any, str]]:
        cfg = self.cfg  # the evaluation verifiers are only needed (and probed) when the run evaluates
        return [(cfg.verifier, "verifier"), *(eval_backends(cfg) if cfg.eval.enabled else [])]

    def frozen_verifier(self) -> Any:
        """The verifier backend (built once; a test may pass one in)."""
        if self.verifier is None:
            from captionrl.backends import make_backend

            self.verifier = make_backend(self.cfg.verifier)
        return self.verifier

    def dataset(self, run: Run) -> LineupData:
        """The lineups; the answerability family's series also get their verified questions here, from the
        frozen verifier (``judges.series_qa.attach_questions``), before the policy loads."""
        cfg = self.cfg
        data = build_lineup_data(cfg.data, cfg.reward.k, cfg.seed)
        if cfg.reward.family == "answerability":
            from captionrl.judges.series_qa import attach_questions

            run.out.mkdir(parents=True, exist_ok=True)
            data.rows, self.questions = attach_questions(data.rows, cfg.reward.answerability, self.frozen_verifier(),
                                                         run.out, seed=cfg.seed, precision=cfg.data.precision)
        return data

    def load_policy(self, run: Run) -> None:
        cfg = self.cfg
        self.frozen_verifier()
        super().load_policy(run)
        self.use_chart = cfg.policy.input == "chart" or (cfg.policy.input == "auto" and run.is_vlm)
        if self.use_chart and not run.is_vlm:
            raise ConfigError("policy.input", "chart", f"{cfg.policy.model} is a language-only model",
                              "set policy.input: numbers, or use a VLM policy")
        if cfg.warm_start.enabled and self.use_chart:
            raise ConfigError("warm_start.epochs", cfg.warm_start.epochs, f"{cfg.policy.model} reads charts and the "
                              "warm start teaches a captioner that reads numbers", "set warm_start.epochs: 0")
        self.progress = run_progress(cfg, run.data)
        if cfg.warm_start.enabled:
            from captionrl.train.warm_start import anchor_reference, warm_start

            if run.resume_from is None:  # a resumed run's checkpoint holds the warm-started weights
                self.warm = warm_start(cfg, run.data.rows["train"], run.model, run.processing, run.out,
                                       callbacks=[ProgressCallback(self.progress, WARM_START)])
            anchor_reference(run.model, run.out)  # train.beta's KL reference: the warm start, not the base model
        self.progress.finish(WARM_START)

    def rows(self, run: Run, split: str = "train") -> list[dict[str, Any]]:
        """The rows RL (and its preflight) reads: the training lineups under ``data.rl_rescale_share``, with
        a chart for a chart-reading policy."""
        rows = run.data.rows[split]
        if split == "train" and self.cfg.data.rl_rescale_share > 0:
            from captionrl.domains.rescale import rescaled_lineup_rows

            rows = rescaled_lineup_rows(rows, self.cfg.data.rl_rescale_share, self.cfg.seed, self.cfg.data.precision)
        return add_charts(rows, self.cfg.data.instruction, self.cfg.data.chart_size) if self.use_chart else list(rows)

    def train_dataset(self, run: Run) -> Any:
        from datasets import Dataset

        return Dataset.from_list(self.rows(run))

    def callbacks(self, run: Run) -> list[Any]:
        progress = [ProgressCallback(self.progress, "RL")] if self.progress is not None else []
        return [*super().callbacks(run), *progress]

    def reward_functions(self, run: Run) -> list[Any]:
        from captionrl.train.run.logging import SampleLog

        cfg = self.cfg
        self.samples = SampleLog(run.out)
        self.reward = build_reward(cfg.reward, self.frozen_verifier(), series=cfg.series_print(), seed=cfg.seed,
                                   name="lineup", series_rows=True, instruction=cfg.instruction())
        self.reward_function = RewardFunction(self.reward, samples=self.samples)
        return [self.reward_function]

    def summary(self, run: Run) -> dict[str, Any]:
        out: dict[str, Any] = {"reward_family": self.cfg.reward.family}
        if self.questions is not None:
            out["questions"] = self.questions
        if self.warm is not None:
            out["warm_start"] = self.warm
        return out

    def preflight(self, run: Run) -> None:
        """The describer's caption must beat every hacking probe under the trainer's own reward."""
        assert self.reward_function is not None
        if self.progress is not None:
            self.progress.start("preflight")
        report = preflight(self.cfg, self.rows(run), self.reward_function.quiet(), run.out)
        if self.progress is not None:  # passed before (None): nothing was scored, so its items leave untimed
            self.progress.finish("preflight") if report is None else self.progress.complete("preflight")

    def close(self, run: Run) -> None:
        if self.samples is not None:
            self.samples.close()

    def final_evaluation(self, run: Run) -> dict[str, Any]:
        """Checkpoint selection by the training reward on the validation items (when there are any), then
        the held-out identification evaluation of the selected (or last) policy."""
        cfg, data, out = self.cfg, run.data, run.out
        result: dict[str, Any] = {}
        if data.rows.get("val"):
            assert self.reward is not None
            best = select_checkpoint(cfg, data, run.processing, self.reward, out, self.use_chart)
            result["selection"] = best
            if best.get("checkpoint"):
                result["model"] = best["checkpoint"]
        if cfg.eval.enabled and data.rows.get("test"):
            best = result.get("selection", {}).get("checkpoint")
            policy = load_checkpoint_policy(cfg, Path(best)) if best else builder.unwrap_for_inference(run.trainer)
            if self.progress is not None:
                self.progress.start("final checks")
            result["eval"] = evaluate(cfg, data, policy, run.processing, self.verifier, out / "eval", self.use_chart,
                                      progress=self.progress)
            if self.progress is not None:
                self.progress.finish("final checks")
        return result


REFERENCE_SECONDS = {WARM_START: 5.6, "preflight": 15.8, "RL": 30.6, "final checks": 0.9}
"""Seconds per unit of each stage of the main job from a fresh clone on a 2-core AVX2-only AMD EPYC (both
threads, the verifier in float32; docs/results/main-job-time-fresh-clone-avx2-epyc.md): a warm-start step, a
preflight item, an RL step, a held-out window captioned by one system. The progress line scales them by this
machine's measured speed; on another CPU their ratios to each other hold only approximately."""


def run_progress(cfg: LineupConfig, data: LineupData) -> RunProgress:
    """The whole run's progress line: warm start steps, preflight items, RL steps, final-check captions."""
    n_train = len(data.rows["train"])
    ws = cfg.warm_start
    records = n_train * (2 if ws.reverse else 1)  # the warm start's targets (train.warm_start.warm_start_records)
    warm_steps = math.ceil(-(-records // ws.batch_size) * ws.epochs) if ws.enabled else 0
    n_test = len(data.rows.get("test", [])) if cfg.eval.enabled else 0
    systems = 1 + int(cfg.eval.compare_initial) + int(ws.enabled)
    ref = REFERENCE_SECONDS
    return RunProgress([Stage(WARM_START, warm_steps, ref[WARM_START]),
                        Stage("preflight", min(cfg.train.preflight_items, n_train), ref["preflight"]),
                        Stage("RL", int(cfg.train.max_steps) if cfg.train.max_steps > 0 else 0, ref["RL"]),
                        Stage("final checks", systems + 1, ref["final checks"] * n_test)])


def run(cfg: LineupConfig, verifier: Any = None) -> dict[str, Any]:
    """Train, save, evaluate, plot; returns what the result file holds (paths and a few figures).

    ``verifier`` overrides ``cfg.verifier`` with an already-loaded backend (tests share one model).
    """
    return train(LineupRecipe(cfg, verifier)).result


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
        from captionrl.train.run.seeds import run_seeds

        summary = run_seeds(cfg, run)
        print(f"over seeds {summary['seeds']}: {summary['table']}")
        print(Path(summary["table"]).read_text())
        print(summary["verdicts_line"])
        return 0
    result = run(cfg)
    if "curves" in result:
        print(run_summary(result, ["model", "curves", "metrics"]))
        ev = result.get("eval")
        if ev:
            print(f"evaluation: {ev['table']}")
            print(Path(ev["table"]).read_text())
            if ev.get("final_checks"):
                print(f"final checks: {ev['final_checks']}")
            if ev.get("verdict"):
                print(ev["verdict"]["line"])
    return 0
