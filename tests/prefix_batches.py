"""Batches laid out as TRL lays them out, and TRL's own loss pass on them: shared by the shared-prompt tests in
one process (``test_shared_prefix.py``) and on two (``shared_prefix_ranks.py``, launched by
``test_shared_prefix_ranks.py``)."""

from __future__ import annotations

import types
from typing import Any

import torch

from captionrl.testing.trl_layout import trl_rows

PROMPTS = ["Describe this time series: 1.0, 2.5, 3.1, 2.2, 1.9, 4.4", "Describe: 7, 7, 8"]
COMPLETIONS = ["The series rises to 4.4 at the end.", "It peaks at 4.4.", "It falls then rises, ending at 4.4 after a dip.",
               "Flat.", "The values stay near 7 and end at 8.", "Seven, seven, eight.", "It ends higher.",
               "A small rise from 7 to 8 at the last step."]


def text_batch(tok: Any, prompts: list[str], completions: list[str], group: int) -> tuple[Any, Any, int]:
    """TRL's layout: prompts left-padded, completions right-padded, ``group`` rows per prompt."""
    p_ids = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)
             for p in prompts]
    p_ids = [list(x["input_ids"]) if isinstance(x, dict) or hasattr(x, "keys") else list(x) for x in p_ids]
    c_ids = [tok(c, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for c in completions]
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return trl_rows(p_ids, c_ids, group, pad)


def vlm_batch(proc: Any, prompts: list[str], images: list[tuple[int, int, int]], completions: list[str],
              ) -> tuple[Any, Any, int, dict[str, Any]]:
    """TRL's multimodal layout: the processor pads the prompts (left) and makes the pixel inputs; completions
    are right-padded and ``mm_token_type_ids`` extended with zeros over them (``RLOOTrainer._generate_and_score``).
    One prompt and one 56x56 image of colour ``images[r]`` per row."""
    from PIL import Image

    texts = [proc.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": p}]}],
                                      add_generation_prompt=True, tokenize=False) for p in prompts]
    pics = [[Image.new("RGB", (56, 56), colour)] for colour in images]
    enc = proc(images=pics, text=texts, padding=True, return_tensors="pt")
    tok = proc.tokenizer
    c_ids = [tok(c, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for c in completions]
    C = max(map(len, c_ids))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    rows = torch.tensor([c + [pad] * (C - len(c)) for c in c_ids])
    cmask = torch.tensor([[1] * len(c) + [0] * (C - len(c)) for c in c_ids])
    owner = torch.arange(len(completions))
    ids = torch.cat([enc["input_ids"][owner], rows], dim=1)
    mask = torch.cat([enc["attention_mask"][owner], cmask], dim=1)
    per_row = torch.split(enc["pixel_values"], [int(g.prod()) for g in enc["image_grid_thw"]])
    multimodal = {"pixel_values": torch.cat([per_row[o] for o in owner.tolist()]),
                  "image_grid_thw": enc["image_grid_thw"][owner], "num_images": [1] * len(completions)}
    if "mm_token_type_ids" in enc:
        mm = enc["mm_token_type_ids"][owner]
        multimodal["mm_token_type_ids"] = torch.cat([mm, mm.new_zeros(rows.shape)], dim=1)
    return ids, mask, C, multimodal


def trl_pass(model: Any, ids: Any, mask: Any, keep: int, accelerator: Any = None, **multimodal: Any) -> Any:
    """TRL's own ``RLOOTrainer._get_per_token_logps_and_entropies`` on ``model`` (the real function; its owner
    needs only an accelerator)."""
    from accelerate import Accelerator
    from trl import RLOOTrainer

    owner = types.SimpleNamespace(accelerator=accelerator if accelerator is not None else Accelerator(cpu=True))
    return RLOOTrainer._get_per_token_logps_and_entropies(owner, model, ids, mask, keep, compute_entropy=True,
                                                          **multimodal)
