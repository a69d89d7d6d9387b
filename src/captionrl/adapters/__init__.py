"""Thin adapters that let other RL engines (verl, OpenRLHF) call captionrl's rewards."""
