"""The captioner's prompts, for a series and for an image, and captioning a set of series with them: one
definition shared by training, ``captionrl caption``, rubric building and evaluation."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from captionrl.backends.base import Backend, ChatRequest, Message
from captionrl.records import RecordWriter
from captionrl.types import Series

CAPTION_INSTRUCTION = (
    "Describe this time series in a short paragraph for someone who cannot see it: the overall trend, "
    "the key values with their positions (start, end, maximum, minimum) and any notable events."
)
"""What a series captioner is asked (LineupRL's policy, the describer baseline, evaluations)."""

IMAGE_CAPTION_INSTRUCTION = (
    "Describe this image in detail. Write one flowing plain-text paragraph that covers the objects, their "
    "colours, counts and positions, and any visible text."
)
"""What an image captioner is asked (RubiCap's policy, the rubric committee's teachers)."""


def caption_messages(numbers_text: str, n: int, image: Any = None, instruction: str | None = None) -> list[Message]:
    """Chat messages asking a captioner to describe a series.

    Language-only policies read the values printed as text; vision-language policies get the chart image
    (``image``), as in the paper's setup, and the numbers are left out. ``instruction`` replaces the
    default ``CAPTION_INSTRUCTION`` (a short-answer instruction lets a small model finish within budget).
    """
    instruction = instruction or CAPTION_INSTRUCTION
    if image is not None:
        return [
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": image},
                    {"type": "text", "text": f"The chart shows a time series of {n} values. {instruction}"},
                ],
            }
        ]
    return [{"role": "user", "content": f"Time series of {n} values:\n{numbers_text}\n\n{instruction}"}]


def image_caption_messages(instruction: str = IMAGE_CAPTION_INSTRUCTION) -> list[Message]:
    """Chat prompt with an image placeholder; TRL fills it from the dataset's ``image`` column."""
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": instruction}]}]


DESCRIBER = "describer"


def series_caption_messages(values: Any, *, chart: bool = False, precision: int = 2, normalise: str | None = None,
                            instruction: str | None = None, chart_size: Any = (448, 448)) -> list[Message]:
    """The prompt a captioner trained by LineupRL saw for one series: the rendered chart for a VLM policy
    (``policy.input: chart``, as ``lineup_data.add_charts`` builds it), the printed numbers otherwise (as
    ``lineup_data.lineup_row`` builds it); one function so ``captionrl caption`` asks what training asked."""
    import numpy as np

    from captionrl.domains.timeseries import render_chart, render_numbers

    arr = np.asarray(values, dtype=float)
    if chart:
        size = (int(chart_size[0]), int(chart_size[1]))  # as training drew it (data.chart_size)
        return caption_messages("", len(arr), image=render_chart(arr, size=size), instruction=instruction)
    text, _ = render_numbers(arr, precision=precision, normalise=normalise)  # type: ignore[arg-type]
    return caption_messages(text, len(arr), instruction=instruction)


def caption_series(
    items: Sequence[Series],
    captioner: Backend | str,
    out_path: str | Path,
    *,
    precision: int = 2,
    max_new_tokens: int = 96,
    temperature: float = 0.0,
    seed: int = 0,
    batch: int = 8,
    chart: bool = False,
    normalise: str | None = None,
    instruction: str | None = None,
    extra: dict[str, Any] | None = None,
    chart_size: Any = (448, 448),
) -> dict[str, str]:
    """Caption ``items`` (resumable JSONL at ``out_path``: ids already there are skipped, failures are
    retried on the next run); ``captioner="describer"`` needs no model. ``chart``/``normalise``/
    ``instruction`` choose the prompt (``series_caption_messages``); ``extra`` fields go into every record
    (which captioner, which input), so a file says how it was made."""
    from tqdm.auto import tqdm

    from captionrl.domains.describe import describe_series

    writer = RecordWriter(out_path, key_field="id")
    todo = [it for it in items if not writer.has(it.id)]
    with tqdm(total=len(items), initial=len(items) - len(todo), desc="caption", unit="item") as bar:
        for start in range(0, len(todo), batch):
            chunk = todo[start : start + batch]
            if captioner == DESCRIBER:
                texts: list[str | None] = [describe_series(it, precision) for it in chunk]
                errors: list[str | None] = [None] * len(chunk)
            else:
                assert not isinstance(captioner, str)
                reqs = [
                    ChatRequest(series_caption_messages(it.values, chart=chart, precision=precision, normalise=normalise,
                                                        instruction=instruction, chart_size=chart_size),
                                max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
                    for it in chunk
                ]
                gens = captioner.generate(reqs)
                texts, errors = [g.text for g in gens], [g.error for g in gens]
            for it, text, err in zip(chunk, texts, errors, strict=True):
                if text is None:  # a failed request is retried on the next run, not stored as empty
                    tqdm.write(f"caption failed for {it.id}: {err}")
                    continue
                rec = {"id": it.id, "series": it.values.tolist(), "caption": text.strip(), "domain": it.domain}
                if it.meta.get("next") is not None:
                    rec["next"] = [float(v) for v in it.meta["next"]]
                writer.write({**rec, **(extra or {})})
            bar.update(len(chunk))
    writer.close()
    return {r["id"]: r["caption"] for r in writer.records()}
