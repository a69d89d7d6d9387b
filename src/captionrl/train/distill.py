"""``captionrl train sft``: SFT distillation from a teacher's captions (a baseline of all three papers).

The recipe is ``train/sft.py``'s; this module only gives the command its own default (``recipe=sft``)."""

from captionrl.train.sft import DistillRunConfig, run_command

CONFIG = DistillRunConfig

__all__ = ["CONFIG", "run_command"]
