"""A supervised warm start before LineupRL: the captioner is first taught, on its own training windows, to
write the code describer's short answer (``domains.describe.short_description``), then RL begins.

Why: the embedded 135M captioner's direction word moves with the window but never enough to change which
word it writes, and 16 RL steps of 16 captions hold about 2 right directions each: RL can only sharpen what
the policy already does, and it does not say the direction. Labels teach it
(docs/results/direction-signal.md). The warm start gives RL a captioner that already names the direction and the
start and end values, so the reward has right and wrong directions to tell apart in every group, and other facts to add.

The targets are written by code from the values the captioner reads (the row's printed series), so they
are right by construction and need no teacher model; the run is TRL's ``SFTTrainer`` (``train.sft``) on
the RL prompts themselves, in ``out_dir/warm_start``: an interrupted warm start resumes from its own
checkpoint; a finished one records what it was trained from (``warm_start_done.json``) and drops its
checkpoint, and a rerun with the same settings and targets loads its saved weights instead of training.
The paper's recipe starts RL from the instruction-tuned model: ``epochs: 0`` (the default) is that.

Two options: ``freeze_layers`` keeps the embeddings and the bottom blocks fixed while the labels are taught
(a CPU step costs about 20 s instead of 35), and ``reverse`` adds each window reversed, whose direction is the
opposite, so no single word fits every record (docs/results/warm-start-freeze-and-reverse.md).
``extremum_share`` lets a share of the targets name the interior extreme, so that RL samples captions that
say something a pinned lineup pays for (with none of them, RL's samples never name one).
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from captionrl.config import help_field
from captionrl.domains.describe import SHORT_DESCRIPTION_ORDERS
from captionrl.domains.rescale import draw, printed_values, prompt_with_series, rescaled, rescaled_values
from captionrl.errors import ConfigError
from captionrl.records import digest
from captionrl.train.run.bottom_cache import cached_frozen_bottom
from captionrl.train.run.freezing import check_freeze_layers, frozen_bottom

logger = logging.getLogger(__name__)

EXTREMUM_DRAWS = ("window", "pass")
"""``warm_start.extremum_draw``: the extremum sentence drawn once per window, or afresh for each pass."""

RESCALE_DRAWS = ("window", "pass")
"""``warm_start.rescale_draw``: a rescaled window's map drawn once per window, or afresh for each pass."""


@dataclass
class WarmStartConfig:
    """Supervised fine-tuning on the describer's captions of the training windows, before RL."""

    epochs: float = help_field(0.0, "passes over the training windows before RL (0 = off: RL from the initial model, as the paper)")
    learning_rate: float = help_field(2e-4, "AdamW learning rate (at 5e-5 two epochs do not teach the 135M captioner the direction)")
    lr_scheduler_type: str = help_field("constant", "learning-rate schedule: constant (the schedule under which labels teach the direction) or any transformers schedule")
    batch_size: int = help_field(8, "windows per optimizer step")
    reverse: bool = help_field(False, "also train on every window reversed (same values, opposite order, so the opposite direction): one direction word for every window cannot fit both")
    order: str = help_field("direction_first", "the target's order: direction_first (\"Overall, the series rises. It starts at X and ends at Y.\") or values_first (\"It starts at X and ends at Y, so overall the series rises.\": the direction after the two values it mostly follows from)")
    freeze_layers: int = help_field(0, "bottom transformer blocks kept frozen, with the embeddings, during the warm start (RL then trains every weight): 20 of the embedded model's 30 make a CPU step ~20 s instead of ~35")
    extremum_share: float = help_field(0.0, "share of the targets, drawn per window from the run's seed, that add a third sentence naming the interior extreme beyond the start and end (\"Its highest value is 317.9.\"): RL then samples captions that name what a pinned lineup pays for (0 = never, 1 = wherever there is one)")
    extremum_draw: str = help_field("window", "how the extremum sentence is drawn: window (once per window: every pass teaches a window the same target, so a long warm start learns which windows get one and RL's samples of a window agree) or pass (afresh for each pass over the windows: the sentence is taught as a coin flip of share extremum_share, so RL's samples of one window differ in it and the lineup can pay for naming the extreme)")
    rescale_share: float = help_field(0.0, "share of the records, drawn per window from the run's seed, whose window is shown rescaled to a random level and spread, and mirrored upside down for half of them (its direction then the opposite), so that only the values' order says the direction, not which series the level betrays (0 = every window as it is; at 1 the CPU config's 4 epochs teach no direction: docs/results/warm-start-rescaled-windows.md)")
    rescale_draw: str = help_field("window", "how a rescaled window's level, spread and mirror are drawn: window (once per window, the map RL's rescaled lineups show it under, so a long warm start can learn each window's caption by heart) or pass (afresh for each pass over the windows, none of them the map RL shows: the captioner is taught to read every presentation, not to recall one)")
    from_run: str = help_field("", "a finished warm start to start RL from instead of training one: a run folder (or its warm_start folder) made with the same policy, seed, data and warm_start settings, checked against its warm_start_done.json; its model is copied into this run (e.g. the identification-off control of a run: reward.lam=0 warm_start.from_run=runs/lineup-cpu)")
    from_run_any_seed: bool = help_field(False, "with from_run: accept a warm start made at another seed, so one warm start serves several seeds' RL (a shared warm start; its policy, warm_start settings and precision must still match, and the run records which it used). RL's lineups and held-out windows follow this run's seed; the warm start's training windows and rescalings followed its own")
    reuse_frozen: bool = help_field(True, "with freeze_layers, compute the frozen bottom's output once per window and reuse it in later epochs (the same training up to float rounding; the frozen forward is about a third of a CPU step, and `bench/bench_warm_start_cache.py --ref HEAD --overrides warm_start.reuse_frozen=false` times the cache alone)")

    def __post_init__(self) -> None:
        if self.order not in SHORT_DESCRIPTION_ORDERS:
            raise ConfigError("warm_start.order", self.order, "unknown target order",
                              "use direction_first (\"Overall, the series rises. It starts at ...\") or values_first")
        if self.epochs < 0:
            raise ConfigError("warm_start.epochs", self.epochs, "must be >= 0", "set warm_start.epochs: 0 (off) or 3")
        if self.learning_rate <= 0:
            raise ConfigError("warm_start.learning_rate", self.learning_rate, "must be > 0", "use 2e-4")
        if self.batch_size < 1:
            raise ConfigError("warm_start.batch_size", self.batch_size, "must be >= 1", "use 8")
        if not 0.0 <= self.extremum_share <= 1.0:
            raise ConfigError("warm_start.extremum_share", self.extremum_share, "must be within [0, 1]",
                              "use 0 (no target names an extreme) or 0.5 (half of them)")
        if self.extremum_draw not in EXTREMUM_DRAWS:
            raise ConfigError("warm_start.extremum_draw", self.extremum_draw, "unknown way to draw the extremum sentence",
                              f"use one of {', '.join(EXTREMUM_DRAWS)}")
        if self.rescale_draw not in RESCALE_DRAWS:
            raise ConfigError("warm_start.rescale_draw", self.rescale_draw, "unknown way to draw the rescaling",
                              f"use one of {', '.join(RESCALE_DRAWS)}")
        if not 0.0 <= self.rescale_share <= 1.0:
            raise ConfigError("warm_start.rescale_share", self.rescale_share, "must be within [0, 1]",
                              "use 0 (every window as it is) or 0.5 (half of them rescaled)")
        check_freeze_layers(self.freeze_layers, "warm_start.freeze_layers")
        if self.from_run and self.epochs <= 0:
            raise ConfigError("warm_start.from_run", self.from_run, "is set but the warm start is off (epochs 0)",
                              "set warm_start.epochs as in that run, or leave from_run empty")
        if self.from_run_any_seed and not self.from_run:
            raise ConfigError("warm_start.from_run_any_seed", self.from_run_any_seed, "is set without from_run",
                              "set warm_start.from_run to the run whose warm start the seeds share")
        if self.from_run and not Path(self.from_run).is_dir():
            raise ConfigError("warm_start.from_run", self.from_run, "is not a folder",
                              "give the folder of a run whose warm start finished (its train.out_dir)")

    @property
    def enabled(self) -> bool:
        return self.epochs > 0


def reversed_prompt(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The row's prompt with its printed series in the opposite order (every other word the same)."""
    text = str(row["series_text"])
    return prompt_with_series(row, ", ".join(reversed(text.split(", "))))


def names_extremum(item_id: str, share: float, seed: int, pass_index: int | None = None) -> bool:
    """Whether the target of ``item_id`` names its interior extreme: a draw from (seed, id) alone, or from
    (seed, id, pass) when each pass draws afresh, so a resumed or repeated warm start writes the same targets
    whatever the order of its rows."""
    if share <= 0.0:
        return False
    if pass_index is not None:
        return draw(item_id, seed, f"extremum:{pass_index}") < share
    return zlib.crc32(f"{seed}:{item_id}".encode()) / 2**32 < share


def extremum_per_pass(extremum_draw: str, extremum_share: float) -> bool:
    """Whether each pass draws its extremum sentences afresh: ``pass`` with a share strictly between 0 and 1
    (at 0 or 1 every draw gives the same)."""
    return extremum_draw == "pass" and 0.0 < extremum_share < 1.0


def rescale_per_pass(rescale_draw: str, rescale_share: float) -> bool:
    """Whether each pass draws its rescaled windows' maps afresh: ``pass`` with some window rescaled."""
    return rescale_draw == "pass" and rescale_share > 0.0


def passes_drawn(epochs: float, extremum_draw: str, extremum_share: float,
                 rescale_draw: str = "window", rescale_share: float = 0.0) -> int:
    """How many passes of targets the warm start writes: one, unless each pass draws its extremum sentences
    (``extremum_per_pass``) or its rescalings (``rescale_per_pass``) afresh, then one per started epoch."""
    if not (extremum_per_pass(extremum_draw, extremum_share) or rescale_per_pass(rescale_draw, rescale_share)):
        return 1
    return max(1, int(np.ceil(epochs)))


def warm_start_records(rows: Sequence[Mapping[str, Any]], precision: int, *,
                       reverse: bool = False, order: str = "direction_first",
                       extremum_share: float = 0.0, rescale_share: float = 0.0,
                       seed: int = 0, passes: int = 1, extremum_draw: str = "window",
                       rescale_draw: str = "window") -> list[dict[str, Any]]:
    """One SFT record per training row: the row's own prompt and the describer's sentence of its values;
    with ``reverse`` a second one per row, its series reversed and described (id ``<id>~reversed``); a
    share ``extremum_share`` of the records (``names_extremum``) also names the interior extreme; a share
    ``rescale_share`` shows its window rescaled (``rescaled_values``) and describes that.

    ``passes`` > 1 writes that many copies of the records, one per pass over the windows (ids ``<id>#<pass>``).
    A draw set to ``pass`` is made afresh in each: the extremum sentences (``extremum_draw``), the rescaled
    windows' maps (``rescale_draw``, keyed ``rescale:<pass>``, so no pass shows a window as RL's lineups do);
    a draw set to ``window`` is the same in every pass."""
    from captionrl.domains.describe import short_description

    def record(item_id: str, prompt: list[dict[str, Any]], values: list[float], pass_index: int | None) -> dict[str, Any]:
        extremum = names_extremum(item_id, extremum_share, seed, pass_index if extremum_draw == "pass" else None)
        return {"id": item_id if pass_index is None else f"{item_id}#{pass_index}", "prompt": prompt,
                "caption": short_description(values, precision, order=order, extremum=extremum)}

    def shown(pass_index: int | None) -> list[tuple[str, list[dict[str, Any]], list[float]]]:
        """(id, prompt, values) of every window as the warm start shows it in pass ``pass_index``."""
        purpose = "rescale" if rescale_draw == "window" or pass_index is None else f"rescale:{pass_index}"
        out = []
        for r in rows:
            values, prompt = printed_values(r), list(r["prompt"])
            if rescaled(str(r["item_id"]), seed, rescale_share):
                values, text = rescaled_values(values, str(r["item_id"]), seed, precision, purpose)
                prompt = prompt_with_series(r, text)
            out.append((str(r["item_id"]), prompt, values))
            if reverse:
                out.append((f"{r['item_id']}~reversed", reversed_prompt(r), values[::-1]))
        return out

    return [record(item_id, prompt, values, pass_index)
            for pass_index in (range(passes) if passes > 1 else [None])
            for item_id, prompt, values in shown(pass_index)]


def warm_start(cfg: Any, rows: Sequence[Mapping[str, Any]], model: Any, processing: Any, out: Path,
               callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    """Teach ``model`` (in place) the describer's captions of ``rows``, in ``out/warm_start``; returns the SFT
    run's summary (loss, steps, where its records are). ``callbacks``: extra ``TrainerCallback``s."""
    from captionrl.train import sft

    ws: WarmStartConfig = cfg.warm_start
    folder = out / "warm_start"
    folder.mkdir(parents=True, exist_ok=True)
    passes = passes_drawn(ws.epochs, ws.extremum_draw, ws.extremum_share, ws.rescale_draw, ws.rescale_share)
    records = warm_start_records(rows, cfg.data.precision, reverse=ws.reverse, order=ws.order,
                                 extremum_share=ws.extremum_share, rescale_share=ws.rescale_share,
                                 seed=cfg.seed, passes=passes, extremum_draw=ws.extremum_draw,
                                 rescale_draw=ws.rescale_draw)
    identity = warm_start_identity(cfg, records)
    done = read_finished(folder)
    if done is not None and done["fingerprint"] != digest(identity):
        raise ConfigError("train.out_dir", str(out), f"its finished warm start ({folder}) differs from this "
                          f"run's in its {differing(done, identity)}", f"use another train.out_dir, or delete "
                          f"{folder} to train a new warm start there")
    if done is not None and load_warm_weights(model, folder / "model"):
        logger.info(f"warm start: done before in {folder} with the same settings and targets; its weights loaded, "
                    "not trained again")
        return {**done.get("summary", {}), "reused": True}
    if ws.from_run:
        return reuse_finished(Path(ws.from_run), folder, identity, model, any_seed=ws.from_run_any_seed)
    targets = write_targets(folder, records)
    steps_per_epoch = -(-len(records) // passes // ws.batch_size)
    t = cfg.train
    sft_cfg = sft.SFTRunConfig(
        seed=cfg.seed, policy=cfg.policy,
        data=sft.SFTDataConfig(path=str(targets), precision=cfg.data.precision, instruction=cfg.instruction()),
        train=sft.SFTTrainConfig(out_dir=str(folder), learning_rate=ws.learning_rate, lr_scheduler_type=ws.lr_scheduler_type,
                                 num_train_epochs=ws.epochs / passes,  # passes copies: ws.epochs passes in all
                                 per_device_train_batch_size=ws.batch_size, save_steps=steps_per_epoch,
                                 save_total_limit=1, logging_steps=max(1, steps_per_epoch // 4), report_to=[],
                                 threads=t.threads, use_cpu=t.use_cpu, bf16=t.bf16,
                                 gradient_checkpointing=t.gradient_checkpointing, max_length=2048))
    logger.info(f"warm start: {ws.epochs:g} epoch(s) of the describer's captions on {len(rows)} training windows"
                f"{' and their reverses' if ws.reverse else ''} at lr {ws.learning_rate:g}"
                f"{f', bottom {ws.freeze_layers} blocks frozen' if ws.freeze_layers else ''} ({folder})")
    # the cache pays only where a prompt is shown twice: not when every pass shows every window anew
    repeats = ws.epochs / passes > 1 or len({digest(r["prompt"]) for r in records}) < len(records)
    with (frozen_bottom(model, ws.freeze_layers, field="warm_start.freeze_layers"),
          cached_frozen_bottom(model, ws.freeze_layers if ws.reuse_frozen and repeats else 0) as cache):
        result = sft.run(sft_cfg, model=model, processing=processing, callbacks=callbacks)
    summary = {"folder": str(folder), "steps": result.get("steps"), "train_loss": result.get("train_loss"),
               "seconds": result.get("train_seconds"), "frozen_bottom_cache": cache.summary() if cache else None}
    mark_finished(folder, identity, summary)
    return summary


DONE = "warm_start_done.json"
"""The finished warm start's record in its folder: what it was trained from and its summary."""

IDENTITY_NAMES = {"policy": "policy", "warm_start": "warm_start settings", "seed": "seed",
                  "precision": "training precision (train.bf16, train.use_cpu)",
                  "targets": "training windows or targets (data settings, instruction)"}
"""What a warm start's weights depend on, as an error names each part."""


IDENTITY_EXCLUDED_SETTINGS = ("from_run", "from_run_any_seed", "extremum_draw", "rescale_draw")
"""``warm_start`` settings a finished warm start's identity leaves out: where it is reused from and from which
seeds, and what acts only through the targets (which the identity digests whole)."""

SEED_PARTS = ("seed", "targets")
"""The identity's parts a warm start shared across seeds (``from_run_any_seed``) may differ in: the seed and
the training windows and targets drawn from it."""


def warm_start_identity(cfg: Any, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What the warm start's weights depend on: the initial policy, the warm start's settings (not where a
    finished one is reused from or from which seeds, nor ``extremum_draw`` and ``rescale_draw``, which act only through the
    targets, so a warm start finished before those settings existed keeps its identity), the seed, the precision it trains in and every
    target record (prompt and caption, as a digest)."""
    from dataclasses import asdict

    settings = {k: v for k, v in asdict(cfg.warm_start).items() if k not in IDENTITY_EXCLUDED_SETTINGS}
    return {"policy": asdict(cfg.policy), "warm_start": settings, "seed": cfg.seed,
            "precision": {"bf16": cfg.train.bf16, "use_cpu": cfg.train.use_cpu}, "targets": digest(list(records))}


def read_finished(folder: Path) -> dict[str, Any] | None:
    """``folder``'s finished-warm-start record (None: none, or unreadable)."""
    import json

    try:
        done = json.loads((folder / DONE).read_text())
    except (OSError, ValueError):
        return None
    return done if isinstance(done, dict) and isinstance(done.get("fingerprint"), str) else None


def differing_parts(done: Mapping[str, Any], identity: Mapping[str, Any], ignore: Sequence[str] = ()) -> list[str]:
    """The parts of ``identity`` (but ``ignore``) a finished warm start's record (``DONE``) differs in, as an
    error names them; each part is compared as the fingerprint compares it (its ``digest``), not as loaded
    from JSON."""
    theirs = done.get("identity") or {}
    return [IDENTITY_NAMES[k] for k in IDENTITY_NAMES
            if k not in ignore and digest(theirs.get(k)) != digest(identity.get(k))]


def differing(done: Mapping[str, Any], identity: Mapping[str, Any]) -> str:
    """``differing_parts`` as one phrase (``targets`` when only the fingerprint differs)."""
    return ", ".join(differing_parts(done, identity)) or "targets"


def write_targets(folder: Path, records: Sequence[Mapping[str, Any]]) -> Path:
    """Write the SFT records to ``folder/targets.jsonl`` (returned), which the warm start is taught from; refuse
    when an interrupted warm start there (a checkpoint) was taught other records, which resuming would mix."""
    import json

    from captionrl.records import dumps, read_jsonl

    path = folder / "targets.jsonl"
    lines = [dumps(dict(r)) for r in records]
    before = list(read_jsonl(path, appended=True)) if path.is_file() else []
    if before and digest(before) != digest([json.loads(line) for line in lines]) and any(
            (folder / "checkpoints").glob("checkpoint-*")):
        raise ConfigError("train.out_dir", str(folder.parent), f"an interrupted warm start in {folder} was taught "
                          "other targets (another seed, data or warm_start setting)", f"use another train.out_dir, "
                          f"or delete {folder} to start the warm start again")
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    tmp.replace(path)
    return path


def mark_finished(folder: Path, identity: Mapping[str, Any], summary: Mapping[str, Any]) -> None:
    """Record the finished warm start, then remove its SFT checkpoints: ``folder/model`` holds its weights,
    which a rerun loads (``load_warm_weights``), and a checkpoint (weights and optimizer state) would keep as
    much again on disk for no reader."""
    import os
    import shutil

    from captionrl.records import write_json

    if int(os.environ.get("RANK", "0")) != 0 or not (folder / "model" / "config.json").is_file():
        return  # the main process records it, once there is a saved model a rerun can load
    write_json(folder / DONE, {"fingerprint": digest(dict(identity)), "identity": dict(identity),
                               "summary": dict(summary)})
    shutil.rmtree(folder / "checkpoints", ignore_errors=True)


def reuse_finished(source: Path, folder: Path, identity: Mapping[str, Any], model: Any,
                   any_seed: bool = False) -> dict[str, Any]:
    """Start from the warm start finished in ``source`` (a run folder or its ``warm_start`` folder): check it
    was trained from the same ``identity`` (with ``any_seed``, up to its ``SEED_PARTS``), copy its model into
    ``folder`` (this run's RL start point, read by the final checks and the KL anchor), record it there under
    this run's identity (so a rerun finds it done) and load its weights into ``model``."""
    import os
    import shutil

    field = "warm_start.from_run"
    src = source / "warm_start" if (source / "warm_start" / DONE).is_file() else source
    done = read_finished(src)
    if done is None:
        raise ConfigError(field, str(source), f"holds no finished warm start (no readable {DONE} in it or in its "
                          "warm_start folder; a warm start writes it when it finishes)",
                          "point it at the folder of a run whose warm start finished, or leave it empty to train one")
    their_seed = (done.get("identity") or {}).get("seed")
    if any_seed:
        apart = differing_parts(done, identity, ignore=SEED_PARTS)
        if apart or not done.get("identity"):
            raise ConfigError(field, str(source), f"its warm start differs in its {', '.join(apart) or 'record'} "
                              "(with warm_start.from_run_any_seed only the seed and training windows may differ)",
                              "use that run's policy, precision and warm_start settings, or leave it empty to train one")
    elif done["fingerprint"] != digest(dict(identity)):
        raise ConfigError(field, str(source), f"its warm start differs in its {differing(done, identity)}",
                          "use that run's policy, seed, data and warm_start settings (or set "
                          "warm_start.from_run_any_seed to share one across seeds), or leave it empty to train one")
    if src.resolve() != folder.resolve() and int(os.environ.get("RANK", "0")) == 0:
        shutil.rmtree(folder / "model", ignore_errors=True)
        shutil.copytree(src / "model", folder / "model")  # a copy: a later save here must not write into theirs
        shared = {"from_seed": their_seed} if any_seed else {}
        mark_finished(folder, identity, {**done.get("summary", {}), "from_run": str(src), **shared})
    _wait_for(folder / DONE)
    if not load_warm_weights(model, folder / "model"):
        raise ConfigError(field, str(source), "its saved model does not fit the policy's parameters",
                          "point it at a run of the same policy, or leave it empty to train one")
    same = f"same settings, seed {their_seed}" if any_seed else "same settings and targets"
    logger.info(f"warm start: the one finished in {src} ({same}), copied into {folder}")
    return {**done.get("summary", {}), "reused": True, "from_run": str(src)}


def _wait_for(path: Path, seconds: float = 600.0) -> None:
    """Other ranks wait for the main process's copy of a reused warm start."""
    import time

    end = time.monotonic() + seconds
    while not path.is_file() and time.monotonic() < end:
        time.sleep(0.5)


def load_warm_weights(model: Any, folder: Path) -> bool:
    """Load the saved warm start's weights (``*.safetensors`` in ``folder``) into ``model`` in place; False
    (``model`` untouched) when the files are missing or do not fit its parameters exactly (a tied output
    layer is the one name a saved model may leave out)."""
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return False
    state: dict[str, Any] = {}
    for f in files:
        state.update(load_file(str(f)))
    own = model.state_dict()
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    if set(state) - set(own) or set(own) - set(state) - tied:
        logger.warning(f"warm start: the weights in {folder} do not fit the policy's parameters; training it again")
        return False
    if any(own[k].shape != v.shape for k, v in state.items()):
        logger.warning(f"warm start: the weights in {folder} have other shapes than the policy's; training it again")
        return False
    model.load_state_dict(state, strict=False)
    return True


def anchor_reference(model: Any, out: Path) -> Path | None:
    """Name the warm-started weights (``out/warm_start/model``) as ``model``'s checkpoint, so that RL's KL
    term (``train.beta > 0``) holds the captioner near its warm start; returns that folder (None when the
    warm start saved no model).

    Why: TRL builds its reference model from the policy config's ``_name_or_path``
    (``trl.trainer.utils.get_config_model_id``, declared in ``train.run.trl_compat``). The warm start trains the
    loaded model in place, so that name still points at the base checkpoint, and the KL term would pull the
    captioner back towards the model that never stated a direction: on the main job it cost 1.6 nats a
    caption at step 1, before any RL update. Anchored to the warm start, the KL is 0 at step 1 and grows
    only as RL moves away from what the warm start taught (a resumed run anchors to the same folder)."""
    folder = out / "warm_start" / "model"
    if not (folder / "config.json").is_file():
        return None
    model.config._name_or_path = str(folder)
    return folder
