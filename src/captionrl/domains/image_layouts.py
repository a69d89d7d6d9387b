"""Readers of the image-caption layouts users keep on disk: PixMo-Cap, DenseFusion, COCO captions, and a
generic manifest (JSONL / CSV / a folder with sidecars).

Each reader turns the user's local copy into ``Row`` objects: one per image, carrying either an
``ImageItem`` whose image is *not decoded yet* (``image_data.load_image_items`` decodes, checks the
references and applies ``on_bad_image``) or the problem of that row (a missing key, an image that is not
on disk) with its location ``file:row``. Problems of a whole file (no such file, missing columns, another
layout's file) raise ``DataError`` at once: skipping every row of a wrong file would only hide the mistake.
Nothing here downloads: a row that names only a URL must find its image in the local image folder.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from captionrl.domains.images import IMAGE_SUFFIXES, ImageItem
from captionrl.errors import ConfigError, DataError

ROW_FILES = (".parquet", ".jsonl", ".json", ".csv")
# Why an image is left out (``on_bad_image: skip``) or stops the load (``error``).
MISSING_IMAGE = "missing image"
CORRUPT_IMAGE = "corrupt image"
MISSING_REFERENCES = "missing references"
BAD_ROW = "bad row"


@dataclass
class Row:
    """One image of a layout: the item (image still undecoded), or why the row is unusable."""

    where: str  # file:row (1-based data row), or file:image_id for COCO
    item: ImageItem | None = None
    reason: str = ""
    problem: str = ""
    value: Any = None
    fix: str = ""


def bad(where: str, reason: str, value: Any, problem: str, fix: str) -> Row:
    return Row(where=where, reason=reason, problem=problem, value=value, fix=fix)


# ---------------------------------------------------------------------- shared parts
def url_key(url: str) -> str:
    """The file stem under which a URL's image is expected in the image folder: sha256 of the URL."""
    return hashlib.sha256(url.encode("utf-8")).hexdigest()


class ImageFolder:
    """An index of an image folder (names and sha256-of-URL stems), built once per load."""

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self.by_name: dict[str, Path] = {}
        self.by_stem: dict[str, Path] = {}
        if root is not None and root.is_dir():
            for f in root.rglob("*"):
                if f.is_file():
                    rel = f.relative_to(root).as_posix()
                    self.by_name.setdefault(rel, f)
                    self.by_name.setdefault(f.name, f)
                    self.by_stem.setdefault(f.stem, f)

    def path(self, rel: str) -> Path | None:
        """``rel`` under the folder (as given, then by file name); None when absent."""
        if Path(rel).is_absolute():
            return Path(rel) if Path(rel).is_file() else None
        if self.root is not None:
            p = self.root / rel
            if p.is_file():
                return p
        return self.by_name.get(Path(rel).name)

    def for_url(self, url: str) -> Path | None:
        """A URL's local copy: ``<sha256(url)>.<ext>``, else the URL's own file name."""
        hit = self.by_stem.get(url_key(url))
        if hit is not None:
            return hit
        name = Path(urlparse(url).path).name
        return self.by_name.get(name) if name else None


def rows_of_file(path: Path) -> tuple[list[str], Iterator[tuple[int, Any]]]:
    """(columns, iterator of (row number, record)) of a Parquet, JSONL, JSON-list or CSV file.

    Columns of JSONL/JSON files are the union of the first 100 records' keys (they have no header).
    A record that is not an object comes back as is (the caller reports it as a bad row).
    """
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as exc:  # pyarrow raises several types for a damaged file
            raise DataError(str(path), path.name, f"is not a readable Parquet file ({exc})",
                            "re-download or re-export the file") from exc
        return list(table.column_names), enumerate(table.to_pylist(), 1)
    if suffix == ".csv":
        text = _text(path)
        reader = csv.DictReader(text.splitlines())
        cols = list(reader.fieldnames or [])
        return cols, enumerate(reader, 1)
    if suffix == ".json":
        try:
            data = json.loads(_text(path))
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{exc.lineno}", exc.msg, "is not valid JSON", "fix the JSON syntax") from exc
        if isinstance(data, Mapping):
            raise DataError(str(path), sorted(data)[:8], "holds one object, not a list of rows",
                            "write a JSON list of row objects (or a .jsonl file); a COCO captions file needs source: coco")
        if not isinstance(data, list):
            raise DataError(str(path), type(data).__name__, "must hold a list of row objects", "write [{...}, {...}]")
        records: list[Any] = data
    else:
        records = []
        for line in _text(path).splitlines():
            if not line.strip():
                records.append(None)
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                records.append(_Unparsed(f"is not valid JSON ({exc.msg})", line[:80]))
    cols = sorted({k for r in records[:100] if isinstance(r, Mapping) for k in r})
    return cols, ((i, r) for i, r in enumerate(records, 1) if r is not None)


@dataclass
class _Unparsed:
    problem: str
    text: str


def _text(path: Path) -> str:
    if not path.is_file():
        raise DataError("path", str(path), "file not found", "point data.path at your local copy")
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}", raw[max(0, exc.start - 10): exc.start + 10],
                        f"is not UTF-8 text (byte {raw[exc.start]:#04x})", "save the file as UTF-8") from None


def not_object(where: str, rec: Any) -> Row | None:
    """A bad row for a record that is not an object (or did not parse); None for a good one."""
    if isinstance(rec, _Unparsed):
        return bad(where, BAD_ROW, rec.text, rec.problem, "write one JSON object per line")
    if not isinstance(rec, Mapping):
        return bad(where, BAD_ROW, rec, "must be an object", "write one JSON object per row")
    return None


def texts(value: Any) -> tuple[str, ...] | None:
    """Non-empty caption strings of a string, a list of strings or a JSON-list string; None if malformed."""
    if value is None:
        return ()
    if isinstance(value, str):
        s = value.strip()
        if s.startswith("[") and s.endswith("]"):
            try:
                parsed = json.loads(s)
            except json.JSONDecodeError:
                return (s,)
            return texts(parsed)
        return (s,) if s else ()
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)) and all(isinstance(v, str) for v in value):
        return tuple(v.strip() for v in value if v.strip())
    if hasattr(value, "tolist"):  # numpy arrays from pyarrow
        return texts(value.tolist())
    return None


def require_columns(path: Path, cols: Sequence[str], *, need: Sequence[str], any_of: Sequence[str] = (),
                    layout: str) -> None:
    """Whole-file layout check: the columns ``need`` and at least one of ``any_of`` must exist."""
    missing = [c for c in need if c not in cols]
    if missing or (any_of and not any(c in cols for c in any_of)):
        wanted = list(need) + ([" or ".join(any_of)] if any_of else [])
        raise DataError(str(path), list(cols), f"is not a {layout} file: columns {wanted} are needed, "
                        f"missing {missing + ([' or '.join(any_of)] if any_of and not any(c in cols for c in any_of) else [])}",
                        f"point data.path at the {layout} rows file, or pick the data.source of this file's layout")


def find_rows_files(root: Path, split: str, layout: str, skip_dirs: Sequence[Path] = ()) -> list[Path]:
    """Rows files (Parquet, JSONL, JSON, CSV) under ``root``: those whose name holds ``split`` if any do;
    otherwise all of them, for ``split: train`` only (the layout has no split of its own)."""
    skip = [d.resolve() for d in skip_dirs if d is not None]
    files = sorted(f for f in root.rglob("*") if f.is_file() and f.suffix.lower() in ROW_FILES
                   and not any(d in f.resolve().parents for d in skip))
    if not files:
        raise DataError("path", str(root), f"holds no rows file (.parquet, .jsonl, .json, .csv) of the {layout} layout",
                        "point data.path at the folder with the rows files (see docs: expected layout)")
    named = [f for f in files if split in f.name]
    if named:
        return named
    if split == "train":
        return files
    raise DataError("split", split, f"no rows file under {root} is named for this split ({[f.name for f in files][:5]})",
                    "use split: train, or name the file e.g. test.jsonl")


def resolve_image(value: Any, folder: ImageFolder, base: Path) -> tuple[Any, str | None]:
    """(image value for ``ImageItem``, problem) of a row's image cell: embedded bytes, a ``{bytes, path}``
    struct, or a path (under the image folder, else next to the rows file)."""
    if isinstance(value, Mapping):
        if value.get("bytes"):
            return bytes(value["bytes"]), None
        value = value.get("path")
    if isinstance(value, (bytes, bytearray)):
        return bytes(value), None
    if not isinstance(value, str) or not value.strip():
        return None, "has no image path or bytes"
    if value.startswith("data:"):
        return value, None
    if value.startswith(("http://", "https://")):
        p = folder.for_url(value)
        return (str(p), None) if p else (None, f"is a URL whose image is not in the image folder ({folder.root})")
    p = folder.path(value)
    if p is None and (base / value).is_file():
        p = base / value
    return (str(p), None) if p else (None, f"image file not found (looked in {folder.root} and {base})")


def default_images(path: Path) -> Path:
    """``images/`` next to the rows (the folder given, or the rows file's folder), else one level up
    (DenseFusion-1M keeps ``DenseFusion-4V-100k/DenseFusion-4V-100k.jsonl`` beside ``images/``)."""
    root = path if path.is_dir() else path.parent
    for cand in (root / "images", root.parent / "images"):
        if cand.is_dir():
            return cand
    return root / "images"


# ---------------------------------------------------------------------- rows-file layouts
@dataclass(frozen=True)
class RecordAt:
    """One object row of a rows file, with where it came from and the image folder its cells point into."""

    where: str
    index: int
    file: Path
    folder: ImageFolder
    img_root: Path
    rec: Mapping[str, Any]


def object_records(path: Path, images: Path | None, split: str, layout: str, title: str, need: Sequence[str],
                   any_of: Sequence[str]) -> Iterator[RecordAt | Row]:
    """The rows of a rows-file layout (PixMo-Cap, DenseFusion): the split's files, checked for the layout's
    columns; a row that is not an object comes out as a bad ``Row``, every other one as a ``RecordAt``."""
    img_root = images or default_images(path)
    files = find_rows_files(path, split, layout, [img_root]) if path.is_dir() else [path]
    folder = ImageFolder(img_root)
    for f in files:
        cols, recs = rows_of_file(f)
        require_columns(f, cols, need=need, any_of=any_of, layout=title)
        for i, rec in recs:
            where = f"{f.name}:{i}"
            r = not_object(where, rec)
            yield r if r is not None else RecordAt(where, i, f, folder, img_root, rec)


# ---------------------------------------------------------------------- PixMo-Cap
PIXMO_IMAGE_COLUMNS = ("image", "image_path", "image_url")


def read_pixmocap(path: Path, images: Path | None, split: str) -> Iterator[Row]:
    """allenai/pixmo-cap rows (``data/train-*.parquet`` or a JSONL export): ``caption`` (the long caption)
    and ``transcripts`` (the annotators' spoken descriptions) are the references, in that order. The image
    is an embedded ``image`` ({bytes, path}, as in image-carrying re-uploads), an ``image_path`` under the
    image folder, or only the ``image_url``, found in the image folder as ``<sha256(url)>.<ext>`` or under
    the URL's own file name."""
    for at in object_records(path, images, split, "pixmocap", "PixMo-Cap", ("caption",), PIXMO_IMAGE_COLUMNS):
        if isinstance(at, Row):
            yield at
            continue
        rec, where = at.rec, at.where
        refs = texts(rec.get("caption"))
        extra = texts(rec.get("transcripts"))
        if refs is None or extra is None:
            yield bad(where, BAD_ROW, rec.get("caption"), "caption/transcripts must be text or lists of text",
                      "fix the row's caption and transcripts")
            continue
        cell = next((rec[c] for c in PIXMO_IMAGE_COLUMNS if rec.get(c)), None)
        image, problem = resolve_image(cell, at.folder, at.file.parent)
        if problem:
            reason = BAD_ROW if cell is None else MISSING_IMAGE
            yield bad(where, reason, _short(cell), problem,
                      f"save the image as {at.img_root}/<sha256 of image_url>.jpg (captionrl downloads nothing), "
                      "or set on_bad_image: skip")
            continue
        url = rec.get("image_url") or ""
        item_id = str(rec.get("id") or rec.get("image_sha256")
                      or (f"pixmocap-{url_key(url)[:16]}" if url else f"{at.file.stem}-{at.index}"))
        yield Row(where, ImageItem(item_id, image, refs + extra, source="pixmocap",
                                   meta={"row": where, "image_url": url}))


# ---------------------------------------------------------------------- DenseFusion
def read_densefusion(path: Path, images: Path | None, split: str) -> Iterator[Row]:
    """DenseFusion-1M rows (``DenseFusion-4V-100k.jsonl`` and the 1M files): ``image_id``, ``image_path``
    (relative to the image folder) and ``caption`` (one dense caption per image)."""
    for at in object_records(path, images, split, "densefusion", "DenseFusion", ("caption",), ("image_path", "image")):
        if isinstance(at, Row):
            yield at
            continue
        rec, where = at.rec, at.where
        refs = texts(rec.get("caption"))
        if refs is None:
            yield bad(where, BAD_ROW, rec.get("caption"), "caption must be text", "fix the row's caption")
            continue
        cell = rec.get("image_path") or rec.get("image")
        image, problem = resolve_image(cell, at.folder, at.file.parent)
        if problem:
            yield bad(where, BAD_ROW if cell is None else MISSING_IMAGE, _short(cell), problem,
                      f"put the image at {at.img_root}/<image_path>, set data.images to the image folder, "
                      "or set on_bad_image: skip")
            continue
        item_id = str(rec.get("image_id") or rec.get("id") or f"{at.file.stem}-{at.index}")
        yield Row(where, ImageItem(item_id, image, refs, source="densefusion", meta={"row": where}))


# ---------------------------------------------------------------------- COCO captions
def coco_file(path: Path, split: str) -> Path:
    """``annotations/captions_<split>*.json`` of a COCO root folder, or the file given."""
    if path.is_file():
        return path
    for pattern in (f"annotations/captions_{split}*.json", f"captions_{split}*.json", "annotations/captions_*.json"):
        hits = sorted(path.glob(pattern))
        if hits:
            if pattern.endswith("captions_*.json") and len(hits) > 1:
                break
            return hits[0]
    raise DataError("path", str(path), f"holds no annotations/captions_{split}*.json (COCO captions layout)",
                    "point data.path at the COCO root folder or at the captions JSON file")


def read_coco(path: Path, images: Path | None, split: str) -> Iterator[Row]:
    """COCO captions: ``{"images": [{id, file_name}], "annotations": [{image_id, caption}]}``; every caption
    of an image is a reference (COCO has about five). Images are looked for in ``data.images`` or next to
    the annotations folder: ``<split>2017/``, ``<split>2014/``, ``images/<split>2017/``, ``images/``."""
    f = coco_file(path, split)
    try:
        data = json.loads(_text(f))
    except json.JSONDecodeError as exc:
        raise DataError(f"{f}:{exc.lineno}", exc.msg, "is not valid JSON", "fix the JSON syntax") from exc
    if not isinstance(data, Mapping) or not isinstance(data.get("images"), list) or not isinstance(data.get("annotations"), list):
        got = sorted(data)[:8] if isinstance(data, Mapping) else type(data).__name__
        raise DataError(str(f), got, "is not a COCO captions file: it needs 'images' and 'annotations' lists",
                        "point data.path at annotations/captions_<split>.json, or pick the data.source of this file's layout")
    root = f.parent.parent if f.parent.name == "annotations" else f.parent
    if images is None:
        for cand in (root / f"{split}2017", root / f"{split}2014", root / "images" / f"{split}2017", root / "images" / split,
                     root / "images", root):
            if cand.is_dir():
                images = cand
                break
    folder = ImageFolder(images)
    refs: dict[Any, list[str]] = {}
    orphans: list[tuple[int, Any]] = []
    ids = {im.get("id") for im in data["images"] if isinstance(im, Mapping)}
    for j, ann in enumerate(data["annotations"], 1):
        if not isinstance(ann, Mapping) or "image_id" not in ann or not isinstance(ann.get("caption"), str):
            yield bad(f"{f.name}:annotations[{j}]", BAD_ROW, ann, "needs image_id and a caption string",
                      "fix the annotation, or set on_bad_image: skip")
            continue
        if ann["image_id"] not in ids:
            orphans.append((j, ann["image_id"]))
            continue
        if ann["caption"].strip():
            refs.setdefault(ann["image_id"], []).append(ann["caption"].strip())
    for j, image_id in orphans:
        yield bad(f"{f.name}:annotations[{j}]", BAD_ROW, image_id, "names an image id that is not in images[]",
                  "fix the annotation's image_id, or set on_bad_image: skip")
    for k, im in enumerate(data["images"], 1):
        where = f"{f.name}:images[{k}]"
        if not isinstance(im, Mapping) or "id" not in im or not isinstance(im.get("file_name"), str):
            yield bad(where, BAD_ROW, im, "needs id and file_name", "fix the image entry, or set on_bad_image: skip")
            continue
        where = f"{f.name}:image {im['id']} ({im['file_name']})"
        p = folder.path(im["file_name"])
        if p is None:
            yield bad(where, MISSING_IMAGE, im["file_name"], f"image file not found in {images}",
                      "set data.images to the folder of the split's images (e.g. coco/val2017), or on_bad_image: skip")
            continue
        yield Row(where, ImageItem(str(im["id"]), str(p), tuple(refs.get(im["id"], ())), source="coco",
                                   meta={"file_name": im["file_name"]}))


# ---------------------------------------------------------------------- generic manifest
MANIFEST_IMAGE_KEYS = ("image", "image_path", "file_name", "path")
_REF_COLUMN = re.compile(r"^(captions?|references?)([ _-]?\d+)?$", re.IGNORECASE)


def read_manifest(path: Path, images: Path | None, split: str) -> Iterator[Row]:
    """A JSONL or CSV manifest, or a folder of images with sidecars.

    JSONL: ``{"id"?, "image" (path, relative to the manifest or data.images; or base64 "image_bytes"),
    "captions" | "references" (list) | "caption", "qa"?, "facts"?, "split"?}``. CSV: an ``image`` column
    and any number of reference columns (``caption``, ``caption_2``, ``reference3``..., or one
    ``captions`` cell holding a JSON list). Rows with a ``split`` field other than ``data.split`` are left
    out (not counted as bad). A folder: each image with ``NAME.txt`` (a reference per line) or
    ``NAME.json`` ({"captions": [...]}) next to it; or a ``datasets`` ``save_to_disk`` folder with the
    JSONL manifest's columns (an ``Image`` or path ``image`` column and caption columns).
    """
    if path.is_dir() and ((path / "state.json").exists() or (path / "dataset_dict.json").exists()):
        yield from _read_saved_dataset(path, images, split)
        return
    if path.is_dir():
        yield from _read_folder(path)
        return
    base = images or path.parent
    folder = ImageFolder(images) if images is not None else ImageFolder(None)
    cols, recs = rows_of_file(path)
    if path.suffix.lower() in (".csv", ".parquet"):
        require_columns(path, cols, need=(), any_of=(*MANIFEST_IMAGE_KEYS, "image_bytes"), layout="manifest")
    for i, rec in recs:
        row = manifest_row(f"{path.name}:{i}", rec, f"{path.stem}-{i}", folder, base, split, str(path))
        if row is not None:
            yield row


def manifest_row(where: str, rec: Any, default_id: str, folder: ImageFolder, base: Path, split: str,
                 source: str) -> Row | None:
    """One manifest record as a Row (None: a row of another split, not read)."""
    if (r := not_object(where, rec)) is not None:
        return r
    if split and rec.get("split") not in (None, "", split):
        return None
    key = next((k for k in MANIFEST_IMAGE_KEYS if rec.get(k) is not None and rec.get(k) != ""), None)
    if key is None and rec.get("image_bytes"):
        import base64

        try:
            image: Any = base64.b64decode(rec["image_bytes"], validate=True)
        except (ValueError, TypeError):
            return bad(where, CORRUPT_IMAGE, str(rec["image_bytes"])[:40], "image_bytes is not base64",
                       "encode the image file with base64")
    elif key is None:
        return bad(where, BAD_ROW, sorted(rec), "has no image", 'add "image": "path/to/file.png"')
    elif hasattr(rec[key], "convert"):  # a decoded PIL image (datasets Image column)
        image = rec[key]
    else:
        image, problem = resolve_image(rec[key], folder, base)
        if problem:
            return bad(where, MISSING_IMAGE, _short(rec[key]), problem,
                       "fix the path (relative paths resolve against the manifest's folder or data.images), "
                       "or set on_bad_image: skip")
    refs: tuple[str, ...] = ()
    for col in sorted((c for c in rec if _REF_COLUMN.match(str(c))), key=_ref_order):
        got = texts(rec[col])
        if got is None:
            return bad(where, BAD_ROW, rec[col], f"{col} must be text or a list of text", "write captions as text")
        refs += got
    qa, facts = rec.get("qa") or (), rec.get("facts") or ()
    if isinstance(qa, str) or isinstance(facts, str) or not all(isinstance(x, Mapping) for x in (*qa, *facts)):
        return bad(where, BAD_ROW, {"qa": qa, "facts": facts}, "qa and facts must be lists of objects",
                   'write e.g. "qa": [{"question": ..., "answer": ...}]')
    item_id = str(rec.get("id") or default_id)
    return Row(where, ImageItem(item_id, image, refs, tuple(dict(q) for q in qa), tuple(dict(x) for x in facts),
                                source=source, meta={"row": where}))


def _read_saved_dataset(root: Path, images: Path | None, split: str) -> Iterator[Row]:
    """A ``datasets`` ``save_to_disk`` folder with manifest columns (``image`` + caption columns)."""
    import datasets

    ds: Any = datasets.load_from_disk(str(root))
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise DataError("split", split, f"the saved dataset has splits {list(ds)}", "set data.split to one of them")
        ds = ds[split]
    cols = list(ds.column_names)
    require_columns(root, cols, need=(), any_of=MANIFEST_IMAGE_KEYS, layout="manifest")
    for key in MANIFEST_IMAGE_KEYS:
        if key in cols and isinstance(ds.features[key], datasets.Image):
            ds = ds.cast_column(key, datasets.Image(decode=False))  # decoded once, by the validator
    folder = ImageFolder(images)
    for i in range(len(ds)):
        row = manifest_row(f"{root.name}[{i}]", ds[i], f"{root.name}-{i}", folder, images or root, "", str(root))
        if row is not None:
            yield row


def _ref_order(col: str) -> tuple[int, str]:
    m = re.search(r"(\d+)$", str(col))
    return (int(m.group(1)) if m else 0, str(col))


def _read_folder(root: Path) -> Iterator[Row]:
    files = sorted(f for f in root.rglob("*") if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise DataError("path", str(root), "holds no image files", f"put images ({', '.join(IMAGE_SUFFIXES)}) there")
    for f in files:
        rel = f.relative_to(root).with_suffix("").as_posix()
        where = f"{root.name}/{f.name}"
        refs: tuple[str, ...] = ()
        txt, js = f.with_suffix(".txt"), f.with_suffix(".json")
        if txt.is_file():
            refs = tuple(x.strip() for x in txt.read_text(encoding="utf-8", errors="replace").splitlines() if x.strip())
        if js.is_file():
            try:
                meta = json.loads(js.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                yield bad(f"{root.name}/{js.name}", BAD_ROW, js.name, f"sidecar is not valid JSON ({exc})", "fix the JSON")
                continue
            got = texts(meta.get("captions", meta.get("caption"))) if isinstance(meta, Mapping) else None
            if got is None:
                yield bad(f"{root.name}/{js.name}", BAD_ROW, meta, 'sidecar must be {"captions": [...]}', "fix the sidecar")
                continue
            refs += got
        yield Row(where, ImageItem(rel, str(f), refs, source=str(root), meta={"row": where}))


def _short(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return f"<{len(value)} bytes>"
    return value if not isinstance(value, str) else value[:160]


READERS = {"pixmocap": read_pixmocap, "densefusion": read_densefusion, "coco": read_coco, "manifest": read_manifest}


def check_path(source: str, path: str) -> Path:
    """The local copy of a file-based source; ConfigError when it is not given or absent."""
    if not path:
        raise ConfigError("data.path", path, f"source {source} reads a local copy and needs its path",
                          "set data.path to your copy (captionrl downloads nothing; see docs/image-data.md)")
    p = Path(path)
    if not p.exists():
        raise ConfigError("data.path", path, "file or folder not found", f"point data.path at your local {source} copy")
    return p
