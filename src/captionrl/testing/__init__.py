"""Test fixtures that ship with captionrl (tiny models, synthetic data). Fixtures, not models."""

from captionrl.testing.tiny_vlm import tiny_vlm_dir

__all__ = ["tiny_vlm_dir"]
