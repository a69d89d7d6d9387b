"""Judges turn (item, caption) into a ``Judgment``; the same code scores rewards and evaluations."""
