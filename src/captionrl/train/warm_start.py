"""A supervised warm start before LineupRL: the captioner is first taught, on its own training windows, to
write the code describer's short answer (``domains.describe.short_description``), then RL begins.

Why: measured in docs/main-job.md ("Why the direction is not learned"), the embedded 135M captioner's
direction word moves with the window (AUC 0.81) but never enough to change which word it writes, and 16
RL steps of 16 captions hold about 2 right directions each: RL can only sharpen what the policy already
does, and it does not say the direction. Labels teach it (3 epochs at lr 2e-4: 79% right on held-out
windows, majority 53%). The warm start gives RL a captioner that already names the direction and the
start and end values, so the reward has right and wrong directions to tell apart in every group, and other facts to add.

The targets are written by code from the values the captioner reads (the row's printed series), so they
are right by construction and need no teacher model; the run is TRL's ``SFTTrainer`` (``train.sft``) on
the RL prompts themselves, in ``out_dir/warm_start`` (its own checkpoints: a rerun resumes or skips it).
The paper's recipe starts RL from the instruction-tuned model: ``epochs: 0`` (the default) is that.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from captionrl.config import help_field
from captionrl.errors import ConfigError

logger = logging.getLogger(__name__)

@dataclass
class WarmStartConfig:
    """Supervised fine-tuning on the describer's captions of the training windows, before RL."""

    epochs: float = help_field(0.0, "passes over the training windows before RL (0 = off: RL from the initial model, as the paper)")
    learning_rate: float = help_field(2e-4, "AdamW learning rate (at 5e-5 two epochs did not teach the direction: docs/main-job.md)")
    lr_scheduler_type: str = help_field("constant", "learning-rate schedule: constant (the schedule under which labels were measured to teach the direction: docs/main-job.md) or any transformers schedule")
    batch_size: int = help_field(8, "windows per optimizer step")

    def __post_init__(self) -> None:
        if self.epochs < 0:
            raise ConfigError("warm_start.epochs", self.epochs, "must be >= 0", "set warm_start.epochs: 0 (off) or 3")
        if self.learning_rate <= 0:
            raise ConfigError("warm_start.learning_rate", self.learning_rate, "must be > 0", "use 2e-4")
        if self.batch_size < 1:
            raise ConfigError("warm_start.batch_size", self.batch_size, "must be >= 1", "use 8")

    @property
    def enabled(self) -> bool:
        return self.epochs > 0


def printed_values(row: Mapping[str, Any]) -> list[float]:
    """The values the captioner reads for a row (its printed series: rounded, normalised as printed)."""
    return [float(x) for x in str(row["series_text"]).split(",")]


def warm_start_records(rows: Sequence[Mapping[str, Any]], precision: int) -> list[dict[str, Any]]:
    """One SFT record per training row: the row's own prompt and the describer's sentence of its values."""
    from captionrl.domains.describe import short_description

    return [{"id": str(r["item_id"]), "prompt": list(r["prompt"]),
             "caption": short_description(printed_values(r), precision)} for r in rows]


def warm_start(cfg: Any, rows: Sequence[Mapping[str, Any]], model: Any, processing: Any, out: Path) -> dict[str, Any]:
    """Teach ``model`` (in place) the describer's captions of ``rows``, in ``out/warm_start``; returns the SFT
    run's summary (loss, steps, where its records are)."""
    from captionrl.records import RecordWriter
    from captionrl.train import sft

    ws: WarmStartConfig = cfg.warm_start
    folder = out / "warm_start"
    folder.mkdir(parents=True, exist_ok=True)
    targets = folder / "targets.jsonl"
    with RecordWriter(targets, key_field="id") as w:
        w.write_many(r for r in warm_start_records(rows, cfg.data.precision) if not w.has(r["id"]))
    steps_per_epoch = -(-len(rows) // ws.batch_size)
    t = cfg.train
    sft_cfg = sft.SFTRunConfig(
        seed=cfg.seed, policy=cfg.policy,
        data=sft.SFTDataConfig(path=str(targets), precision=cfg.data.precision, instruction=cfg.instruction()),
        train=sft.SFTTrainConfig(out_dir=str(folder), learning_rate=ws.learning_rate, lr_scheduler_type=ws.lr_scheduler_type,
                                 num_train_epochs=ws.epochs,
                                 per_device_train_batch_size=ws.batch_size, save_steps=steps_per_epoch,
                                 save_total_limit=1, logging_steps=max(1, steps_per_epoch // 4), report_to=[],
                                 threads=t.threads, use_cpu=t.use_cpu, bf16=t.bf16,
                                 gradient_checkpointing=t.gradient_checkpointing, max_length=2048))
    logger.info(f"warm start: {ws.epochs:g} epoch(s) of the describer's captions on {len(rows)} training windows "
                f"at lr {ws.learning_rate:g} ({folder})")
    result = sft.run(sft_cfg, model=model, processing=processing)
    return {"folder": str(folder), "steps": result.get("steps"), "train_loss": result.get("train_loss"),
            "seconds": result.get("train_seconds")}
