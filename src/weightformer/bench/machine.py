"""Describe the machine a benchmark ran on, so that every result file names it: the CPU (or GPU), the
threads, the load average when the benchmark started, the library versions and the command."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import sys
from typing import Any, Dict, Optional, Sequence


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, or ``platform.processor()`` where that file is absent."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> Optional[list]:
    """The 1, 5 and 15 minute load averages now, or None where the platform has none."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def command_line(argv: Optional[Sequence[str]] = None) -> str:
    """The command that runs this process, as one shell line: ``argv`` (default ``sys.argv``) with the
    program named by its file name (``weightformer``, ``targets.py``), or ``python -m MODULE`` for a
    module run with ``-m``."""
    if argv is None:
        argv = list(sys.argv)
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        if argv and spec is not None and spec.name:
            module = spec.name.removesuffix(".__main__")
            return shlex.join(["python", "-m", module, *argv[1:]])
    if not argv:
        return ""
    return shlex.join([os.path.basename(argv[0]), *argv[1:]])


def machine_info(device: str = "cpu", command: Optional[str] = None) -> Dict[str, Any]:
    """CPU model, core counts, torch and timm versions, thread count, GPU name (if used), the date, the load
    average now and ``command`` (default: this process's :func:`command_line`). Call it when the
    benchmark starts: the load average is the one the measurements began under."""
    import timm
    import torch

    info: Dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch": torch.__version__,
        "timm": timm.__version__,
        "torch_threads": torch.get_num_threads(),
        "load_average": load_average(),
        "command": command_line() if command is None else command,
        "device": device,
        "gpu": None,
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.device(device))
        info["gpu"] = props.name
        info["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        info["cuda"] = torch.version.cuda
    return info


def describe(info: Dict[str, Any]) -> str:
    """One line naming the machine, its threads and the load average at the start, for captions and plot
    titles (results written before the load average was recorded say so)."""
    where = info["gpu"] or f"{info['cpu']}, {info['cpu_affinity'] or info['cpu_count']} cores"
    load = info.get("load_average")
    load_text = "load average at start " + " ".join(f"{v:g}" for v in load) if load else "load average not recorded"
    return f"{where}; torch {info['torch']}, {info['torch_threads']} threads; {load_text}; {info['date'][:10]}"


def provenance(info: Dict[str, Any]) -> str:
    """Markdown lines for a table's header: the machine (:func:`describe`) and the command that made it."""
    command = info.get("command")
    return f"Machine: {describe(info)}.\n\nCommand: `{command}`." if command else f"Machine: {describe(info)}."
