"""``captionrl train sft``: supervised fine-tuning, and SFT distillation from a teacher's captions (JSONL of
``{prompt | series | image, caption}``), the SFT baseline of all three papers (learning rate 1e-5, cosine
schedule).

The run itself (``SFTTrainConfig``, ``SFTRecipe``: TRL's ``SFTTrainer`` in the shared skeleton) is also the
one ``captionrl train moco-sft`` (``train/moco_sft.py``) trains with, on its multi-role rows instead.
"""

from __future__ import annotations

import json
import logging
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from captionrl.config import help_field
from captionrl.errors import ConfigError, DataError
from captionrl.judges.roles import POLICY_INSTRUCTION, policy_messages
from captionrl.records import RecordWriter, read_jsonl
from captionrl.train.run.builder import checkpointing_args, cuda_available
from captionrl.train.run.loading import lora_config
from captionrl.train.run.sections import PolicyConfig, check_memory_plan_mode
from captionrl.train.run.skeleton import Recipe, Run, train

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------- rows
def require_keys(rec: Mapping[str, Any], keys: Sequence[str], where: str) -> None:
    for k in keys:
        if k not in rec or rec[k] in (None, ""):
            raise DataError(f"{where}.{k}", rec.get(k), "is missing", f"add {k!r} to every record of this file")


def load_image(path: Any) -> Any:
    from PIL import Image

    if hasattr(path, "convert"):
        return path.convert("RGB")
    if not Path(str(path)).is_file():
        raise DataError("image", str(path), "image file not found", "fix the image path (relative paths resolve from the working directory)")
    return Image.open(str(path)).convert("RGB")


def sft_row(role: str, key: str, prompt: list[dict[str, Any]], completion: str, images: list[Any],
         **meta: Any) -> dict[str, Any]:
    return {"key": key, "role": role, "prompt": prompt,
            "completion": [{"role": "assistant", "content": completion}], "images": images, **meta}


def build_distill_rows(records: Sequence[Mapping[str, Any]], *, with_images: bool = False,
                       precision: int = 2, chart: bool = False, instruction: str | None = None) -> list[dict[str, Any]]:
    """Rows of SFT distillation: ``prompt`` (text or chat messages), ``series`` or ``image``.

    A series record is asked as LineupRL asks its policy (``domains.captioning.series_caption_messages``):
    the rendered chart when ``chart`` (a VLM policy: the SFT baseline on a teacher's chart captions), the
    printed numbers otherwise; ``instruction`` (or the record's own) is the captioning instruction."""
    rows = []
    for i, rec in enumerate(records):
        where = f"data[{i}]"
        require_keys(rec, ("caption",), where)
        key = str(rec.get("id", rec.get("key", i)))
        images: list[Any] = []
        if rec.get("prompt"):
            p = rec["prompt"]
            prompt = [{"role": "user", "content": p}] if isinstance(p, str) else list(p)
        elif rec.get("series") is not None:
            from captionrl.domains.captioning import series_caption_messages

            values = _series_values(rec["series"], f"{where}.series")
            prompt = series_caption_messages(values, chart=chart and with_images, precision=precision,
                                             instruction=rec.get("instruction") or instruction)
            if chart and with_images:  # TRL's VLM collator: an image placeholder in the turn, the image in a column
                parts = prompt[0]["content"]
                images = [p["image"] for p in parts if p.get("type") == "image"]
                prompt = [{"role": "user", "content": [{"type": "image"} if p.get("type") == "image" else p
                                                       for p in parts]}]
        elif rec.get("image") is not None:
            if not with_images:
                raise DataError(f"{where}.image", rec["image"], "a language-only model cannot read images",
                                "train a vision-language model (policy.model), or give 'prompt' (e.g. image_text) instead")
            prompt = policy_messages(with_images=True, instruction=rec.get("instruction", POLICY_INSTRUCTION))
            images = [load_image(rec["image"])]
        else:
            raise DataError(where, sorted(rec), "has no prompt, series or image",
                            "give each record 'prompt' (text or chat messages), 'series' (numbers) or 'image' (path)")
        rows.append(sft_row("policy", f"sft:{key}", prompt, str(rec["caption"]), images))
    return rows


def _series_values(values: Any, where: str) -> list[float]:
    """A record's series as floats: one-dimensional, finite, at least 2 values (else a named DataError)."""
    import numpy as np

    try:
        arr = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise DataError(where, values, "is not a list of numbers", "write the series as a JSON list of numbers") from None
    if arr.ndim != 1 or arr.size < 2 or not np.isfinite(arr).all():
        raise DataError(where, list(np.ravel(arr))[:6], "must be a finite series of at least 2 values",
                        "clean the record (no NaN, no nesting) or drop it")
    return arr.tolist()


# ---------------------------------------------------------------------- configs
@dataclass
class SFTDataConfig:
    """Where the teacher's captions come from."""

    path: str | None = help_field(None, "JSONL of {prompt | series | image, caption} written by a teacher")
    max_rows: int | None = help_field(None, "use at most this many rows (a seeded sample; null = all)")
    precision: int = help_field(2, "series records: decimals when printing values")
    instruction: str | None = help_field(None, "series records: the captioning instruction (null = the default of captionrl.domains.captioning; use LineupRL's data.instruction to ask what RL asks)")


@dataclass
class SFTTrainConfig:
    """Optimisation, checkpoints and logging of the SFT run (TRL ``SFTTrainer``)."""

    out_dir: str = help_field("runs/sft", "run folder: config.yaml, data.jsonl, checkpoints/, model/, curves.png; rerunning resumes")
    learning_rate: float = help_field(1e-5, "AdamW learning rate (the paper's SFT: 1e-5)")
    lr_scheduler_type: str = help_field("cosine", "learning-rate schedule (paper: cosine)")
    warmup_steps: float = help_field(0.0, "warm-up: steps (>= 1) or a fraction of all steps (< 1)")
    weight_decay: float = help_field(0.0, "AdamW weight decay")
    num_train_epochs: float = help_field(1.0, "passes over the rows (when max_steps is -1)")
    max_steps: int = help_field(-1, "optimizer steps; -1 = num_train_epochs passes")
    per_device_train_batch_size: int = help_field(4, "rows per device per micro-step")
    gradient_accumulation_steps: int = help_field(1, "micro-steps per optimizer step")
    max_length: int = help_field(1024, "longest tokenized row (prompt + completion); rows whose prompt alone is too long are dropped and counted")
    save_steps: int = help_field(200, "checkpoint every N optimizer steps")
    save_total_limit: int | None = help_field(None, "keep the N most recent checkpoints (null: all)")
    logging_steps: int = help_field(10, "log metrics every N steps")
    report_to: list[str] = help_field(["tensorboard"], "metric sinks: tensorboard, wandb, trackio, or [] for none")
    threads: int | None = help_field(None, "torch CPU threads (null: leave OMP_NUM_THREADS's choice)")
    use_cpu: bool | None = help_field(None, "train on CPU; null = CPU when no GPU is visible")
    bf16: bool | None = help_field(None, "bf16 mixed precision; null = on for GPUs, off on CPU")
    gradient_checkpointing: bool | None = help_field(None, "recompute activations; null = on for GPUs, off on CPU")
    resume: str = help_field("auto", "auto: resume from the last checkpoint in out_dir (config must match); off: refuse a folder with checkpoints")
    memory_plan: str = help_field("refuse", "on CUDA, plan the GPU memory before anything loads (captionrl plan) and: refuse a plan that does not fit, naming the fix; warn and go on; or off")
    extra: dict[str, Any] = help_field({}, "any other SFTConfig field, passed through unchanged")

    def __post_init__(self) -> None:
        for name in ("per_device_train_batch_size", "gradient_accumulation_steps", "save_steps", "logging_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name}", getattr(self, name), "must be >= 1", f"set train.{name} to 1 or more")
        if self.max_length < 16:
            raise ConfigError("train.max_length", self.max_length, "is too short for any prompt", "use e.g. 1024")
        if self.max_steps == 0 or self.max_steps < -1:
            raise ConfigError("train.max_steps", self.max_steps, "must be -1 or >= 1", "set train.max_steps: 100")
        if self.learning_rate <= 0:
            raise ConfigError("train.learning_rate", self.learning_rate, "must be > 0", "use 1e-5")
        if self.resume not in ("auto", "off"):
            raise ConfigError("train.resume", self.resume, "unknown resume mode", "use auto or off")
        check_memory_plan_mode(self.memory_plan)
        if isinstance(self.report_to, str):
            self.report_to = [] if self.report_to in ("none", "") else [self.report_to]


@dataclass
class SFTRunConfig:
    """A whole SFT run: model, data and training."""

    seed: int = help_field(0, "seed of shuffling, candidate draws, row sampling and the trainer")
    check: bool = help_field(False, "validate config and data, print row counts per role, load no model")
    policy: PolicyConfig = field(default_factory=PolicyConfig, metadata={"help": "the model being fine-tuned (LoRA or full)"})
    data: SFTDataConfig = field(default_factory=SFTDataConfig, metadata={"help": "the teacher's captions"})
    train: SFTTrainConfig = field(default_factory=SFTTrainConfig, metadata={"help": "optimisation and checkpoints"})

    def __post_init__(self) -> None:
        if not self.data.path:
            raise ConfigError("data.path", self.data.path, "sft needs the teacher's captions", "set data.path=<file.jsonl>")


# ---------------------------------------------------------------------- run
def drop_too_long(rows: list[dict[str, Any]], tokenizer: Any, max_length: int) -> tuple[list[dict[str, Any]], list[str]]:
    """Drop rows whose prompt leaves no room for the completion (TRL truncates the end: the target)."""
    kept, dropped = [], []
    for r in rows:
        text = tokenizer.apply_chat_template(_text_only(r["prompt"]), tokenize=False, add_generation_prompt=True)
        n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        (kept if n < max_length - 8 else dropped).append(r if n < max_length - 8 else r["key"])
    return kept, dropped


def _as_parts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages whose content is always a list of parts (a string becomes one text part): a VLM data set
    mixes image prompts (Policy, Generator) with text-only ones (Judge), and Arrow needs one type."""
    return [{**m, "content": m["content"] if isinstance(m["content"], list)
             else [{"type": "text", "text": m["content"]}]} for m in messages]


def _text_only(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        c = m["content"]
        if isinstance(c, list):
            c = " ".join(p.get("text", "<image>") for p in c)
        out.append({"role": m["role"], "content": c})
    return out


def sft_args(cfg: Any, output_dir: Path) -> Any:
    from trl import SFTConfig

    t = cfg.train
    on_cpu = t.use_cpu if t.use_cpu is not None else not cuda_available()
    kw: dict[str, Any] = {
        "output_dir": str(output_dir), "seed": cfg.seed, "data_seed": cfg.seed, "use_cpu": on_cpu,
        "bf16": t.bf16 if t.bf16 is not None else not on_cpu, "fp16": False,
        **checkpointing_args(SFTConfig, t.gradient_checkpointing if t.gradient_checkpointing is not None else not on_cpu),
        "learning_rate": t.learning_rate, "lr_scheduler_type": t.lr_scheduler_type, "warmup_steps": t.warmup_steps,
        "weight_decay": t.weight_decay, "num_train_epochs": t.num_train_epochs, "max_steps": t.max_steps,
        "per_device_train_batch_size": t.per_device_train_batch_size,
        "gradient_accumulation_steps": t.gradient_accumulation_steps, "max_length": t.max_length,
        "save_strategy": "steps", "save_steps": t.save_steps, "save_total_limit": t.save_total_limit,
        "logging_steps": t.logging_steps, "report_to": list(t.report_to) or "none",
        "completion_only_loss": True, "packing": False, "dataloader_num_workers": 0,
    }
    import dataclasses

    names = {f.name for f in dataclasses.fields(SFTConfig)}
    for k, v in t.extra.items():
        if k not in names:
            from captionrl.registry import suggest

            raise ConfigError(f"train.extra.{k}", v, "not an SFTConfig field", suggest(k, sorted(names)))
        kw[k] = v
    try:
        return SFTConfig(**kw)
    except ValueError as exc:
        raise ConfigError("train", None, f"TRL rejected the settings: {exc}", "adjust the named setting") from exc


class SFTRecipe(Recipe):
    """SFT in the shared skeleton: prompt-completion rows as data, TRL's ``SFTTrainer`` instead of an RL
    trainer (no reward functions), ``sft_summary.json`` as the result file."""

    name = "sft"
    title = "SFT"
    result_file = "sft_summary.json"
    curve_keys = ("loss", "mean_token_accuracy", "learning_rate")

    def __init__(self, cfg: Any, model: Any = None, processing: Any = None, callbacks: Sequence[Any] = ()) -> None:
        super().__init__(cfg, callbacks)
        self.given = (model, processing)
        self.rows: list[dict[str, Any]] = []
        self.dropped: list[str] = []

    def build_rows(self, with_images: bool) -> list[dict[str, Any]]:
        """The distillation rows of ``data.path`` (a subclass trains on other rows: ``train/moco_sft.py``)."""
        d = self.cfg.data
        p = Path(str(d.path))
        if not p.is_file():
            raise DataError("data.path", str(p), "file not found", "give the JSONL of teacher captions")
        return build_distill_rows(list(read_jsonl(p)), with_images=with_images, precision=d.precision,
                                  chart=self.cfg.policy.input != "numbers", instruction=d.instruction)

    def training_rows(self, with_images: bool) -> list[dict[str, Any]]:
        """``build_rows``, refused when empty, then a seeded sample of ``data.max_rows``."""
        rows = self.build_rows(with_images)
        if not rows:
            raise DataError("data", self.name, "no rows to train on", "check the record files (and data.roles, where there is one)")
        d = self.cfg.data
        if d.max_rows is not None and d.max_rows < len(rows):
            rows = random.Random(self.cfg.seed).sample(rows, d.max_rows)
        return rows

    def trainer_args(self, run: Run) -> Any:
        return sft_args(self.cfg, run.out / "checkpoints")

    def dataset(self, run: Run) -> list[dict[str, Any]]:
        """Every record link checked before any model loads (text only; images are read once the policy
        says it is a VLM)."""
        return self.training_rows(with_images=False)

    def load_policy(self, run: Run) -> None:
        model, processing = self.given
        pol = self.cfg.policy
        if pol.input == "chart" and model is None:  # from the config alone: fail before the weights load
            from captionrl.backends.hf import model_is_vlm

            if not model_is_vlm(pol.model, pol.trust_remote_code):
                raise ConfigError("policy.input", "chart", f"{pol.model} is a language-only model",
                                  "set policy.input: numbers, or fine-tune a VLM policy on the charts")
        if model is None:
            super().load_policy(run)
        else:
            run.model, run.processing, run.is_vlm = model, processing, hasattr(processing, "image_processor")

    def build_trainer(self, run: Run) -> Any:
        from datasets import Dataset
        from trl import SFTTrainer

        cfg, out = self.cfg, run.out
        rows = self.training_rows(with_images=True) if run.is_vlm else run.data
        tokenizer = getattr(run.processing, "tokenizer", run.processing)
        self.rows, self.dropped = drop_too_long(rows, tokenizer, cfg.train.max_length)
        if self.dropped:
            logger.warning(f"warning: dropped {len(self.dropped)} row(s) whose prompt exceeds train.max_length={cfg.train.max_length} "
                           f"(e.g. {self.dropped[:3]}); raise train.max_length to keep them")
        if not self.rows:
            raise ConfigError("train.max_length", cfg.train.max_length, "every row's prompt is longer", "raise train.max_length")
        with RecordWriter(out / "data.jsonl") as w:
            w.write_many({k: v for k, v in r.items() if k != "images"} for r in self.rows if not w.has(r["key"]))
        columns = ["prompt", "completion"] + (["images"] if run.is_vlm else [])
        table = [{k: r[k] for k in columns} for r in self.rows]
        if run.is_vlm:  # the Judge's text-only prompts beside image prompts: one content type per column
            table = [{**t, "prompt": _as_parts(t["prompt"])} for t in table]
        dataset = Dataset.from_list(table)
        return SFTTrainer(model=run.model, args=run.args, train_dataset=dataset, processing_class=run.processing,
                          peft_config=lora_config(cfg.policy), callbacks=self.callbacks(run))

    def summary(self, run: Run) -> dict[str, Any]:
        return {"recipe": self.name, "rows": dict(Counter(r["role"] for r in self.rows)),
                "dropped_too_long": self.dropped, "train_loss": run.train_output.training_loss,
                "resumed_from": str(run.resume_from) if run.resume_from else None,
                "log_history": run.trainer.state.log_history}


def train_sft(recipe: SFTRecipe) -> dict[str, Any]:
    """Train ``recipe`` with TRL's ``SFTTrainer`` (resuming from ``out_dir`` when it holds a checkpoint),
    save the model and ``sft_summary.json``; returns the summary and the trainer."""
    done = train(recipe)
    return {**done.result, "trainer": done.trainer}


def run(cfg: SFTRunConfig, model: Any = None, processing: Any = None, callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    """Distil the teacher's captions of ``cfg`` (``train_sft``). ``model``/``processing`` skip loading;
    ``callbacks`` are extra ``TrainerCallback``s."""
    return train_sft(SFTRecipe(cfg, model, processing, callbacks))


# ---------------------------------------------------------------------- command
CONFIG = SFTRunConfig


def check_or_train(recipe: SFTRecipe) -> str:
    """Check the rows (``check``: row counts per role as JSON, no model) or train; returns what the
    command prints: the JSON, or where the model and curves went."""
    if recipe.cfg.check:
        return json.dumps(dict(Counter(r["role"] for r in recipe.training_rows(with_images=False))))
    result = train_sft(recipe)
    lines = [f"rows:   {result['rows']}  (dropped as too long: {len(result['dropped_too_long'])})",
             f"steps:  {result['steps']}  train loss {result['train_loss']:.4f}",
             f"model:  {result['model']}"]
    if result.get("curves"):
        lines.append(f"curves: {result['curves']}")
    return "\n".join(lines)


def run_command(cfg: SFTRunConfig) -> int:
    """``captionrl train sft``: check the rows or train."""
    print(check_or_train(SFTRecipe(cfg)))
    return 0
