"""Describe the machine a benchmark ran on, so that every result file names it."""

import datetime
import os
import platform
from typing import Any, Dict

import torch


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


def machine_info(device: str = "cpu") -> Dict[str, Any]:
    """CPU model, core counts, torch and timm versions, thread count, GPU name (if used) and the date."""
    import timm

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
    """One line naming the machine, for table captions and plot titles."""
    where = info["gpu"] or f"{info['cpu']}, {info['cpu_affinity'] or info['cpu_count']} cores"
    return f"{where}; torch {info['torch']}, {info['torch_threads']} threads; {info['date'][:10]}"
