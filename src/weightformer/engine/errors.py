"""User-error types: mistakes the CLI reports as one line, without a traceback."""

from __future__ import annotations

import re

from ..checkpoint import CheckpointError
from ..data.errors import DataError

__all__ = ["ConfigError", "TrainingDivergedError", "USER_ERRORS", "is_signature_error"]


class ConfigError(ValueError):
    """A setting, flag or config file that cannot be used as given."""


class TrainingDivergedError(RuntimeError):
    """The loss became NaN or infinite: the run stops before the update, keeping its last good checkpoint."""


USER_ERRORS: tuple[type[Exception], ...] = (ConfigError, DataError, CheckpointError)

# The TypeError Python raises when a call's keywords do not fit the signature (not one from inside the model).
_SIGNATURE_ERROR = re.compile(r"unexpected keyword argument|multiple values for (keyword )?argument")


def is_signature_error(exc: TypeError) -> bool:
    """Whether ``exc`` says a call's keywords do not fit the callee (a user's bad ``--model-kwargs``),
    rather than a TypeError raised inside it (a bug)."""
    return bool(_SIGNATURE_ERROR.search(str(exc)))
