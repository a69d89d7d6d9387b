"""``captionrl caption``: caption series with any captioner LineupRL trains or compares against.

The captioner is a backend spec (``hf:embedded``, ``hf:FOLDER``, ``tiny-qwen2.5-vl``, ``openai:URL#MODEL``),
the deterministic ``describer``, or a trained run's folder (``RUN/model`` or ``RUN/checkpoints/checkpoint-N``,
full weights or LoRA adapters on the run's base model). It is asked exactly what training asked: the chart
for a VLM policy, the printed numbers for a language-only one (``domains.captioning.series_caption_messages``,
the prompts of ``domains.lineup_data``), with the run's ``data.instruction``, ``precision`` and
``normalise`` when the captioner is a run's folder (read from ``RUN/config.yaml``).

Items come from a prepared folder (``prepared=``, what ``captionrl data prepare`` writes; a run's own
``data.prepared`` by default) or a corpus (``corpus=``, the embedded one by default). Output: JSONL lines
``{id, series, caption, next?, domain, captioner, input}``, the input of ``eval identify`` and ``eval
bottleneck`` (``next`` is the following window, written whenever the source has one: the forecasting task
needs it). Batched; resumable: rerunning with the same ``out`` captions only the items not yet there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from captionrl.backends import Backend
from captionrl.config import help_field
from captionrl.domains.captioning import DESCRIBER, caption_series
from captionrl.errors import ConfigError, DataError

INPUTS = ("auto", "numbers", "chart")


@dataclass
class CaptionConfig:
    """Settings of ``captionrl caption``."""

    out: str = help_field(help="output JSONL file (rerun with the same file to resume: captioned ids are skipped)")
    captioner: str = help_field("hf:embedded", "backend spec (hf:embedded, hf:FOLDER, tiny-qwen2.5-vl, openai:URL#MODEL), 'describer', or a trained run's RUN/model or RUN/checkpoints/checkpoint-N")
    input: str = help_field("auto", "what the captioner reads: chart, numbers, or auto (a run folder: its policy.input; otherwise chart for a VLM, numbers for a language-only or served model)")
    prepared: str | None = help_field(None, "a folder written by 'captionrl data prepare' (null: the run folder's data.prepared, if any)")
    corpus: str | None = help_field(None, "'embedded' or a corpus file/folder when no prepared folder is used (null: the run's data.corpus, else embedded)")
    length: int | None = help_field(None, "window length of a corpus (null: the run's data.window, else 24)")
    horizon: int = help_field(8, "corpus only: values of the following window written as 'next' (the bottleneck's forecasting target; 0 = none). A prepared folder carries its own")
    split: str = help_field("test", "which split to caption: train, val or test")
    limit: int | None = help_field(32, "caption at most this many items (seeded sample; null = all)", renamed_from=("max_items",))
    instruction: str | None = help_field(None, "captioning instruction (null: the run's data.instruction, else the default of captionrl.domains.captioning)")
    precision: int | None = help_field(None, "decimals of printed values (null: the run's data.precision, else 2)")
    normalise: str | None = help_field(None, "print values as they are (null: the run's data.normalise), or zscore / minmax")
    chart_size: list[int] | None = help_field(None, "chart width and height in pixels (null: the run's data.chart_size, else 448x448): ask at the size training drew")
    batch_size: int = help_field(8, "requests per generate call (and per written batch)")
    device: str = help_field("auto", "run folders: cpu, cuda or auto (cuda when available)")
    max_new_tokens: int = help_field(96, "caption length limit in tokens")
    temperature: float = help_field(0.0, "sampling temperature (0: greedy)")
    seed: int = help_field(0, "seed of the item sample and of sampling")

    def __post_init__(self) -> None:
        if self.split not in ("train", "val", "test"):
            raise ConfigError("split", self.split, "unknown split", "use train, val or test")
        if self.input not in INPUTS:
            raise ConfigError("input", self.input, "unknown captioner input", "use chart, numbers or auto")
        if self.normalise not in (None, "zscore", "minmax"):
            raise ConfigError("normalise", self.normalise, "unknown normalisation", "use null, zscore or minmax")
        if self.batch_size < 1:
            raise ConfigError("batch_size", self.batch_size, "must be >= 1", "set batch_size=8")
        if self.chart_size is not None:
            from captionrl.domains.lineup_data import check_chart_size

            check_chart_size(self.chart_size, "chart_size")
        if self.horizon < 0:
            raise ConfigError("horizon", self.horizon, "must be >= 0", "set horizon=8 (or 0 for no next window)")
        if self.captioner != DESCRIBER and run_dir_of(self.captioner) is None:
            from captionrl.eval.common import check_spec

            check_spec("captioner", self.captioner)


CONFIG = CaptionConfig


# ---------------------------------------------------------------------- the captioner
@dataclass
class Captioner:
    """A loaded captioner and what training told about it."""

    backend: Backend | str
    is_vlm: bool | None          # None: unknown (a served model)
    run: dict[str, Any] | None   # the training run's config.yaml, when the captioner is a run's folder
    name: str


def run_dir_of(spec: str) -> Path | None:
    """The run folder of ``RUN/model`` or ``RUN/checkpoints/checkpoint-N`` (the one holding config.yaml and
    checkpoints/), or None when ``spec`` is not a trained run's weights."""
    p = Path(spec.removeprefix("hf:").split(",")[0]).expanduser()
    if not p.is_dir() or not ((p / "config.json").exists() or (p / "adapter_config.json").exists()):
        return None
    for cand in (p.parent, p.parent.parent):
        if (cand / "config.yaml").is_file() and (cand / "checkpoints").is_dir():
            return cand
    return None


def load_captioner(cfg: CaptionConfig) -> Captioner:
    """The backend ``cfg.captioner`` names; a run folder loads its weights (merging LoRA adapters into the
    run's base model) and brings the run's config, so the prompt can be the one it was trained on."""
    if cfg.captioner == DESCRIBER:
        return Captioner(DESCRIBER, False, None, DESCRIBER)
    run = run_dir_of(cfg.captioner)
    if run is not None:
        return _load_run_weights(cfg, run)
    from captionrl.backends import backend_from_spec, parse_backend_spec
    from captionrl.backends.hf import model_is_vlm

    bcfg = parse_backend_spec(cfg.captioner)
    backend = backend_from_spec(cfg.captioner, field="captioner")
    return Captioner(backend, model_is_vlm(bcfg.model) if bcfg.kind == "hf" else None, None, cfg.captioner)


def _load_run_weights(cfg: CaptionConfig, run: Path) -> Captioner:
    import torch

    from captionrl.backends.hf import HFBackend
    from captionrl.config import load_yaml
    from captionrl.train.run.loading import load_policy
    from captionrl.train.run.sections import PolicyConfig

    saved = load_yaml(run / "config.yaml")
    pol = dict(saved.get("policy") or {})
    ckpt = Path(cfg.captioner.removeprefix("hf:").split(",")[0]).expanduser()
    policy = PolicyConfig(**{k: v for k, v in pol.items() if k in PolicyConfig.__dataclass_fields__})
    if (ckpt / "adapter_config.json").exists():
        from peft import PeftModel

        base, processing, is_vlm = load_policy(policy)
        model = PeftModel.from_pretrained(base, str(ckpt)).merge_and_unload()
    else:
        import dataclasses

        model, processing, is_vlm = load_policy(dataclasses.replace(policy, model=str(ckpt)))
    device = ("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device
    model.to(device).eval()
    backend = HFBackend.from_model(model, processing, name=f"run:{ckpt}", batch_size=cfg.batch_size)
    return Captioner(backend, is_vlm, saved, str(ckpt))


def chart_input(cfg: CaptionConfig, cap: Captioner) -> bool:
    """Chart or numbers, as training chose (``train.lineup``: chart for a VLM under ``policy.input: auto``)."""
    wanted = cfg.input
    if wanted == "auto" and cap.run is not None:
        wanted = str((cap.run.get("policy") or {}).get("input", "auto"))
    if wanted == "auto":
        return bool(cap.is_vlm)
    if wanted == "chart" and cap.is_vlm is False:
        raise ConfigError("input", "chart", f"{cap.name} is a language-only model (it cannot read a chart)",
                          "set input=numbers, or caption with a vision-language model")
    return wanted == "chart"


# ---------------------------------------------------------------------- items
def load_items(cfg: CaptionConfig, run: dict[str, Any] | None) -> list[Any]:
    """The split's items: a prepared folder's (with their ``next``), or a corpus's windows."""
    from captionrl.domains.datasets import eval_windows, sample

    data = (run or {}).get("data") or {}
    prepared = cfg.prepared or (None if cfg.corpus else data.get("prepared"))  # an explicit corpus wins over the run's
    if prepared:
        from captionrl.domains.prepare import load_prepared

        items = sample(load_prepared(prepared).items[cfg.split], cfg.limit, cfg.seed)
        if not items:
            raise DataError("split", cfg.split, f"{prepared} holds no {cfg.split} items",
                            "caption another split, or prepare again with items in this one")
        return items
    corpus = cfg.corpus or data.get("corpus") or "embedded"
    length = cfg.length or data.get("window") or 24
    return eval_windows(corpus, int(length), cfg.split, cfg.limit, cfg.seed, next_length=cfg.horizon)


def run_command(cfg: CaptionConfig) -> int:
    cap = load_captioner(cfg)
    data = (cap.run or {}).get("data") or {}
    items = load_items(cfg, cap.run)
    chart = cap.backend != DESCRIBER and chart_input(cfg, cap)
    precision = cfg.precision if cfg.precision is not None else int(data.get("precision", 2))
    caps = caption_series(items, cap.backend, cfg.out, precision=precision, max_new_tokens=cfg.max_new_tokens,
                          temperature=cfg.temperature, seed=cfg.seed, batch=cfg.batch_size, chart=chart,
                          normalise=cfg.normalise or data.get("normalise"),
                          instruction=cfg.instruction or data.get("instruction"),
                          extra={"captioner": cap.name, "input": "chart" if chart else "numbers"},
                          chart_size=cfg.chart_size or data.get("chart_size") or (448, 448))
    done = [i for i in (it.id for it in items) if i in caps]
    print(f"{len(done)}/{len(items)} items captioned in {cfg.out} ({'chart' if chart else 'numbers'} input, {cap.name})")
    return 0 if len(done) == len(items) else 1
