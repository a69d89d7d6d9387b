"""The three MoCo Rubric roles' prompts and target replies (paper appendix A.1): Policy, Generator, Judge.

One definition for every place that asks a role something: the shared multi-role SFT
(``captionrl.train.moco_sft``) trains on these prompts, and the RL recipe (``judges.online_rubric``,
``train.moco``) asks its Generator and Judge with the very same ones, so a role is asked exactly what it
learnt. The replies are JSON: the Generator's rubric ``[{criterion, test, weight}]`` and the Judge's
``[{id, reason, decision}]``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

POLICY_INSTRUCTION = (
    "Describe this image in detail. Write one flowing plain-text description (no lists, headings or "
    "markdown) that covers the objects and their attributes, counts, positions and relations, the "
    "setting, and any visible text, stating only what the image shows."
)
GENERATOR_INSTRUCTION = (
    "You write grading rubrics for detailed image captions. The image is the authoritative evidence; "
    "the two reference captions are a quality anchor and may miss details; the candidate captions come "
    "from the captioner being trained. Write binary criteria that are verifiable from the image and "
    "that separate better candidates from worse ones. Prioritise reliable and important differences; "
    "keep precise facts (counts, colours, positions, text) when they matter; avoid uncertain, "
    "incidental, overlapping or trivially easy criteria. Give each criterion a test a reader can check "
    "from a caption alone and a positive weight (1 minor, 2 important, 3 critical). Reply with JSON "
    'only: [{"criterion": "...", "test": "...", "weight": 1}, ...]'
)
JUDGE_INSTRUCTION = (
    "You judge a caption against a rubric written from the image, which you do not see. For each rubric "
    "item, decide whether the caption satisfies it, judging only that item's criterion; accept "
    "semantically equivalent wording; do not penalise style, fluency, grammar or length unless the item "
    "asks for them. Reply with JSON only, one entry per item in order: "
    '[{"id": 1, "reason": "...", "decision": "yes"}, ...] with decision "yes" or "no".'
)


def _image_content(text: str, image: Any, image_text: str | None, with_images: bool) -> str | list[dict[str, Any]]:
    """The user turn of an image role: an image placeholder for VLMs, its text rendering otherwise."""
    if with_images:
        return [{"type": "image"}, {"type": "text", "text": text}]
    if image_text:
        return f"Image (described in text): {image_text}\n\n{text}"
    return text


def policy_messages(image: Any = None, image_text: str | None = None, *, with_images: bool = False,
                    instruction: str = POLICY_INSTRUCTION) -> list[dict[str, Any]]:
    """Policy prompt (A.1.1): the image and the instruction only, as at inference time."""
    return [{"role": "user", "content": _image_content(instruction, image, image_text, with_images)}]


def generator_messages(references: Sequence[str], candidates: Sequence[str], image: Any = None,
                       image_text: str | None = None, *, with_images: bool = False) -> list[dict[str, Any]]:
    """Generator prompt (A.1.2): image + two references + the current Policy's candidate captions."""
    parts = [GENERATOR_INSTRUCTION, ""]
    parts += [f"Reference caption {i}: {r}" for i, r in enumerate(references, 1)]
    parts += [f"Candidate caption {i}: {c}" for i, c in enumerate(candidates, 1)]
    return [{"role": "user", "content": _image_content("\n".join(parts), image, image_text, with_images)}]


def judge_messages(rubric: Sequence[Mapping[str, Any]], caption: str) -> list[dict[str, Any]]:
    """Judge prompt (A.1.3): the rubric and the caption; text only (the Judge never sees the image)."""
    lines = [JUDGE_INSTRUCTION, "", "Rubric:"]
    for i, item in enumerate(rubric, 1):
        test = f" Test: {item['test']}" if item.get("test") else ""  # always set in validated rubrics
        lines.append(f"{i}. {item['criterion']}.{test} (weight {item.get('weight', 1)})")
    lines += ["", f"Caption: {caption}"]
    return [{"role": "user", "content": "\n".join(lines)}]


def rubric_json(rubric: Sequence[Mapping[str, Any]]) -> str:
    """The Generator's target reply."""
    return json.dumps(list(rubric), ensure_ascii=False)


def judgment_json(decisions: Sequence[Mapping[str, Any]]) -> str:
    """The Judge's target reply: ``[{"id", "reason", "decision"}]`` in rubric order."""
    return json.dumps([{"id": i, "reason": d.get("reason", ""), "decision": d["decision"]}
                       for i, d in enumerate(decisions, 1)], ensure_ascii=False)


# ---------------------------------------------------------------------- constrained decoding
STRUCTURED_OUTPUTS = ("none", "json_schema", "json_object")
"""How a server is asked to constrain a role's reply to its JSON schema: ``json_schema`` is the OpenAI /
vLLM form (``{"type": "json_schema", "json_schema": {"name", "schema"}}``), ``json_object`` the llama.cpp
form (``{"type": "json_object", "schema": ...}``); ``none`` sends nothing. Constraining only helps a
teacher hit the format: every reply is still schema-checked by the same parsers as an unconstrained one."""


TEXT_CHARS = "[A-Za-z0-9 ,.;:!?'()/%&+-]"
"""The characters a constrained criterion, test or reason may use: plain text, no quotes, backslashes or
control characters, so a reply needs no escapes and every criterion reads as text (a weak model under a
schema that allows any character writes raw control bytes, which JSON forbids, or ``"???"`` placeholders)."""


MAX_REPEAT = 128
"""The largest ``{m,n}`` bound one repetition in a pattern may carry: xgrammar 0.2.7 (the version vLLM 0.31
pins, so the GPU install's, in process and in ``vllm serve``'s guided decoding) fails to compile a
repetition bounded above 128 ("Check failed: per_rule_fsm_hashes"); 0.2.9 compiles it. A longer bound is
written as consecutive repetitions of at most 128, which match exactly the same strings."""


def repeat(chars: str, lo: int, hi: int) -> str:
    """The regex for ``lo..hi`` characters of the class ``chars``, each repetition bounded by ``MAX_REPEAT``."""
    parts = []
    while True:
        size = min(hi, MAX_REPEAT)
        low = min(lo, size)
        parts.append(f"{chars}{{{low},{size}}}")
        lo, hi = lo - low, hi - size
        if hi <= 0:
            return "".join(parts)


def text_schema(min_chars: int, max_chars: int, *, letter_first: bool = True) -> dict[str, Any]:
    """A bounded plain-text string (``TEXT_CHARS``); ``letter_first`` rules out placeholders such as
    ``"..."``. The bounds live in the pattern alone: grammar engines (xgrammar, llama.cpp) ignore
    minLength/maxLength next to a pattern, and a bound is what lets a weak model's string end."""
    head, rest = ("[A-Za-z]", max(0, min_chars - 1)) if letter_first else ("", min_chars)
    tail = max_chars - (1 if letter_first else 0)
    return {"type": "string", "pattern": f"^{head}{repeat(TEXT_CHARS, rest, tail)}$"}


def rubric_schema(min_items: int, max_items: int, max_chars: int = 160) -> dict[str, Any]:
    """JSON schema of the Generator's reply: ``min_items..max_items`` of ``{criterion, test, weight 1|2|3}``,
    criterion and test plain text of 3..``max_chars`` characters starting with a letter."""
    text = text_schema(3, max_chars)
    return {"type": "array", "minItems": min_items, "maxItems": max_items,
            "items": {"type": "object", "properties": {"criterion": text, "test": text,
                                                       "weight": {"type": "integer", "enum": [1, 2, 3]}},
                      "required": ["criterion", "test", "weight"], "additionalProperties": False}}


def judgment_schema(n_items: int, max_chars: int = 100) -> dict[str, Any]:
    """JSON schema of the Judge's reply: exactly one ``{id, reason, decision yes|no}`` per rubric item, in
    rubric order (item k has ``id`` k: ``prefixItems`` with a ``const`` id, so a constrained Judge cannot
    repeat or skip an id, which ``parse_judge_reply`` would reject); the reason comes before the decision."""

    def item(k: int) -> dict[str, Any]:
        return {"type": "object", "properties": {"id": {"type": "integer", "const": k},
                                                 "reason": text_schema(0, max_chars, letter_first=False),
                                                 "decision": {"type": "string", "enum": ["yes", "no"]}},
                "required": ["id", "reason", "decision"], "additionalProperties": False}

    return {"type": "array", "minItems": n_items, "maxItems": n_items,
            "prefixItems": [item(k) for k in range(1, n_items + 1)], "items": False}


def response_format(schema: dict[str, Any], style: str) -> dict[str, Any] | None:
    """The ``response_format`` a server of ``style`` (``STRUCTURED_OUTPUTS``) needs for ``schema``."""
    if style == "none":
        return None
    if style == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
    if style == "json_object":
        return {"type": "json_object", "schema": schema}
    from captionrl.errors import ConfigError

    raise ConfigError("structured_output", style, "unknown style", f"use one of {', '.join(STRUCTURED_OUTPUTS)}")


def structured(schema: dict[str, Any], style: str = "none") -> dict[str, Any]:
    """``ChatRequest`` keywords of a JSON role: the schema itself (in-process backends decode under it:
    ``backends.structured``) and the ``response_format`` a server of ``style`` needs for it. One call per
    role, so the served and the in-process paths constrain a reply to the same schema."""
    return {"json_schema": schema, "response_format": response_format(schema, style)}
