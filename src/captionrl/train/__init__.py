"""Training recipes on TRL. The only package that imports ``trl``."""
