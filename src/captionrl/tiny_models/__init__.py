"""Tiny, randomly initialised models of the papers' own architectures, built offline on first use.

A user feature, not a test fixture: ``policy.model=tiny-vlm`` (SmolVLM-shaped), ``tiny-qwen2.5-vl`` and
``tiny-qwen3-vl`` rehearse a GPU recipe on CPU through every stage with the family's real processor,
chat template and special tokens (the "rehearse before scale" contract); the tests use them for the same
reason. They write random tokens: proofs that every joint works, not captioners. The ``hf`` backend
resolves the names (``captionrl.backends.hf.resolve_model_path``); a GPU only adds scale.
"""

from captionrl.tiny_models.qwen_vl import FAMILIES, tiny_qwen_vl_dir
from captionrl.tiny_models.vlm import tiny_vlm_dir

__all__ = ["FAMILIES", "tiny_qwen_vl_dir", "tiny_vlm_dir"]
