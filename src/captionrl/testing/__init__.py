"""Test fixtures that ship with captionrl (tiny models, synthetic data). Fixtures, not models."""

from captionrl.testing.tiny_qwen_vl import tiny_qwen_vl_dir
from captionrl.testing.tiny_vlm import tiny_vlm_dir

__all__ = ["tiny_qwen_vl_dir", "tiny_vlm_dir"]
