"""``captionrl caption``: caption series with a captioner backend (or the deterministic describer).

Writes ``{id, series, caption, next?, domain}`` JSONL, the input of every LineupRL evaluation; resumable
(items already captioned in the output file are skipped).
"""

from __future__ import annotations

from dataclasses import dataclass

from captionrl.backends import Backend, backend_from_spec
from captionrl.config import help_field
from captionrl.domains.captioning import DESCRIBER, caption_series
from captionrl.errors import ConfigError, DataError


@dataclass
class CaptionConfig:
    """Settings of ``captionrl caption``."""

    out: str = help_field(help="output JSONL file (rerun with the same file to resume)")
    corpus: str = help_field("embedded", "'embedded' or a corpus file/folder (see captionrl.domains.corpora)")
    prepared: str | None = help_field(None, "a folder written by 'captionrl data prepare': caption its split's items (corpus and length are then unused)")
    captioner: str = help_field("hf:embedded", "backend spec (hf:embedded, openai:URL#MODEL, ...) or 'describer'")
    length: int = help_field(24, "window length")
    split: str = help_field("test", "which time-ordered split to caption: train, val or test")
    max_items: int = help_field(32, "caption at most this many windows (seeded sample)")
    max_new_tokens: int = help_field(96, "caption length limit in tokens")
    temperature: float = help_field(0.0, "sampling temperature (0: greedy)")
    seed: int = help_field(0, "seed of the window sample and of sampling")

    def __post_init__(self) -> None:
        if self.split not in ("train", "val", "test"):
            raise ConfigError("split", self.split, "unknown split", "use train, val or test")
        if self.captioner != DESCRIBER:
            from captionrl.eval.common import check_spec

            check_spec("captioner", self.captioner)


CONFIG = CaptionConfig


def run_command(cfg: CaptionConfig) -> int:
    from captionrl.domains.datasets import eval_windows, sample

    if cfg.prepared:
        from captionrl.domains.prepare import load_prepared

        items = sample(load_prepared(cfg.prepared).items[cfg.split], cfg.max_items, cfg.seed)
        if not items:
            raise DataError("split", cfg.split, f"{cfg.prepared} holds no {cfg.split} items",
                            "caption another split, or prepare again with items in this one")
    else:
        items = eval_windows(cfg.corpus, cfg.length, cfg.split, cfg.max_items, cfg.seed)
    captioner: Backend | str = DESCRIBER if cfg.captioner == DESCRIBER else backend_from_spec(cfg.captioner)
    caps = caption_series(items, captioner, cfg.out, max_new_tokens=cfg.max_new_tokens,
                          temperature=cfg.temperature, seed=cfg.seed)
    print(f"{len(caps)} captions in {cfg.out}")
    return 0
