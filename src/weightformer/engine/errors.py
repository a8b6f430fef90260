"""User-error types: mistakes the CLI reports as one line, without a traceback."""

from __future__ import annotations

from ..checkpoint import CheckpointError
from ..data.errors import DataError

__all__ = ["ConfigError", "USER_ERRORS"]


class ConfigError(ValueError):
    """A setting, flag or config file that cannot be used as given."""


USER_ERRORS: tuple[type[Exception], ...] = (ConfigError, DataError, CheckpointError)
