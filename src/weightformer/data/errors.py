"""The data package's user-facing error type."""

from __future__ import annotations

__all__ = ["DataError"]


class DataError(ValueError):
    """A data set the user pointed at cannot be used: missing, empty, or inconsistent splits."""
