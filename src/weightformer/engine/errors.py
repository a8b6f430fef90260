"""User-error types: mistakes the CLI reports as one line, without a traceback."""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

from ..checkpoint import CheckpointError
from ..data.errors import DataError

__all__ = ["ConfigError", "TrainingDivergedError", "USER_ERRORS", "brief", "is_signature_error",
           "model_arguments_checked"]


class ConfigError(ValueError):
    """A setting, flag or config file that cannot be used as given."""


class TrainingDivergedError(RuntimeError):
    """The loss became NaN or infinite: the run stops before the update, keeping its last good checkpoint."""


USER_ERRORS: tuple[type[Exception], ...] = (ConfigError, DataError, CheckpointError)


def brief(value: Any, limit: int = 200) -> str:
    """``repr(value)`` for a message, cut to ``limit`` characters with an ellipsis: a user's value never
    crowds out the rest of the line."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 1]}…"

# The TypeError Python raises when a call's keywords do not fit the signature (not one from inside the model).
_SIGNATURE_ERROR = re.compile(r"unexpected keyword argument|multiple values for (keyword )?argument")


def is_signature_error(exc: TypeError) -> bool:
    """Whether ``exc`` says a call's keywords do not fit the callee (bad ``--model-kwargs``), not a bug inside it."""
    return bool(_SIGNATURE_ERROR.search(str(exc)))


@contextmanager
def model_arguments_checked(what: str, kwargs: Mapping[str, Any], hint: str = "") -> Iterator[None]:
    """Build a model inside this block: a builder's refusal of the user's model kwargs (a keyword it does not
    take, a value it refuses) becomes one ConfigError naming ``what`` and the kwargs, ``hint`` (what the kwargs
    may hold) after it; any other TypeError is a bug and keeps its traceback."""
    try:
        yield
    except TypeError as exc:
        if not is_signature_error(exc):
            raise
        raise ConfigError(f"{what} does not take the model arguments {brief(dict(kwargs))}: {exc}; check --model-kwargs"
                          f"{hint}") from exc
    except (ValueError, AssertionError) as exc:  # timm checks some arguments with asserts (num_heads | embed_dim)
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
        raise ConfigError(f"cannot build {what} with model arguments {brief(dict(kwargs))}: {detail}; check "
                          f"--model-kwargs{hint}") from exc
