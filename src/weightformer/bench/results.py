"""The results writer of every benchmark: the machine each file names, the output-folder rule and the files.
An ``--out`` holding one of a command's files is refused before the work unless ``--overwrite``, which moves
them aside (``<name>.previous-<time>``); each file is written atomically.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from ..engine.metrics import json_text
from ..engine.outputs import claim_outputs, write_atomic
from .timing import allocator_policy
from ..engine.run_dir import check_writable_file, check_writable_folder


def log(message: str) -> None:
    print(message, flush=True)


def default_out(out: Optional[Path], device: str, suite: str = "") -> Path:
    """``out``, else ``benchmarks/results/<device type>/<suite>``."""
    return Path(out or Path("benchmarks/results") / device.split(":")[0] / suite)


def markdown_grid(header: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    """The lines of a Markdown table."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def command_line(argv: Optional[Sequence[str]] = None) -> str:
    """``argv`` (default: this process's, ``python -m MODULE`` for a module run with ``-m``) as one shell line."""
    if argv is None:
        argv = list(sys.argv)
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        if argv and spec is not None and spec.name:
            return shlex.join(["python", "-m", spec.name.removesuffix(".__main__"), *argv[1:]])
    return shlex.join([os.path.basename(argv[0]), *argv[1:]]) if argv else ""


def machine_info(device: str = "cpu", command: Optional[str] = None) -> Dict[str, Any]:
    """CPU, cores, versions, threads, GPU, date, load average now and ``command`` (default: :func:`command_line`).
    Called when a benchmark starts, so the load average is the one its measurements began under."""
    import timm
    import torch

    try:
        load = [round(value, 2) for value in os.getloadavg()]
    except (AttributeError, OSError):
        load = None
    info: Dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hostname": platform.node(), "platform": platform.platform(), "python": platform.python_version(),
        "cpu": cpu_model(), "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch": torch.__version__, "timm": timm.__version__, "torch_threads": torch.get_num_threads(),
        "load_average": load, "command": command_line() if command is None else command, "device": device,
        "gpu": None, "allocator": allocator_policy(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.device(device))
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda)
    return info


def describe(info: Dict[str, Any]) -> str:
    where = info["gpu"] or f"{info['cpu']}, {info['cpu_affinity'] or info['cpu_count']} cores"
    load = info.get("load_average")
    load_text = "load average at start " + " ".join(f"{v:g}" for v in load) if load else "load average not recorded"
    allocator = f"; malloc {info['allocator']}" if info.get("allocator") else ""
    return (f"{where}; torch {info['torch']}, {info['torch_threads']} threads{allocator}; {load_text}; "
            f"{info['date'][:10]}")


def provenance(info: Dict[str, Any]) -> str:
    command = info.get("command")
    return f"Machine: {describe(info)}.\n\nCommand: `{command}`." if command else f"Machine: {describe(info)}."


def check_out_dir(out_dir: Path, names: Sequence[str], flag: str = "--out") -> None:
    out_dir = Path(out_dir)
    check_writable_folder(out_dir, flag)
    for name in names:
        check_writable_file(out_dir / name, flag)


def claim_out_dir(out_dir: Path, names: Sequence[str], overwrite: bool, command: str, keep: bool = False,
                  hint: str = "", log: Callable[[str], None] = print, flag: str = "--out") -> List[Path]:
    """The output rule, before the work; ``keep`` (``--resume``) leaves the files in place; the files moved aside."""
    out_dir = Path(out_dir)
    check_out_dir(out_dir, names, flag)
    if keep:
        return []
    moved = claim_outputs([out_dir / name for name in names], overwrite, command, flag, hint=hint)
    if moved:
        log(f"--overwrite: the earlier results moved aside ({', '.join(p.name for p in moved)}, in {out_dir})")
    return moved


Content = Union[str, bytes, Dict[str, Any], Callable[[], bytes]]


def write_results(out_dir: Path, files: Mapping[str, Content]) -> List[Path]:
    """Write ``files`` (name -> a dict as indented JSON, text, bytes, or a callable giving bytes) atomically."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, content in files.items():
        if callable(content):
            content = content()
        if isinstance(content, dict):
            content = json_text(content, indent=2) + "\n"
        if isinstance(content, str):
            content = content.encode() if content.endswith("\n") else (content + "\n").encode()
        write_atomic(out_dir / name, content)
        paths.append(out_dir / name)
    return paths
