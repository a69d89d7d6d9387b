"""The run machinery every training recipe shares: the skeleton of steps, the run folder, the checks before
any load, the policy, TRL's trainer and captionrl's patches of it, callbacks, logs, timing and curves."""
