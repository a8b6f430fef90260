"""User-error types: mistakes the CLI reports as one line, without a traceback."""

from __future__ import annotations

from ..checkpoint import CheckpointError
from ..data.errors import DataError

__all__ = ["ConfigError", "TrainingDivergedError", "USER_ERRORS"]


class ConfigError(ValueError):
    """A setting, flag or config file that cannot be used as given."""



class TrainingDivergedError(RuntimeError):
    """The loss became NaN or infinite: the run stops before the update, keeping its last good checkpoint."""


USER_ERRORS: tuple[type[Exception], ...] = (ConfigError, DataError, CheckpointError)
