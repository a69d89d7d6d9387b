"""Test fixtures that ship with captionrl: ``tiny_llama``, the tiny policy of the training-mechanics tests.

The tiny models of the papers' architectures (``tiny-vlm``, ``tiny-qwen2.5-vl``, ``tiny-qwen3-vl``) are a
user feature (CPU rehearsals of the GPU recipes) and live in ``captionrl.tiny_models``.
"""
