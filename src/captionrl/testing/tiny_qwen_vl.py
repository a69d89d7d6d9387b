"""Moved to ``captionrl.tiny_models.qwen_vl`` (a user feature, not a fixture).

Kept only because ``tests/test_deepspeed_rehearsal.py`` and ``tests/test_gpu_smoke.py`` still import
``tiny_qwen_vl_dir`` from here; delete this file once they import it from ``captionrl.tiny_models``.
"""

from captionrl.tiny_models.qwen_vl import tiny_qwen_vl_dir

__all__ = ["tiny_qwen_vl_dir"]
