"""Training images for the rubric recipes (RubiCap, MoCo Rubric): one config section, one loader.

``ImageDataConfig`` names a source (synthetic ``scenes``, ``easy-vqa``, or a local copy of ``pixmocap``,
``densefusion``, ``coco`` or a generic ``manifest``), and ``load_image_items`` reads it, validates every
image it returns before any model loads, and says what it left out:

- every image must open *and* fully decode (a truncated JPEG is caught here, not at step 300);
- every item needs at least ``min_references`` reference captions (MoCo's Generator reads two);
- a row of the wrong shape (missing key, unreadable caption, JSON that does not parse) is a bad row.

``on_bad_image: error`` stops at the first bad image with a ``DataError`` naming ``file:row`` (or the
image), the problem and the fix; ``skip`` leaves it out and records it (``ImageLoadResult.skipped``, with
counts per reason in ``summary()``, which both recipes copy into their ``result.json``): never a silent
drop. A file of the wrong layout (missing columns, no ``images``/``annotations`` lists) always raises.
``n`` items are a seeded sample; asking for more than the usable items is an error naming both numbers.
``mix`` adds more sources, each with its own ``n`` (MoCo Rubric §4.1 trains on an equal mix of PixMo-Cap
and DenseFusion): their items join the first source's, ids must not repeat across sources.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from captionrl.config import help_field
from captionrl.domains.image_layouts import (
    CORRUPT_IMAGE,
    MISSING_REFERENCES,
    READERS,
    Row,
    check_path,
)
from captionrl.domains.images import ImageItem
from captionrl.errors import ConfigError, DataError

logger = logging.getLogger(__name__)

SOURCES = ("scenes", "easy-vqa", "pixmocap", "densefusion", "coco", "manifest")
WHERE_TO_GET = {
    "pixmocap": "allenai/pixmo-cap (rows: data/train-*.parquet; images: fetch each image_url yourself into images/)",
    "densefusion": "BAAI/DenseFusion-1M (DenseFusion-4V-100k.jsonl or the 1M files, plus the images folder)",
    "coco": "COCO captions (annotations/captions_<split>2017.json plus the <split>2017/ image folder)",
    "manifest": "your own JSONL/CSV manifest or image folder",
}


@dataclass
class ImageDataConfig:
    """Where the training images come from and what makes an image usable (shared by RubiCap and MoCo)."""

    source: str = help_field("scenes", f"image source: {' | '.join(SOURCES)} (scenes and easy-vqa need no files; the others read your local copy at path)")
    path: str = help_field("", "local copy: pixmocap/densefusion rows file or folder, coco captions JSON or root folder, manifest .jsonl/.csv or image folder")
    images: str | None = help_field(None, "folder holding the images the rows point at (null = the layout's default: <path>/images for pixmocap/densefusion, <root>/<split>2017 for coco, the manifest's folder)")
    split: str = help_field("train", "split to read: easy-vqa train|test; coco captions_<split>*.json; manifests' split field; rows files named for it")
    n: int | None = help_field(None, "items to use: a seeded sample (null = all usable; more than exist is an error naming both numbers)")
    seed: int | None = help_field(None, "seed of the n-item sample (null = the run's seed)")
    min_references: int = help_field(1, "reference captions an image must have (MoCo's Generator reads 2)")
    on_bad_image: str = help_field("error", "missing/corrupt image, missing references, bad row: error (stop, name file:row and the fix) or skip (leave it out; counted in result.json)")
    scene_count: int | None = help_field(None, "scenes: how many synthetic scenes to draw (null = n, or 64 when n is null)")
    scene_seed: int = help_field(0, "scenes: seed of the scene family (scene i of seed s is the same picture everywhere)")
    image_size: int = help_field(192, "scenes: side in pixels")
    max_groups: int = help_field(2, "scenes: shape groups per scene (1..3)")
    text_prob: float = help_field(0.5, "scenes: probability that a scene carries a written word")
    mix: list[dict[str, Any]] = help_field([], "more sources whose items join this one's: each a mapping of source, path, images, split, n (and the scenes settings); min_references, on_bad_image and seed apply to all (e.g. MoCo §4.1's equal PixMo-Cap + DenseFusion mix)")

    def __post_init__(self) -> None:
        self.check_image_data()

    def check_image_data(self) -> None:
        """Field checks (called by subclasses after they map their older field names)."""
        if self.source not in SOURCES:
            from captionrl.registry import suggest

            raise ConfigError("data.source", self.source, "unknown image source", suggest(self.source, list(SOURCES)))
        if self.on_bad_image not in ("error", "skip"):
            raise ConfigError("data.on_bad_image", self.on_bad_image, "unknown policy", "use error or skip")
        if self.n is not None and self.n < 1:
            raise ConfigError("data.n", self.n, "must be >= 1 (or null for all)", "set data.n: 64")
        if self.min_references < 0:
            raise ConfigError("data.min_references", self.min_references, "must be >= 0", "set data.min_references: 1")
        if self.scene_count is not None and self.scene_count < 1:
            raise ConfigError("data.scene_count", self.scene_count, "must be >= 1", "set data.scene_count: 64")
        if self.source in READERS and not self.path:
            raise ConfigError("data.path", self.path, f"source {self.source} reads a local copy and needs its path",
                              f"set data.path to your copy of {WHERE_TO_GET[self.source]} (captionrl downloads nothing)")
        if self.source == "easy-vqa" and self.split not in ("train", "test"):
            raise ConfigError("data.split", self.split, "easy-vqa has train and test splits", "use train or test")
        self.mix_configs()  # every mixed-in source is validated now, before anything loads

    def mix_configs(self) -> list[ImageDataConfig]:
        """One config per ``mix`` entry: this config's settings with the entry's source, path, split, n..."""
        import dataclasses

        own = {"source", "path", "images", "split", "n", "scene_count", "scene_seed", "image_size", "max_groups", "text_prob"}
        out = []
        for i, entry in enumerate(self.mix or []):
            where = f"data.mix[{i}]"
            if not isinstance(entry, dict) or "source" not in entry:
                raise ConfigError(where, entry, "must be a mapping with at least a source",
                                  "write e.g. {source: densefusion, path: data/DenseFusion-4V-100k.jsonl, n: 2500}")
            unknown = sorted(set(entry) - own)
            if unknown:
                raise ConfigError(f"{where}.{unknown[0]}", entry[unknown[0]], "is not a per-source setting",
                                  f"use only {', '.join(sorted(own))} (min_references, on_bad_image and seed apply to all)")
            try:
                out.append(dataclasses.replace(self, mix=[], **entry))
            except ConfigError as exc:
                raise ConfigError(f"{where}.{exc.field.removeprefix('data.')}", exc.value, exc.problem, exc.fix) from None
        return out


@dataclass
class ImageLoadResult:
    """Usable items (images decoded once, so known good) and every image left out, with why."""

    items: list[ImageItem]
    skipped: list[dict[str, str]] = field(default_factory=list)  # {"where", "reason", "problem"}
    source: str = ""
    read: int = 0  # rows validated (items + skipped): all of them, or as many as the n-item sample needed
    available: int = 0  # rows of the source (of this split)

    def counts(self) -> dict[str, int]:
        """Skipped images per reason (missing image, corrupt image, missing references, bad row)."""
        return dict(Counter(s["reason"] for s in self.skipped))

    def summary(self) -> dict[str, Any]:
        """What a run's ``result.json`` records about its images."""
        return {"source": self.source, "loaded": len(self.items), "read": self.read, "available": self.available,
                "skipped": len(self.skipped),
                "skipped_by_reason": self.counts(), "skipped_examples": self.skipped[:5]}


def load_image_items(cfg: ImageDataConfig, *, seed: int | None = None) -> ImageLoadResult:
    """Read, validate and sample the configured images (no model involved), every ``mix`` source too.

    ``seed`` is the fallback when ``cfg.seed`` is null (the run's seed). Raises ``ConfigError`` for a
    missing path and ``DataError`` for a wrong layout, a bad image under ``on_bad_image: error``, no usable
    image, ``n`` larger than the usable items, or an id found in two mixed sources.
    """
    if not cfg.mix:
        return _load_one(cfg, seed)
    import dataclasses

    parts = [_load_one(dataclasses.replace(cfg, mix=[]), seed), *(_load_one(c, seed) for c in cfg.mix_configs())]
    seen: dict[str, str] = {}
    for part in parts:
        for it in part.items:
            if it.id in seen:
                raise DataError("data.mix", it.id, f"is an image id of both {seen[it.id]} and {part.source}",
                                "mix sources that do not share images")
            seen[it.id] = part.source
    return ImageLoadResult([it for p in parts for it in p.items], [s for p in parts for s in p.skipped],
                           " + ".join(p.source for p in parts), sum(p.read for p in parts), sum(p.available for p in parts))


def _load_one(cfg: ImageDataConfig, seed: int | None) -> ImageLoadResult:
    sample_seed = int(cfg.seed if cfg.seed is not None else (seed or 0))
    label = cfg.source if cfg.source in ("scenes", "easy-vqa") else f"{cfg.source}:{cfg.path}"
    rows = _rows(cfg)
    if not rows:
        raise DataError("data.path", cfg.path or cfg.source, "holds no rows for this split",
                        f"check the file (split {cfg.split!r}) and data.source")
    order = list(range(len(rows)))
    if cfg.n is not None and cfg.n < len(rows):
        order = np.random.default_rng([sample_seed, 6]).permutation(len(rows)).tolist()  # seeded, recorded via the config
    kept: list[int] = []
    skipped: list[dict[str, str]] = []
    looked = 0
    for idx in order:
        if cfg.n is not None and len(kept) == cfg.n:
            break
        looked += 1
        problem = _check(rows[idx], cfg.min_references)
        if problem is None:
            kept.append(idx)
            continue
        if cfg.on_bad_image == "error":
            raise problem
        skipped.append({"where": rows[idx].where, "reason": rows[idx].reason, "problem": problem.problem})
    usable = len(kept)
    if cfg.n is not None and usable < cfg.n:
        why = f" ({len(skipped)} skipped as bad: {dict(Counter(s['reason'] for s in skipped))})" if skipped else ""
        raise DataError("data.n", cfg.n, f"asks for {cfg.n} items but only {usable} usable exist in {label} "
                        f"({len(rows)} read{why})", f"set data.n: {usable} or less (or null for all)")
    if not kept:
        raise DataError("data.path", cfg.path or cfg.source, f"no usable image: all {len(rows)} were skipped "
                        f"({dict(Counter(s['reason'] for s in skipped))}); first: {skipped[0]['where']}: {skipped[0]['problem']}",
                        "fix the copy (see the reasons) or point data.path at the right files")
    if skipped:
        logger.warning(f"images ({label}): skipped {len(skipped)} of {looked} ({dict(Counter(s['reason'] for s in skipped))}); "
                       f"first: {skipped[0]['where']}: {skipped[0]['problem']}")
    items = [rows[i].item for i in sorted(kept)]
    return ImageLoadResult([it for it in items if it is not None], skipped, label, looked, len(rows))


def _rows(cfg: ImageDataConfig) -> list[Row]:
    if cfg.source == "scenes":
        return [Row(f"scene {it.id}", it) for it in scene_items(cfg)]
    if cfg.source == "easy-vqa":
        from captionrl.domains.images import easy_vqa_items

        return [Row(f"easy-vqa:{cfg.split}:{it.id}", it) for it in easy_vqa_items(cfg.split)]
    path = check_path(cfg.source, cfg.path)
    images = Path(cfg.images) if cfg.images else None
    if images is not None and not images.is_dir():
        raise ConfigError("data.images", cfg.images, "is not a folder", "point data.images at the image folder, or null")
    rows = list(READERS[cfg.source](path, images, cfg.split))
    ids: dict[str, str] = {}
    for r in rows:
        if r.item is None:
            continue
        if r.item.id in ids:
            raise DataError("id", r.item.id, f"is used by two rows ({ids[r.item.id]} and {r.where})",
                            "give every image one row (merge its captions into that row's references)")
        ids[r.item.id] = r.where
    return rows


def _check(row: Row, min_references: int) -> DataError | None:
    """The row's problem as a ``DataError`` (marks ``row.reason``), or None when the item is usable."""
    if row.item is None:
        return DataError(row.where, row.value, f"{row.reason}: {row.problem}", row.fix)
    if len(row.item.references) < min_references:
        row.reason = MISSING_REFERENCES
        return DataError(row.where, list(row.item.references), f"{MISSING_REFERENCES}: has {len(row.item.references)} "
                         f"reference caption(s), min_references is {min_references}",
                         "add captions to this image, lower data.min_references, or set data.on_bad_image: skip")
    try:
        row.item.load()
    except DataError as exc:
        row.reason = CORRUPT_IMAGE
        return DataError(row.where, exc.value, f"{CORRUPT_IMAGE}: {exc.problem}",
                         "replace or re-export the image, or set data.on_bad_image: skip")
    return None


def scene_items(cfg: ImageDataConfig) -> list[ImageItem]:
    """Synthetic scenes as items, drawn now, each with two references (the exact-facts caption and the
    same facts in other words, as MoCo's Generator reads two) and its facts and QA."""
    from captionrl.domains.images import scene_item
    from captionrl.domains.scenes import generate_scenes, second_reference

    count = cfg.scene_count or cfg.n or 64
    out = []
    for scene in generate_scenes(count, cfg.scene_seed, size=cfg.image_size, max_groups=cfg.max_groups,
                                 text_prob=cfg.text_prob):
        it = scene_item(scene)
        out.append(ImageItem(it.id, it.image, (*it.references, second_reference(scene)), it.qa, it.facts,
                             source="scenes", meta=it.meta))
    return out
