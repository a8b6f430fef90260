"""The data package's user-facing error type."""

from __future__ import annotations

__all__ = ["DataError"]


class DataError(ValueError):
    """A data set the user pointed at cannot be used, in one line; torch's re-raise text from a DataLoader worker
    (``"Caught DataError in DataLoader worker process 0..."``) is cut back to the original message."""

    def __init__(self, *args: object):
        if args:
            args = (_original_message(args[0], type(self)), *args[1:])
        super().__init__(*args)


def _original_message(message: object, cls: type) -> object:
    """The message a worker's exception was raised with, if ``message`` is torch's re-raise text."""
    if not (isinstance(message, str) and message.startswith(f"Caught {cls.__name__} ")):
        return message
    header = f"\n{cls.__module__}.{cls.__qualname__}: "  # the last line of the worker's formatted traceback
    if "\nOriginal Traceback" not in message or header not in message:
        return message
    return message.rsplit(header, 1)[1].rstrip("\n")
