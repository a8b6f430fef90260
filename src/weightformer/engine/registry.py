"""Tasks by name, as a checkpoint's ``meta["task"]`` names them (:mod:`weightformer.tasks` registers the
package's); weights that name no task (the authors', timm's, bare state dicts) are the *default* task's."""

from __future__ import annotations

import difflib
from importlib import import_module
from typing import Union

from ..checkpoint import CheckpointError

__all__ = ["default_task", "get_task", "register_task"]

_TASKS: dict[str, Union[str, type]] = {}
_DEFAULT: list[str] = []


def register_task(task: Union[str, type], name: str | None = None, default: bool = False) -> None:
    """Make a task known by ``name`` (default: its ``name``): a Task subclass, or the import path
    ``"package.module:ClassName"`` of one (imported on first use); ``default``: weights naming no task are its."""
    if isinstance(task, str) and name is None:
        raise ValueError("register_task needs the name of a task given as an import path")
    name = name or task.name
    _TASKS[name] = task
    if default:
        _DEFAULT[:] = [name]


def get_task(name: str) -> type:
    """The task registered as ``name``; CheckpointError for a name nobody registered."""
    entry = _TASKS.get(name)
    if entry is None:
        close = difflib.get_close_matches(str(name), _TASKS, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise CheckpointError(f"no task named {name!r}{hint}; the known tasks are {', '.join(sorted(_TASKS))}. "
                              f"A task of your own must be registered with weightformer.engine.register_task")
    if isinstance(entry, str):
        module, _, attribute = entry.partition(":")
        entry = getattr(import_module(module), attribute)
        _TASKS[name] = entry
    return entry


def default_task() -> type:
    """The task of weights that name none."""
    if not _DEFAULT:
        raise CheckpointError("no default task is registered; import weightformer, or pass the task")
    return get_task(_DEFAULT[0])

