"""WeightFormer: linear-time global visual modelling with input-predicted weights instead of attention.

Importing the package registers ``weightformer_tiny``, ``_small`` and ``_base`` with timm. Started as the
``weightformer`` command (its console script or ``python -m weightformer``), it imports no models here, so that
``--help`` needs no torch; each subcommand registers them once its work starts. Other names are imported on
first use.
"""

from __future__ import annotations

import os
import re
import sys

from .lazy import lazy_exports

__version__ = "0.1.0"
__all__ = ["DynamicDWConv", "DynamicLinear", "WeightFormer", "attention_as_mlp", "__version__"]


__getattr__, __dir__ = lazy_exports(__name__, {
    "DynamicDWConv": "layers", "DynamicLinear": "layers", "attention_as_mlp": "layers", "WeightFormer": "models",
})


def _module_run_by_python() -> str:
    """The module named by ``-m`` in :data:`sys.orig_argv` (short options may be grouped, as in ``-Om``)."""
    args = iter(sys.orig_argv[1:])
    for arg in args:
        if not arg.startswith("-") or arg.startswith("--"):
            continue  # a long option takes no argument that could be "-m" (--check-hash-based-pycs's is a word)
        for i, letter in enumerate(arg[1:], start=2):
            if letter in "cmWX":
                value = arg[i:] or next(args, "")
                if letter == "m":
                    return value
                break
    return ""


def _started_as_command() -> bool:
    """Whether this interpreter was started as the ``weightformer`` command (or its .exe/-script.py)."""
    program = sys.argv[0] if sys.argv else ""
    if program == "-m":  # python -m weightformer: runpy imports the package before it sets sys.argv[0]
        return _module_run_by_python() == "weightformer"
    return re.sub(r"(-script\.pyw?|\.exe)$", "", os.path.basename(program)) == "weightformer"


# No torch here: the command line starts without it.
from . import tasks  # noqa: E402,F401  (registers the built-in tasks with the engine, by import path)

if not _started_as_command():
    from . import models  # noqa: F401  (registers the WeightFormer models with timm; imports torch)
