"""What a paper preset (written for GPUs) needs to run on this CPU, in one place.

The ``*-paper.yaml`` presets compute in bf16 and generate their rollouts with vLLM; a CPU run refuses
vLLM before the policy loads (``train/run/gpu_checks.py``). Every rehearsal of a preset on CPU switches these
off and nothing else, so the rest of the preset is what gets rehearsed.
"""

from __future__ import annotations

ON_CPU = ("train.use_cpu=true", "train.bf16=false", "train.use_vllm=false")
