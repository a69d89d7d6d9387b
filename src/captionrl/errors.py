"""The exception hierarchy.

Every error raised on user input names the field, the value that was given and the fix, so a user can
correct a config or a data file without reading our source. Infrastructure failures of a model call are
*not* raised at the reward level: they become unscored judgments (``None``), see ``captionrl.types``.

Which failures are "infrastructure" is decided here, narrowly (``ModelCallError``): out of memory (after one
retry at a smaller batch), a dead inference engine, a transport failure. Backends raise it internally and
turn it into an unscored result; any other exception (a shape bug, a ``KeyError`` in a judge) is ours and
propagates with its traceback, because a bug scored as "unscored" is a run that learns nothing and ends green.
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


class ModelCallError(BackendError):
    """One model call failed for a reason outside our code: the affected samples are unscored, not 0.

    Raised (and caught) inside backends and judges that run a model themselves; ``captionrl.backends.base.
    as_model_failure`` decides which exceptions of a model library count as such a failure."""


class ModelOutOfMemoryError(ModelCallError):
    """The model ran out of memory, also after one retry at a smaller batch."""


class EngineError(ModelCallError):
    """The inference engine (vLLM's engine process, a CUDA context) died or refused the call."""


class InputTooLongError(DataError):
    """A text is longer than the model's context: caught before any forward pass (it would OOM or be cut)."""


class RewardLostError(CaptionRLError):
    """A training run stopped because its reward was gone (unscored, or replaced by fallbacks) for too long.

    The message is one line: which judge, what share for how many steps, the last error, where the
    checkpoint is and how to resume."""
