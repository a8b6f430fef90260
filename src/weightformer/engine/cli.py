"""The command line of every task: ``train`` has one flag per setting of its config class that has help (the rest
through ``--set name=value``), each ``(default: ...)`` read off the recipes; the others come from its :class:`TaskCLI`.
Exit codes: 0 done; 2 a user's mistake (one ``error:`` line; a path the user may not read or write among them);
1 out of memory, a full disk, the file-size limit, a
name too long, non-finite outputs or a diverged loss (one line), or a bug (its traceback); 130 / 143 a run stopped by SIGINT / SIGTERM,
checkpoint saved; a task's command may add its own."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import traceback
import typing
import warnings
from importlib import import_module
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from .commands import Command, TaskCLI
from .config import config_fields, given_item, parse_model_kwargs
from .errors import (USER_ERRORS, ConfigError, NonFiniteError, ResourceError, is_out_of_memory, permission_error,
                     resource_error)
from .metrics import json_text
from .outputs import check_output, output_file

__all__ = [
    "BUG_REPORT", "Command", "TaskCLI", "add_checkpoint_arguments", "add_json_argument", "add_settings_arguments",
    "build_parser", "finite_float", "json_path_argument", "main", "one_line", "print_and_write_results",
    "run_reporting_errors", "train_overrides",
]

SIGNAL_EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143}
BUG_REPORT = ("this is a bug in weightformer or a library it uses, not a problem with your input; please report it "
              "on the weightformer issue tracker with the command you ran and the traceback above")
_NOT_SETTINGS = ("command", "config_file", "model_kwargs", "model_arg", "set")
PRECEDENCE = """Settings, each later one winning: the recipe (a resumed run's own settings instead), then --config FILE.yaml
(with its _base_ files), then the command line (flags, --set, --model-kwargs). On the command line a setting
has one value: a flag and a --set giving it two values, or two --set, is an error."""
MAX_LINE = 1200  # characters of an error line: room for the longest list of choices, not for a user's megabytes


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a bad flag reported as one ``error:`` line naming the command (not the usage block)."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"error: {one_line(f'{self.prog}: {message} (see {self.prog} --help)')}\n")


def finite_float(text: str) -> float:
    """An argparse type: a float that is a number (``nan`` and ``inf`` are refused, as every setting's are)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def _default_text(task: Any, name: str, recipes: Sequence[Any]) -> str:
    """``(default: X)``, or, where the recipes differ, ``(default: X (offline); Y (vitdet-coco, small-data))``."""
    spec = config_fields(task.config_class)[name]
    own = spec.default if spec.default is not dataclasses.MISSING else spec.default_factory()
    groups: list[tuple[Any, list[str]]] = []
    for recipe in recipes:
        value = recipe.values.get(name, own)
        for known, names in groups:
            if known == value:
                names.append(recipe.name)
                break
        else:
            groups.append((value, [recipe.name]))
    if len(groups) <= 1:
        return f"(default: {_shown(groups[0][0] if groups else own)})"
    return "(default: " + "; ".join(f"{_shown(value)} ({', '.join(names)})" for value, names in groups) + ")"


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value) or "none"
    return str(value).replace("%", "%%")


def add_settings_arguments(parser: argparse.ArgumentParser, task: Any) -> None:
    """A flag for each setting of ``task.config_class`` that has help, and ``--config``, ``--model-kwargs``,
    ``--set``; every default is SUPPRESS, so only the flags given override the recipe and the file."""
    S = argparse.SUPPRESS
    parser.add_argument("--config", dest="config_file", metavar="FILE.yaml", default=S,
                        help="YAML file of settings; flags override it")
    hints, recipes = typing.get_type_hints(task.config_class), task.recipes()
    for name, spec in config_fields(task.config_class).items():
        meta = spec.metadata
        if not meta.get("help") or (name == "layer_decay" and task.backbone_path is None):
            continue  # no flag of its own (--set name=value); layer decay needs a backbone's blocks
        flag = meta.get("flag") or f"--{name.replace('_', '-')}"
        text = meta["help"] if "(default" in meta["help"] else f"{meta['help']} {_default_text(task, name, recipes)}"
        hint = hints[name]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        base = args[0] if typing.get_origin(hint) is typing.Union else hint
        if base is bool:
            action = "store_false" if flag.startswith("--no-") else "store_true"
            parser.add_argument(flag, dest=name, action=action, default=S, help=text)
            continue
        items = typing.get_args(base) if typing.get_origin(base) is tuple else None  # a tuple: one value per item
        nargs = None if items is None else "+" if items[-1] is Ellipsis else len(items)
        parser.add_argument(flag, dest=name, type=finite_float if items or base is float else base, nargs=nargs,
                            default=S, help=text, choices=meta.get("choices"), metavar=meta.get("metavar"))
    parser.add_argument("--model-kwargs", "--model-arg", dest="model_kwargs", nargs="+", action="extend",
                        metavar="KEY=VALUE", default=[],
                        help="keyword arguments of the model builder, e.g. patch_size=4 drop_path_rate=0.1 "
                             "(--model-arg is the same flag)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                        help="any other setting, e.g. --set weight_decay=0.1 (every setting: docs/train.md)")


def train_overrides(args: argparse.Namespace, task: Any) -> dict[str, Any]:
    """The settings the user gave on the command line: flags, ``--set`` and ``--model-kwargs``. They give each
    setting one value: a flag and a ``--set`` (or ``--set model_kwargs=`` and ``--model-kwargs``) that give
    one setting two values are a ConfigError naming both."""
    fields = config_fields(task.config_class)
    values = {k: v for k, v in vars(args).items() if k in fields and k != "model_kwargs"}
    items = getattr(args, "set", [])
    for key, value in parse_model_kwargs(items, flag="--set").items():
        if key in values and values[key] != value:
            flag, given = fields[key].metadata.get("flag") or f"--{key.replace('_', '-')}", values[key]
            if not isinstance(given, bool):
                flag += " " + (" ".join(map(str, given)) if isinstance(given, list) else str(given))
            raise ConfigError(f"{flag} and --set {given_item(items, key)} give {key!r} two values; pass one")
        values[key] = value
    kwarg_items = getattr(args, "model_kwargs", [])
    model_kwargs, given = parse_model_kwargs(kwarg_items, flag="--model-kwargs"), values.get("model_kwargs", {})
    if model_kwargs and isinstance(given, dict):  # another type is refused with the settings
        for key in model_kwargs.keys() & given.keys():
            if model_kwargs[key] != given[key]:
                raise ConfigError(f"--set {given_item(items, 'model_kwargs')} and --model-kwargs "
                                  f"{given_item(kwarg_items, key)} give model_kwargs.{key} two values; pass one")
        values["model_kwargs"] = {**given, **model_kwargs}
    return values


def _run_train(task: Any, args: argparse.Namespace) -> int:
    from .loop import train

    fields = config_fields(task.config_class)  # the flags of task.cli.train_arguments are those that are not settings
    extra = argparse.Namespace(**{k: v for k, v in vars(args).items() if k not in fields and k not in _NOT_SETTINGS})
    task.cli.check_train_arguments(extra)
    result = train(train_overrides(args, task), config_file=getattr(args, "config_file", None), task=task)
    if result.stopped_by is not None:  # SIGINT / SIGTERM
        return SIGNAL_EXIT_CODES.get(result.stopped_by, 130)
    task.cli.after_training(result, extra)
    return 0


def add_checkpoint_arguments(parser: argparse.ArgumentParser, command: str, required: bool = True) -> None:
    """``--checkpoint``, ``--ema`` and ``--device``; ``command`` (``weightformer det``) is for the help."""
    parser.add_argument("--checkpoint", required=required, help=f"a last.pt or best.pt written by {command} train")
    parser.add_argument("--ema", action="store_true", help="use the checkpoint's EMA weights")
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                        help="auto: cuda if available (default: auto)")


def add_json_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH (checked before the work)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --json file")


def json_path_argument(args: argparse.Namespace) -> Optional[Path]:
    """``--json PATH``, checked before the work (not after it), or None. It may not be one of the
    command's inputs (any other argument naming that file), nor an existing path unless ``--overwrite``."""
    if not getattr(args, "json", None):
        return None
    path = Path(args.json)
    target = path.resolve()
    for name, value in vars(args).items():
        values = value if isinstance(value, (list, tuple)) else [value]
        if name != "json" and any(isinstance(v, str) and Path(v).exists() and Path(v).resolve() == target
                                  for v in values):
            raise ConfigError(f"--json {path} is the command's --{name.replace('_', '-')} input; write the "
                              f"results to another file")
    check_output(path, getattr(args, "overwrite", False), folder=False, flag="--json")
    return path


def print_and_write_results(result: dict[str, Any], json_path: Optional[Path]) -> int:
    """Print ``result`` as a JSON line, then write it to ``json_path``: a failed write costs only the file
    (exit 1 for want of space or of the file-size limit, 2 for another cause)."""
    print(json_text(result), flush=True)
    if json_path is not None:
        try:
            with output_file(json_path, overwrite=True) as tmp:  # checked before the work; written atomically
                tmp.write_text(json_text(result, indent=2) + "\n")
        except OSError as exc:
            detail = exc if isinstance(exc, ResourceError) else f"--json {json_path}: {exc.strerror or exc}"
            print(f"error: the results above were not written ({detail})", file=sys.stderr)
            return 1 if isinstance(exc, ResourceError) else 2
    return 0


def one_line(exc: BaseException | str) -> str:
    """The message of ``exc`` as one line of at most ``MAX_LINE`` characters: a longer one keeps its start
    (the problem) and its last 200 characters (the fix) around an ellipsis."""
    text = " ".join(str(exc).strip().splitlines()) or type(exc).__name__
    return text if len(text) <= MAX_LINE else f"{text[:MAX_LINE - 201]}…{text[-200:]}"


def run_reporting_errors(command: Callable[[], int], hint_grad_checkpointing: bool = False) -> int:
    """Run ``command`` and turn what it raises into the exit codes and messages of this module's docstring;
    every command's work runs here, after the WeightFormer models are registered with timm."""
    previous_format = warnings.formatwarning
    warnings.formatwarning = lambda message, *args, **kwargs: f"warning: {message}\n"
    try:
        import_module("weightformer.models")  # registers with timm (already done in a library user's process)
        return command()
    except USER_ERRORS as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    except NonFiniteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("aborted", file=sys.stderr)
        return 130
    except Exception as exc:
        if is_out_of_memory(exc):
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            print(f"error: out of memory ({first}); pass a smaller --batch-size"
                  f"{' or --grad-checkpointing' if hint_grad_checkpointing else ''}", file=sys.stderr)
            return 1
        found = exc if isinstance(exc, ResourceError) else resource_error(exc)
        if found is not None:  # a full disk, the file-size limit, a name too long: the machine's, not a bug
            print(f"error: {one_line(found)}", file=sys.stderr)
            return 1
        denied = permission_error(exc)
        if denied is not None:  # a folder of someone else's: the user's
            print(f"error: {one_line(denied)}", file=sys.stderr)
            return 2
        traceback.print_exc()
        print(f"\n{BUG_REPORT}", file=sys.stderr)
        return 1
    finally:
        warnings.formatwarning = previous_format


def build_parser(task: Any, prog: Optional[str] = None) -> argparse.ArgumentParser:
    """``weightformer <task>``'s parser: ``train`` and the task's commands."""
    parser = OneLineParser(prog=prog or task.cli.program, description=task.cli.description or None)
    commands = list(task.cli.commands)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser,
                                metavar="{" + ",".join(["train", *(c.name for c in commands)]) + "}")
    recipes = "; ".join(f"{r.name}: {r.summary}" for r in task.recipes())
    train = sub.add_parser(
        "train", help=f"train a {task.name} model", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=f"Train a {task.name} model. The first line of the run names the recipe chosen for the data "
                    f"and why; flags and --config override it.\nRecipes: {recipes}.", epilog=PRECEDENCE)
    add_settings_arguments(train, task)
    task.cli.train_arguments(train)
    for command in commands:
        command.add_arguments(sub.add_parser(command.name, help=command.help, description=command.description))
    return parser


def main(task: Any, argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """Entry point of ``weightformer <task>``; returns the exit code."""
    try:
        args = build_parser(task, prog).parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # a bad flag: its one line is printed; --help (code 0) exits as argparse does
        if exc.code in (0, None):
            raise
        return int(exc.code) if isinstance(exc.code, int) else 2
    name = vars(args).pop("command")
    if name == "train":
        return run_reporting_errors(lambda: _run_train(task, args), hint_grad_checkpointing=True)
    command = next(c for c in task.cli.commands if c.name == name)
    return run_reporting_errors(lambda: command.run(args))
