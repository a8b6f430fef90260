"""Safe checkpoint I/O: loading never runs pickled code, saving never leaves a half-written file."""

from __future__ import annotations

import os
import pickle
from collections import OrderedDict
from pathlib import Path
from typing import Any, Mapping

from .atomic import write_atomic

__all__ = ["CheckpointError", "load_checkpoint_file", "release_pickle_globals", "save_atomic", "strip_wrapper_prefixes"]


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read safely or does not fit the model."""


# The authors' training checkpoints pickle their yacs ``CfgNode`` config: read as a plain OrderedDict, inside our
# own loaders only (never process-wide), without importing yacs or running any code.
_RELEASE_PICKLE_GLOBALS = [(OrderedDict, "yacs.config.CfgNode")]


def release_pickle_globals():
    """Context in which ``torch.load(weights_only=True)`` also reads the release's pickled yacs config."""
    import torch

    return torch.serialization.safe_globals(_RELEASE_PICKLE_GLOBALS)


def strip_wrapper_prefixes(state: Mapping[str, Any]) -> dict[str, Any]:
    """Drop the ``module.`` (DDP) and ``_orig_mod.`` (torch.compile) prefixes of wrapped models' keys."""
    out = {}
    for key, value in state.items():
        for prefix in ("module.", "_orig_mod."):
            key = key.removeprefix(prefix)
        out[key] = value
    return out


def load_checkpoint_file(path: str | os.PathLike) -> dict[str, Any]:
    """Load a ``.safetensors`` file or a ``.pt``/``.pth`` with ``torch.load(weights_only=True)``; a
    :class:`CheckpointError` naming the file when it is missing, no checkpoint, or needs code to unpickle."""
    import torch
    from safetensors.torch import load_file as load_safetensors

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist; check the path")
    if path.suffix == ".safetensors":
        try:
            return load_safetensors(str(path), device="cpu")
        except Exception as exc:  # safetensors raises its own error types
            raise CheckpointError(f"{path} is not a readable safetensors file ({exc})") from exc
    try:
        with release_pickle_globals():
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        detail = _unpickling_detail(str(exc))
        if not detail.startswith("GLOBAL"):
            raise CheckpointError(f"{path} is not a readable PyTorch checkpoint ({detail})") from exc
        raise CheckpointError(
            f"refused to load {path}: it holds pickled objects other than tensors and plain data "
            f"({detail}). Only load checkpoints you trust; convert it to safetensors if it is yours"
        ) from exc
    except (RuntimeError, EOFError, OSError, KeyError, IndexError, ValueError, TypeError, AttributeError,
            MemoryError) as exc:
        # What torch's legacy unpickler raises on bytes that are no pickle stream (a text file: KeyError, ...)
        detail = str(exc).strip() or type(exc).__name__
        raise CheckpointError(f"{path} is not a readable PyTorch checkpoint ({type(exc).__name__}: {detail[:120]}); "
                              f"pass a .pt/.pth written by torch.save, or a .safetensors file") from exc


def _unpickling_detail(message: str) -> str:
    """The line of torch's ``weights_only`` error that says what was found, without its boilerplate."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    for line in lines:  # e.g. "WeightsUnpickler error: Unsupported global: GLOBAL io.open was not ..."
        if "GLOBAL" in line:
            return line[line.index("GLOBAL"):].split(". ")[0]
    boilerplate = ("Weights only load failed", "Please file an issue", "Check the documentation", "Re-running", "(")
    useful = [line for line in lines if not line.startswith(boilerplate)]
    return (useful or lines or ["unknown unpickling error"])[0].removeprefix("WeightsUnpickler error: ")


def save_atomic(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` ``obj`` to ``path`` in one step (:func:`weightformer.atomic.write_atomic`)."""
    import torch

    write_atomic(path, lambda f: torch.save(obj, f))
