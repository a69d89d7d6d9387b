"""Image items and their loaders: local folders, JSONL manifests, HF ``datasets`` columns, offline corpora.

An ``ImageItem`` is one image (a path, raw bytes or a PIL image) with what we know about it: reference
captions, QA pairs and structured facts. Every loader validates each image (it must open *and* decode
fully, so a truncated file is caught here, not mid-training) and either raises a ``DataError`` naming the
item (``on_error="raise"``, the default) or skips it and reports it in ``ImageSet.skipped``
(``on_error="skip"``). Offline corpora never download: ``easy-vqa`` (5,000 synthetic shape images with QA
pairs, found inside the installed package) and scikit-image's ``skimage.data`` photographs (optional).
"""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from captionrl.errors import ConfigError, DataError

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from captionrl.domains.scenes import Scene

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")
OnError = Literal["raise", "skip"]


@dataclass(frozen=True)
class ImageItem:
    """One image and what is known about it.

    ``image`` is a file path, encoded bytes or a ``PIL.Image``; ``load()`` returns it as RGB. ``qa`` pairs
    are dicts with ``question`` and ``answer`` (and ``options`` for multiple choice); ``facts`` are
    structured ground truth (see ``captionrl.domains.scenes``).
    """

    id: str
    image: Any
    references: tuple[str, ...] = ()
    qa: tuple[Mapping[str, Any], ...] = ()
    facts: tuple[Mapping[str, Any], ...] = ()
    source: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)

    def load(self) -> Any:
        """The image as an RGB ``PIL.Image`` (raises ``DataError`` naming this item if it cannot)."""
        return decode_image(self.image, self.id)


@dataclass
class ImageSet:
    """Loaded items plus the report of what was skipped (``{"item", "error"}``) and ignored (files)."""

    items: list[ImageItem]
    skipped: list[dict[str, str]] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    source: str = ""

    def __iter__(self) -> Iterator[ImageItem]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> ImageItem:
        return self.items[i]

    def report(self) -> dict[str, Any]:
        return {"source": self.source, "loaded": len(self.items), "skipped": self.skipped, "ignored": self.ignored}


# ---------------------------------------------------------------------- validation
def decode_image(source: Any, item_id: str = "?") -> Any:
    """Open and fully decode ``source`` (path, bytes, base64 ``data:`` URL, PIL, HF dict) as RGB."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(source, Image.Image):
        return source.convert("RGB")
    if isinstance(source, Mapping):  # datasets Image feature with decode=False: {"bytes", "path"}
        source = source.get("bytes") or source.get("path")
    if isinstance(source, str) and source.startswith("data:"):
        source = base64.b64decode(source.split(",", 1)[1])
    try:
        if isinstance(source, (bytes, bytearray)):
            with Image.open(io.BytesIO(source)) as im:
                im.load()
                return im.convert("RGB")
        if isinstance(source, (str, Path)):
            path = Path(source)
            if not path.exists():
                raise DataError(f"image[{item_id}]", str(source), "file not found",
                                "fix the path (relative paths are resolved against the manifest's folder)")
            with Image.open(path) as im:
                im.load()
                return im.convert("RGB")
    except DataError:
        raise
    except UnidentifiedImageError as exc:
        raise DataError(f"image[{item_id}]", _short(source), "is not an image file PIL can read",
                        "remove it or replace it with a PNG/JPEG") from exc
    except (OSError, SyntaxError, ValueError) as exc:
        raise DataError(f"image[{item_id}]", _short(source), f"is truncated or corrupt ({exc})",
                        "re-export the image, or load with on_error='skip' to skip it") from exc
    raise DataError(f"image[{item_id}]", type(source).__name__, "is not an image value",
                    "give a file path, encoded bytes, a data: URL or a PIL image")


def _short(source: Any) -> Any:
    if isinstance(source, (bytes, bytearray)):
        return f"<{len(source)} bytes>"
    return str(source)[:160]


def _collect(
    candidates: Sequence[ImageItem], on_error: OnError, source: str, ignored: Sequence[str] = ()
) -> ImageSet:
    if on_error not in ("raise", "skip"):
        raise ConfigError("on_error", on_error, "unknown policy", "use 'raise' or 'skip'")
    items, skipped = [], []
    for it in candidates:
        try:
            it.load()
        except DataError as exc:
            if on_error == "raise":
                raise
            skipped.append({"item": it.id, "error": str(exc)})
            continue
        items.append(it)
    if skipped:
        logger.warning(f"{source}: skipped {len(skipped)} unreadable image(s) of {len(candidates)}; first: "
                       f"{skipped[0]['error']}")
    return ImageSet(items, skipped, list(ignored), source)


def _texts(value: Any, field_name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value.strip() else ()
    if isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        return tuple(v for v in value if v.strip())
    raise DataError(field_name, value, "must be a string or a list of strings", "write captions as text")


def _records(value: Any, field_name: str) -> tuple[Mapping[str, Any], ...]:
    if value is None:
        return ()
    if isinstance(value, Sequence) and not isinstance(value, str) and all(isinstance(v, Mapping) for v in value):
        return tuple(dict(v) for v in value)
    raise DataError(field_name, value, "must be a list of objects", 'write e.g. [{"question": ..., "answer": ...}]')


# ---------------------------------------------------------------------- folder
def load_folder(path: str | Path, *, on_error: OnError = "raise", recursive: bool = False) -> ImageSet:
    """Images of a folder, with optional sidecars next to each image ``NAME.ext``:

    - ``NAME.txt``: reference captions, one per non-empty line;
    - ``NAME.json``: ``{"captions": [...] | "caption": str, "qa": [...], "facts": [...]}``.

    Files with an image suffix that do not decode are errors (or skipped); other files are ignored and
    listed in ``ImageSet.ignored``. Item ids are paths relative to the folder, without the suffix.
    """
    root = Path(path)
    if not root.is_dir():
        raise ConfigError("images", str(path), "is not a folder", "give a folder of images")
    files = sorted(root.rglob("*") if recursive else root.iterdir())
    cands: list[ImageItem] = []
    ignored: list[str] = []
    sidecar_of = {f.with_suffix("") for f in files if f.suffix.lower() in IMAGE_SUFFIXES}
    for f in files:
        if not f.is_file():
            continue
        if f.suffix.lower() not in IMAGE_SUFFIXES:
            if not (f.suffix.lower() in (".txt", ".json") and f.with_suffix("") in sidecar_of):
                ignored.append(str(f.relative_to(root)))
            continue
        item_id = str(f.relative_to(root).with_suffix(""))
        refs: tuple[str, ...] = ()
        qa: tuple[Mapping[str, Any], ...] = ()
        facts: tuple[Mapping[str, Any], ...] = ()
        txt, js = f.with_suffix(".txt"), f.with_suffix(".json")
        if txt.exists():
            refs = tuple(line.strip() for line in txt.read_text(encoding="utf-8").splitlines() if line.strip())
        if js.exists():
            try:
                meta = json.loads(js.read_text(encoding="utf-8"))
            except json.JSONDecodeError as exc:
                raise DataError(str(js), exc.msg, "sidecar is not valid JSON", "fix the JSON syntax") from exc
            if not isinstance(meta, Mapping):
                raise DataError(str(js), type(meta).__name__, "sidecar must hold an object",
                                'write {"captions": [...], "qa": [...]}')
            refs += _texts(meta.get("captions", meta.get("caption")), f"{js}.captions")
            qa = _records(meta.get("qa"), f"{js}.qa")
            facts = _records(meta.get("facts"), f"{js}.facts")
        cands.append(ImageItem(item_id, str(f), refs, qa, facts, source=str(root)))
    return _collect(cands, on_error, str(root), ignored)


# ---------------------------------------------------------------------- manifest
def load_manifest(path: str | Path, *, on_error: OnError = "raise") -> ImageSet:
    """A JSONL manifest, one item per line: ``{"id", "image" | "image_bytes" (base64), "captions" |
    "caption", "qa", "facts"}``. Relative image paths resolve against the manifest's folder."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError("manifest", str(path), "file not found", "give the path of a .jsonl manifest")
    cands: list[ImageItem] = []
    seen: set[str] = set()
    for lineno, raw in enumerate(p.read_bytes().splitlines(), 1):
        where = f"{p.name}:{lineno}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(where, raw[max(0, exc.start - 20): exc.start + 20], f"is not UTF-8 text (byte "
                            f"{raw[exc.start]:#04x} at column {exc.start + 1})", "save the manifest as UTF-8") from None
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(where, line[:80], f"is not valid JSON ({exc.msg})", "write one JSON object per line") from exc
        if not isinstance(rec, Mapping):
            raise DataError(where, rec, "must be a JSON object", 'write {"id": ..., "image": ...}')
        item_id = str(rec.get("id", f"{p.stem}-{lineno}"))
        if item_id in seen:
            raise DataError(f"{where}.id", item_id, "repeats an earlier id", "give every item a unique id")
        seen.add(item_id)
        if "image" in rec:
            image: Any = rec["image"]
            if isinstance(image, str) and not image.startswith("data:") and not Path(image).is_absolute():
                image = str(p.parent / image)
        elif "image_bytes" in rec:
            try:
                image = base64.b64decode(rec["image_bytes"], validate=True)
            except (ValueError, TypeError) as exc:
                raise DataError(f"{where}.image_bytes", str(rec["image_bytes"])[:40], "is not base64",
                                "encode the image file with base64") from exc
        else:
            raise DataError(where, sorted(rec), "has no image", 'add "image": "path.png" or "image_bytes": base64')
        refs = _texts(rec.get("captions", rec.get("caption", rec.get("references"))), f"{where}.captions")
        cands.append(ImageItem(item_id, image, refs, _records(rec.get("qa"), f"{where}.qa"),
                               _records(rec.get("facts"), f"{where}.facts"), source=str(p)))
    if not cands:
        raise DataError("manifest", str(p), "is empty (no JSON lines)", 'write one {"id": ..., "image": ...} per line')
    return _collect(cands, on_error, str(p))


# ---------------------------------------------------------------------- HF datasets
def load_hf_dataset(
    dataset: Any,
    *,
    image_column: str = "image",
    caption_column: str | None = "caption",
    id_column: str | None = None,
    split: str | None = None,
    limit: int | None = None,
    on_error: OnError = "raise",
) -> ImageSet:
    """Items from a ``datasets.Dataset`` (or a ``load_from_disk`` folder): PixMoCap / DenseFusion style,
    an image column (PIL, ``{"bytes", "path"}``, a path or bytes) and a caption column (str or list)."""
    if isinstance(dataset, (str, Path)):
        import datasets

        dataset = datasets.load_from_disk(str(dataset))
    if hasattr(dataset, "keys") and split is not None:
        dataset = dataset[split]
    elif hasattr(dataset, "keys") and not hasattr(dataset, "column_names"):
        raise ConfigError("split", None, f"the dataset has splits {list(dataset.keys())}", "pass split=...")
    cols = list(dataset.column_names)
    for name in (image_column, caption_column, id_column):
        if name is not None and name not in cols:
            raise ConfigError("column", name, f"not in the dataset (columns: {cols})", "name an existing column")
    n = len(dataset) if limit is None else min(limit, len(dataset))
    cands = []
    for i in range(n):
        row = dataset[i]
        item_id = str(row[id_column]) if id_column else str(i)
        refs = _texts(row[caption_column], f"row[{i}].{caption_column}") if caption_column else ()
        cands.append(ImageItem(item_id, row[image_column], refs, source="hf-dataset"))
    return _collect(cands, on_error, "hf-dataset")


# ---------------------------------------------------------------------- offline corpora
def easy_vqa_dir() -> Path:
    """The ``data`` folder of the installed ``easy-vqa`` package (never downloaded)."""
    spec = importlib.util.find_spec("easy_vqa")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("items", "easy-vqa", "the package easy-vqa is not installed", "pip install easy-vqa")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


_EVQA_COLOUR_Q = re.compile(r"^what (?:color is the shape|is the color of the shape)\?$")
_EVQA_SHAPE_Q = re.compile(r"^what shape (?:is in the image|does the image contain|is present)\?$")


def load_easy_vqa(split: str = "train", *, limit: int | None = None, on_error: OnError = "raise") -> ImageSet:
    """easy-VQA: 64x64 images of one coloured shape, with QA pairs; the shape and colour facts (and a
    reference caption) are read from the image's own "what color/shape" answers when it has them."""
    return _collect(easy_vqa_items(split, limit=limit), on_error, f"easy-vqa:{split}")


def easy_vqa_items(split: str = "train", *, limit: int | None = None) -> list[ImageItem]:
    """easy-VQA items of ``split`` with their QA, facts and reference, images not decoded yet (the
    callers decode and decide what a bad image means)."""
    if split not in ("train", "test"):
        raise ConfigError("split", split, "easy-vqa has train and test splits", "use train or test")
    root = easy_vqa_dir() / split
    qs = json.loads((root / "questions.json").read_text())
    by_image: dict[int, list[dict[str, str]]] = {}
    for question, answer, image_id in qs:
        by_image.setdefault(int(image_id), []).append({"question": question, "answer": answer})
    ids = sorted(by_image)[: limit if limit is not None else None]
    cands = []
    for image_id in ids:
        qa = by_image[image_id]
        colour = next((q["answer"] for q in qa if _EVQA_COLOUR_Q.match(q["question"])), None)
        shape = next((q["answer"] for q in qa if _EVQA_SHAPE_Q.match(q["question"])), None)
        facts: list[dict[str, Any]] = []
        refs: tuple[str, ...] = ()
        if shape:
            facts.append({"kind": "shape", "value": shape})
        if shape and colour:
            facts.append({"kind": "colour", "shape": shape, "value": colour})
            refs = (f"The image shows a single {colour} {shape}.",)
        cands.append(ImageItem(f"easy-vqa-{split}-{image_id}", str(root / "images" / f"{image_id}.png"), refs,
                               tuple(qa), tuple(facts), source="easy-vqa", meta={"split": split}))
    return cands


SKIMAGE_FILES = {
    "astronaut": "astronaut.png", "brick": "brick.png", "camera": "camera.png", "cat": "chelsea.png",
    "coffee": "coffee.png", "coins": "coins.png", "grass": "grass.png", "gravel": "gravel.png",
    "horse": "horse.png", "hubble_deep_field": "hubble_deep_field.jpg", "logo": "logo.png", "moon": "moon.png",
    "page": "page.png", "rocket": "rocket.jpg", "text": "text.png", "retina": "retina.jpg",
    "immunohistochemistry": "ihc.png", "microaneurysms": "microaneurysms.png", "clock": "clock_motion.png",
    "cell": "cell.png", "shepp_logan_phantom": "phantom.png", "colorwheel": "color.png",
}
"""``skimage.data`` loader name -> the file it reads; only files shipped in the wheel (no fetching)."""


def load_skimage(*, on_error: OnError = "raise") -> ImageSet:
    """scikit-image's bundled photographs (optional dependency). The reference caption is the first
    sentence of the loader's docstring (e.g. "Color image of the astronaut Eileen Collins.")."""
    if importlib.util.find_spec("skimage") is None:
        raise ConfigError("items", "skimage", "scikit-image is not installed", "pip install scikit-image")
    import skimage.data as skd

    folder = Path(skd.__file__).parent
    cands = []
    for name, filename in SKIMAGE_FILES.items():
        path = folder / filename
        if not path.exists():
            continue
        doc = (getattr(skd, name, None).__doc__ or "") if hasattr(skd, name) else ""
        first = " ".join(doc.strip().split("\n\n")[0].split())
        cands.append(ImageItem(f"skimage-{name}", str(path), (first,) if first else (), source="skimage"))
    return _collect(cands, on_error, "skimage")


# ---------------------------------------------------------------------- one entry point
def load_images(spec: str, *, on_error: OnError = "raise") -> ImageSet:
    """Items from a spec: a folder, a ``.jsonl`` manifest, ``scenes:N[:SEED]``, ``easy-vqa[:SPLIT[:LIMIT]]``,
    ``skimage``, or a ``datasets.save_to_disk`` folder (detected by its ``dataset_info.json``/``state.json``)."""
    head, *rest = spec.split(":")
    if head == "scenes":
        from captionrl.domains.scenes import generate_scenes

        try:
            n = int(rest[0]) if rest else 8
            seed = int(rest[1]) if len(rest) > 1 else 0
        except ValueError as exc:
            raise ConfigError("items", spec, "scenes takes integers", "write scenes:N or scenes:N:SEED") from exc
        return ImageSet([scene_item(s) for s in generate_scenes(n, seed)], source=spec)
    if head == "easy-vqa":
        split = rest[0] if rest else "train"
        limit = int(rest[1]) if len(rest) > 1 else None
        return load_easy_vqa(split, limit=limit, on_error=on_error)
    if head == "skimage":
        return load_skimage(on_error=on_error)
    p = Path(spec)
    if p.is_file() and p.suffix == ".jsonl":
        return load_manifest(p, on_error=on_error)
    if p.is_dir() and ((p / "state.json").exists() or (p / "dataset_dict.json").exists()):
        return load_hf_dataset(p, on_error=on_error, split="train" if (p / "dataset_dict.json").exists() else None)
    if p.is_dir():
        return load_folder(p, on_error=on_error)
    problem = "is not a folder, a .jsonl manifest, scenes:N, easy-vqa or skimage"
    if not p.exists() and (p.suffix or "/" in spec):
        problem = "file not found (" + problem + ")"
    raise ConfigError("items", spec, problem, "give one of those")


def scene_item(scene: Scene) -> ImageItem:
    """A synthetic scene (``domains.scenes.Scene``) as an ``ImageItem``: image drawn now; facts, reference
    caption and QA attached. Lives here, not on ``Scene``, so that scenes know nothing of image items."""
    return ImageItem(
        id=scene.id,
        image=scene.render(),
        references=(scene.reference_caption,),
        qa=tuple(scene.qa),
        facts=tuple(scene.facts),
        source="scenes",
        meta={"seed": scene.seed, "index": scene.index, "contradicting_caption": scene.contradicting_caption},
    )


def with_image(messages: Sequence[Mapping[str, Any]], image: Any) -> list[dict[str, Any]]:
    """Fill the image placeholders (``{"type": "image"}`` without payload) of chat messages with ``image``,
    as TRL does from the ``image`` column, so a dataset prompt can be sent to a backend directly."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = [{**part, "image": image} if part.get("type") == "image" and part.get("image") is None
                       else dict(part) for part in content]
        out.append({**m, "content": content})
    return out
