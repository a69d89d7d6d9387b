"""Image helpers for backends: load from path/bytes/data URL, encode as a base64 data URL."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

from captionrl.errors import DataError


def load_image(source: Any) -> Any:
    """Return an RGB ``PIL.Image`` from a PIL image, a path, raw bytes or a ``data:`` URL."""
    from PIL import Image

    if isinstance(source, Image.Image):
        return source.convert("RGB")
    try:
        if isinstance(source, (bytes, bytearray)):
            return Image.open(io.BytesIO(source)).convert("RGB")
        if isinstance(source, str) and source.startswith("data:"):
            payload = source.split(",", 1)[1]
            return Image.open(io.BytesIO(base64.b64decode(payload))).convert("RGB")
        if isinstance(source, (str, Path)):
            with Image.open(source) as im:
                return im.convert("RGB")
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:  # unreadable, bad base64, corrupt
        raise DataError("image", str(source)[:120], f"cannot be read as an image ({exc})",
                        "check that the file exists and is a valid PNG/JPEG") from exc
    raise DataError("image", type(source).__name__, "unsupported image value",
                    "pass a PIL image, a file path, bytes or a data: URL")


def image_to_data_url(source: Any, fmt: str = "PNG") -> str:
    """Encode an image as ``data:image/png;base64,...`` for OpenAI-compatible servers."""
    if isinstance(source, str) and source.startswith("data:"):
        return source
    img = load_image(source)
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()
