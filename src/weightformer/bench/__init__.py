"""Benchmarks: throughput, peak memory, FLOPs and parameters of WeightFormer against timm's DeiT.

A Python user can call the pieces directly::

    from weightformer.bench import Sweep, SweepConfig, write_all
    result = Sweep(SweepConfig(models=["wf-t", "deit-t"], resolutions=[224, 448])).run()
    write_all(result, "benchmarks/results/cpu")

``Sweep(config, journal=Path("out/points.jsonl"), resume=True)`` appends each point to the journal as it
is measured and takes the points already there instead of measuring them again.
"""

from .flops import FlopReport, attention_flops, count_flops
from .journal import Journal, JournalMismatch
from .machine import describe, machine_info
from .memory import MemoryReport, OutOfMemory, cuda_peak, is_oom
from .memory import measure as measure_memory
from .report import (check_out_dir, claim_out_dir, markdown_table, plot_scaling, write_all, write_csv, write_json,
                     write_markdown)
from .sweep import Sweep, SweepConfig, attach_ratios
from .variants import VARIANTS, Variant, build_variant, get_variant, param_count

__all__ = [
    "FlopReport",
    "Journal",
    "JournalMismatch",
    "MemoryReport",
    "OutOfMemory",
    "Sweep",
    "SweepConfig",
    "VARIANTS",
    "Variant",
    "attach_ratios",
    "attention_flops",
    "build_variant",
    "check_out_dir",
    "claim_out_dir",
    "count_flops",
    "cuda_peak",
    "describe",
    "get_variant",
    "is_oom",
    "machine_info",
    "markdown_table",
    "measure_memory",
    "param_count",
    "plot_scaling",
    "write_all",
    "write_csv",
    "write_json",
    "write_markdown",
]
