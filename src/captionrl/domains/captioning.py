"""The captioner's prompts, for a series and for an image: one definition shared by training,
``captionrl caption``, rubric building and evaluation."""

from __future__ import annotations

from typing import Any

from captionrl.backends.base import Message

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


def caption_messages(numbers_text: str, n: int, image: Any = None) -> list[Message]:
    """Chat messages asking a captioner to describe a series.

    Language-only policies read the values printed as text; vision-language policies get the chart image
    (``image``), as in the paper's setup, and the numbers are left out.
    """
    if image is not None:
        return [
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": image},
                    {"type": "text", "text": f"The chart shows a time series of {n} values. {CAPTION_INSTRUCTION}"},
                ],
            }
        ]
    return [{"role": "user", "content": f"Time series of {n} values:\n{numbers_text}\n\n{CAPTION_INSTRUCTION}"}]


def image_caption_messages(instruction: str = IMAGE_CAPTION_INSTRUCTION) -> list[Message]:
    """Chat prompt with an image placeholder; TRL fills it from the dataset's ``image`` column."""
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": instruction}]}]
