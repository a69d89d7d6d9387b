"""Loaders for local copies of open-ended VQA benchmarks, in each benchmark's released JSON layout.

Nothing is downloaded: point a loader at the JSON file the benchmark ships. Every row is checked (its
keys, and that its image file exists) before anything else runs, so a wrong folder or a truncated copy
ends in a ``DataError`` naming ``file:row`` and the fix, not mid-evaluation after a model has loaded.

Layouts (the answerer never sees the images, but the caption files must describe the same images, so
their ids are the image names below and the image paths are checked and recorded):

- TextVQA ``TextVQA_0.5.1_val.json``: ``{"data": [{"question_id", "image_id", "question", "answers": [10
  human answers]}]}``; images ``<images>/<image_id>.jpg`` (default folder: ``train_images/`` beside the
  JSON, where the release keeps the val images); scored by ``vqa_accuracy``.
- DocVQA ``val_v1.0.json``: ``{"data": [{"questionId", "question", "image": "documents/x.png",
  "answers": [...]}]}``; images relative to the JSON's folder (or ``images``); id = the image's stem;
  scored by ``anls``.
- ChartQA ``test_human.json`` / ``test_augmented.json``: ``[{"imgname", "query", "label"}]``; images
  ``<images>/<imgname>`` (default: ``png/`` beside the JSON); id = the image's stem; scored by
  ``relaxed_accuracy``.

Each loader returns question records ``{id, image, question, answers, metric, qid, benchmark}``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from captionrl.errors import DataError

LAYOUTS = ("textvqa", "docvqa", "chartqa")
METRIC_OF = {"textvqa": "vqa_accuracy", "docvqa": "anls", "chartqa": "relaxed_accuracy"}
DEFAULT_IMAGES = {"textvqa": "train_images", "docvqa": ".", "chartqa": "png"}
_KEYS = {
    "textvqa": ("question_id", "image_id", "question", "answers"),
    "docvqa": ("questionId", "question", "image", "answers"),
    "chartqa": ("imgname", "query", "label"),
}
_FIX = {
    "textvqa": 'give every data[] entry "question_id", "image_id", "question" and "answers" (TextVQA_0.5.1_val.json)',
    "docvqa": 'give every data[] entry "questionId", "question", "image" and "answers" (val_v1.0.json)',
    "chartqa": 'give every entry "imgname", "query" and "label" (test_human.json / test_augmented.json)',
}


def read_json(path: str | Path, field: str = "qa") -> Any:
    """A whole JSON file, with a named error for a missing, non-UTF-8 or malformed file."""
    p = Path(path)
    if not p.is_file():
        raise DataError(field, str(path), "file not found", "give the path of the benchmark's JSON file (a local copy)")
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise DataError(p.name, str(path), f"is not UTF-8 text (byte {exc.start})", "save the file as UTF-8") from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{p.name}:line {exc.lineno}", exc.msg, "is not valid JSON",
                        "give the benchmark's JSON file unchanged (JSONL question files end in .jsonl)") from None


def detect_layout(data: Any, where: str) -> str:
    """Which benchmark layout a parsed JSON file has, from its keys."""
    rows = data.get("data") if isinstance(data, Mapping) else data
    first = rows[0] if isinstance(rows, list) and rows and isinstance(rows[0], Mapping) else None
    if first is not None:
        if isinstance(data, Mapping) and "image_id" in first and "question_id" in first:
            return "textvqa"
        if isinstance(data, Mapping) and "questionId" in first:
            return "docvqa"
        if isinstance(data, list) and "imgname" in first:
            return "chartqa"
    seen = sorted(first) if first is not None else (sorted(data) if isinstance(data, Mapping) else type(data).__name__)
    raise DataError(where, seen, "is not a TextVQA, DocVQA or ChartQA layout",
                    'give TextVQA_0.5.1_val.json ({"data": [{"image_id", "question_id", ...}]}), DocVQA '
                    'val_v1.0.json ({"data": [{"questionId", ...}]}) or ChartQA test_*.json ([{"imgname", ...}])')


def _rows(data: Any, layout: str, name: str) -> list[Any]:
    rows = data.get("data") if layout in ("textvqa", "docvqa") and isinstance(data, Mapping) else data
    if not isinstance(rows, list):
        raise DataError(f"{name}.data", type(rows).__name__, "must be a list of questions", _FIX[layout])
    if not rows:
        raise DataError(name, 0, "holds no questions", "give the benchmark file with its questions")
    return rows


def _answers(value: Any, where: str, layout: str) -> list[str]:
    vals = [value] if isinstance(value, (str, int, float)) and not isinstance(value, bool) else value
    if (not isinstance(vals, list) or not vals
            or not all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in vals)):
        raise DataError(where, value, "needs one or more reference answers", _FIX[layout])
    return [str(v).strip() for v in vals]


def load_benchmark(path: str | Path, *, images: str | Path | None = None, layout: str | None = None,
                   benchmark: str | None = None) -> list[dict[str, Any]]:
    """Read a local benchmark file; ``layout`` is inferred from its keys unless given; ``images`` is the
    image folder (default: where the layout keeps it beside the JSON). Every row and image is checked."""
    p = Path(path)
    data = read_json(p)
    layout = layout or detect_layout(data, p.name)
    if layout not in LAYOUTS:
        raise DataError("layout", layout, "is not a known benchmark layout", f"use one of {', '.join(LAYOUTS)}")
    root = Path(images) if images is not None else p.parent / DEFAULT_IMAGES[layout]
    if not root.is_dir():
        raise DataError(f"{p.name}.images", str(root), "is not a folder",
                        f"give the folder that holds the {layout} images (default: {DEFAULT_IMAGES[layout]}/ beside the JSON)")
    out, missing = [], []
    for i, row in enumerate(_rows(data, layout, p.name)):
        where = f"{p.name}:row {i + 1}"
        if not isinstance(row, Mapping):
            raise DataError(where, row, "must be a JSON object", _FIX[layout])
        lacking = [k for k in _KEYS[layout] if k not in row]
        if lacking:
            raise DataError(where, sorted(row), f"lacks {', '.join(map(repr, lacking))}", _FIX[layout])
        rec = _PARSE[layout](row, where, root)
        if not isinstance(rec["question"], str) or not rec["question"].strip():
            raise DataError(f"{where}.question", rec["question"], "is missing or empty", _FIX[layout])
        rec.update(metric=METRIC_OF[layout], benchmark=benchmark or layout)
        if not Path(rec["image"]).is_file():
            missing.append((where, rec["image"]))
        out.append(rec)
    if missing:
        where, image = missing[0]
        more = f" (and {len(missing) - 1} more rows)" if len(missing) > 1 else ""
        raise DataError(f"{where}.image", image, f"image file not found{more}",
                        f"unpack the {layout} images into {root} or pass the folder that holds them (qa_images NAME=DIR)")
    return out


def _textvqa(row: Mapping[str, Any], where: str, root: Path) -> dict[str, Any]:
    image_id = str(row["image_id"])
    return {"id": image_id, "image": str(root / f"{image_id}.jpg"), "question": row["question"],
            "answers": _answers(row["answers"], f"{where}.answers", "textvqa"), "qid": str(row["question_id"])}


def _docvqa(row: Mapping[str, Any], where: str, root: Path) -> dict[str, Any]:
    image = str(row["image"])
    return {"id": Path(image).stem, "image": str(root / image), "question": row["question"],
            "answers": _answers(row["answers"], f"{where}.answers", "docvqa"), "qid": str(row["questionId"])}


def _chartqa(row: Mapping[str, Any], where: str, root: Path) -> dict[str, Any]:
    image = str(row["imgname"])
    return {"id": Path(image).stem, "image": str(root / image), "question": row["query"],
            "answers": _answers(row["label"], f"{where}.label", "chartqa"), "qid": where.rsplit(" ", 1)[-1]}


_PARSE: dict[str, Callable[[Mapping[str, Any], str, Path], dict[str, Any]]] = {
    "textvqa": _textvqa, "docvqa": _docvqa, "chartqa": _chartqa,
}
