"""User-error types: mistakes the CLI reports as one line, without a traceback."""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

from ..checkpoint import CheckpointError
from ..data.errors import DataError

__all__ = ["ConfigError", "NonFiniteError", "TrainingDivergedError", "USER_ERRORS", "is_signature_error",
           "model_arguments_checked"]


class ConfigError(ValueError):
    """A setting, flag or config file that cannot be used as given."""


class NonFiniteError(RuntimeError):
    """A model's outputs or loss that are not finite numbers: no result is reported (one line, exit 1)."""


class TrainingDivergedError(NonFiniteError):
    """The loss became NaN or infinite: the run stops before the update, keeping its last good checkpoint."""


USER_ERRORS: tuple[type[Exception], ...] = (ConfigError, DataError, CheckpointError)

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
        raise ConfigError(f"{what} does not take the model arguments {dict(kwargs)}: {exc}; check --model-kwargs"
                          f"{hint}") from exc
    except (ValueError, AssertionError) as exc:  # timm checks some arguments with asserts (num_heads | embed_dim)
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
        raise ConfigError(f"cannot build {what} with model arguments {dict(kwargs)}: {detail}; check "
                          f"--model-kwargs{hint}") from exc
