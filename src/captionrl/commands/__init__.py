"""Small CLI commands that belong to no protocol (``models``, ``caption``)."""
