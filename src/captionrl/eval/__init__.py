"""Evaluation protocols: one file each, ``run(config) -> Report`` (records, tables, plots)."""
