"""The caption inside an engine's text: what the service and the OpenRLHF adapter cut away before judging.

OpenRLHF 0.11 sends ``query`` = ``hf_tokenizer.decode(prompt + response tokens, skip_special_tokens=False)``
(``openrlhf/utils/agent.py``), so the response's end-of-turn token arrives as text (``<|im_end|>``) and a
judge would read it as words of the caption (CIDEr-D counts "im" and "end"). verl decodes the response
alone with ``skip_special_tokens=True`` and needs none of this.
"""

from __future__ import annotations

from collections.abc import Sequence

END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>", "<|end|>")
"""End-of-turn texts of the common chat templates (ChatML/Qwen/SmolLM, GPT-2, Llama 3, Llama 2, Phi-3)."""


def strip_end(text: str, suffixes: Sequence[str] = END_OF_TURN) -> str:
    """``text`` without its trailing end-of-turn markers (repeated, any order) and the whitespace before
    them; unchanged when it ends with none."""
    out, changed = text, False
    while hit := next((m for m in suffixes if m and out.rstrip().endswith(m)), None):
        out, changed = out.rstrip()[: -len(hit)], True
    return out.rstrip() if changed else text
