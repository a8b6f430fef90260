"""WeightFormer: linear-time global visual modelling with input-predicted weights instead of attention.

Importing the package registers ``weightformer_tiny``, ``weightformer_small`` and
``weightformer_base`` with timm, so ``timm.create_model("weightformer_tiny")`` works.

The ``weightformer`` command is the exception: its console script and ``python -m weightformer`` run
this file before the command line is parsed, and ``--help`` or a mistyped flag need neither torch nor
timm. Started as that command (a program file named ``weightformer``, ``weightformer.exe`` or
``weightformer-script.py``, or ``-m weightformer`` in :data:`sys.orig_argv`), the interpreter imports no
models here; every subcommand registers them once its work starts
(:func:`weightformer.engine.cli.run_reporting_errors`, ``weightformer bench``'s model builder). Any other
way of reaching :func:`weightformer.cli.main` (``python -c``, a test) imports them as a library does.

The package's other names (:class:`WeightFormer`, :class:`DynamicLinear`, ...) are imported on first
use (PEP 562).
"""

from __future__ import annotations

import os
import re
import sys
from importlib import import_module
from typing import Any, Callable

__version__ = "0.1.0"
__all__ = ["DynamicDWConv", "DynamicLinear", "WeightFormer", "attention_as_mlp", "__version__"]


def _lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The PEP 562 ``__getattr__`` and ``__dir__`` of ``package``, whose names ``exports`` maps to the
    submodule (relative) that defines each: imported on first use, then an attribute like any other."""
    module = sys.modules[package]

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f".{exports[name]}", package), name)
        setattr(module, name, value)  # later look-ups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(module), *exports})

    return __getattr__, __dir__


__getattr__, __dir__ = _lazy_exports(__name__, {
    "DynamicDWConv": "layers", "DynamicLinear": "layers", "attention_as_mlp": "layers", "WeightFormer": "models",
})


def _module_run_by_python() -> str:
    """The module named by ``-m`` on the interpreter's command line, :data:`sys.orig_argv` (CPython's
    short options, which may be grouped, as in ``-Om weightformer``; c, m, W and X take an argument)."""
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
    """Whether this interpreter was started as the ``weightformer`` command (see the module docstring)."""
    program = sys.argv[0] if sys.argv else ""
    if program == "-m":  # python -m weightformer: runpy imports the package before it sets sys.argv[0]
        return _module_run_by_python() == "weightformer"
    return re.sub(r"(-script\.pyw?|\.exe)$", "", os.path.basename(program)) == "weightformer"


# Below _lazy_exports, which the engine's and the data package's __init__ use. No torch.
from . import tasks  # noqa: E402,F401  (registers the built-in tasks with the engine, by import path)

if not _started_as_command():
    from . import models  # noqa: F401  (registers the WeightFormer models with timm; imports torch)
