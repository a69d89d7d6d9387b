"""The exception hierarchy.

Every error raised on user input names the field, the value that was given and the fix, so a user can
correct a config or a data file without reading our source. Infrastructure failures of a model call are
*not* raised at the reward level: they become unscored judgments (``None``), see ``captionrl.types``.
"""

from __future__ import annotations

from typing import Any


class CaptionRLError(Exception):
    """Base class of every error captionrl raises on purpose."""


def _describe(field: str, value: Any, problem: str, fix: str) -> str:
    shown = repr(value)
    if len(shown) > 200:
        shown = shown[:197] + "..."
    return f"{field}={shown}: {problem}. Fix: {fix}"


class UserInputError(CaptionRLError, ValueError):
    """Bad user input: the message always says field, value and fix."""

    def __init__(self, field: str, value: Any, problem: str, fix: str) -> None:
        self.field = field
        self.value = value
        self.problem = problem
        self.fix = fix
        super().__init__(_describe(field, value, problem, fix))


class ConfigError(UserInputError):
    """A configuration value (YAML, override or argument) is invalid or inconsistent."""


class DataError(UserInputError):
    """A data item (series, image, caption file, manifest) is invalid."""


class BackendError(CaptionRLError):
    """A backend cannot be built or used as asked (missing package, server feature, model file)."""


class ModelCallsForbiddenError(BackendError):
    """Raised when ``CAPTIONRL_FORBID_MODEL_CALLS`` is set and code tries to call a real model."""
