"""The tiny random policy of the training-mechanics tests: SmolLM2's tokenizer and config family, 2 layers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from captionrl.errors import ConfigError


def test_bad_recipe_is_named():
    from captionrl.testing.tiny_llama import tiny_llama_recipe

    with pytest.raises(ConfigError, match="heads"):
        tiny_llama_recipe(hidden=60, heads=8)


@pytest.mark.slow
def test_tiny_llama_keeps_the_embedded_tokenizer_and_is_reproducible(tiny_llama, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from captionrl.embedded import embedded_model_dir
    from captionrl.testing.tiny_llama import build_tiny_llama, tiny_llama_recipe

    folder = Path(tiny_llama)
    assert "NOT a model" in json.loads((folder / "captionrl_fixture.json").read_text())["fixture"]
    ours, real = AutoTokenizer.from_pretrained(folder), AutoTokenizer.from_pretrained(embedded_model_dir())
    msgs = [{"role": "user", "content": "Describe: 12, 15, 9."}]
    assert ours.get_vocab() == real.get_vocab() and ours.chat_template == real.chat_template
    assert ours.apply_chat_template(msgs, add_generation_prompt=True) == real.apply_chat_template(
        msgs, add_generation_prompt=True)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_hidden_layers == 2
    assert sum(p.numel() for p in model.parameters()) < 5_000_000  # 135M in the real model
    again = AutoModelForCausalLM.from_pretrained(build_tiny_llama(tmp_path / "again", tiny_llama_recipe()))
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), again.parameters(), strict=True))
