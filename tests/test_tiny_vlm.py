"""The tiny VLM fixture: built locally, loaded by HFBackend like any HF VLM, sees images, trainable."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_backend():
    from captionrl.backends.hf import HFBackend
    from captionrl.tiny_models import tiny_vlm_dir

    backend = HFBackend(str(tiny_vlm_dir()), batch_size=4, dtype="float32")  # exact comparisons below
    backend._ensure_loaded()
    return backend


def _msgs(image, text="Describe this image."):
    return [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": text}]}]


def test_fixture_folder_is_a_vlm_with_smollm2_text_weights(tiny_backend):
    import torch
    from transformers import ProcessorMixin

    from captionrl.tiny_models import tiny_vlm_dir

    folder = tiny_vlm_dir()
    cfg = json.loads((folder / "config.json").read_text())
    assert "vision_config" in cfg and cfg["architectures"] == ["Idefics3ForConditionalGeneration"]
    assert "NOT a model" in json.loads((folder / "captionrl_fixture.json").read_text())["fixture"]
    assert isinstance(tiny_backend._processor, ProcessorMixin) and tiny_backend._is_vlm()
    from transformers import AutoModelForCausalLM

    from captionrl.embedded import embedded_model_dir

    text = AutoModelForCausalLM.from_pretrained(embedded_model_dir())
    ours = tiny_backend.model.model.text_model
    ref = text.model
    assert torch.equal(ours.layers[5].mlp.down_proj.weight, ref.layers[5].mlp.down_proj.weight)
    n_old = ref.embed_tokens.weight.shape[0]
    assert torch.equal(ours.embed_tokens.weight[:n_old], ref.embed_tokens.weight)


def test_generate_with_images_in_chat_messages(tiny_backend):
    from captionrl.backends.base import ChatRequest
    from captionrl.domains.scenes import make_scene

    red, blue = make_scene(0).render(), make_scene(5).render()
    text_only = [{"role": "user", "content": "What is the capital of France?"}]
    reqs = [ChatRequest(_msgs(red), max_new_tokens=12), ChatRequest(_msgs(blue), max_new_tokens=12),
            ChatRequest(text_only, max_new_tokens=12)]
    out = tiny_backend.generate(reqs)
    assert all(g.error is None and g.text for g in out), out
    assert "Paris" in out[2].text  # the real SmolLM2 text weights answer in a mixed batch
    alone = tiny_backend.generate([reqs[1]])[0]
    assert alone.text == out[1].text  # batching (padding, image lists) does not change a reply


def test_pixels_reach_the_language_model_and_vision_tower_is_trainable(tiny_backend):
    import torch

    from captionrl.domains.scenes import make_scene

    proc, model = tiny_backend._processor, tiny_backend.model
    prompts = [tiny_backend.render_chat(_msgs(None))] * 2
    enc = proc(text=prompts, images=[[make_scene(0).render()], [make_scene(5).render()]], return_tensors="pt",
               padding=True)
    with torch.no_grad():
        logits = model(**enc).logits[:, -1]
    assert not torch.allclose(logits[0], logits[1])  # different images, different next-token logits
    model.train()
    try:
        loss = model(**enc, labels=enc["input_ids"]).loss
        loss.backward()
        grad = model.model.vision_model.embeddings.patch_embedding.weight.grad
        assert grad is not None and grad.abs().sum() > 0
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()
