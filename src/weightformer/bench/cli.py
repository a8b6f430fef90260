"""``weightformer bench``: run the benchmark sweep and write JSON, CSV, Markdown and the scaling plot.

The default run compares WeightFormer-T (fast, naive and checkpointed) with DeiT-T (fused and explicit
attention), and WeightFormer-S with DeiT-S, at 224-1248 px and at 2048 px where the per-call time budget
allows; inference everywhere, training steps and training memory at a subset of resolutions. On two
CPU cores it is estimated at 15-20 minutes.
"""

import argparse
from pathlib import Path
from typing import Dict, List, Tuple

import torch

from .report import write_all
from .sweep import MEASUREMENTS, Sweep, SweepConfig
from .variants import TRAIN, VARIANTS

DEFAULT_MODELS = ["wf-t", "wf-t-naive", "wf-t-ckpt", "deit-t", "deit-t-explicit", "wf-s", "deit-s"]
DEFAULT_RESOLUTIONS = [224, 448, 624, 896, 1248, 2048]
DEFAULT_BATCHES = "224:16,448:4,1"


def _ints(text: str) -> List[int]:
    try:
        return [int(part) for part in text.split(",") if part]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 224,448, got {text!r}") from None


def _strings(text: str) -> List[str]:
    return [part for part in text.split(",") if part]


def parse_batches(text: str) -> Tuple[Dict[int, int], int]:
    """Parse "RES:BATCH,...,DEFAULT" (e.g. "224:16,448:4,1") into ({224: 16, 448: 4}, 1)."""
    per_res: Dict[int, int] = {}
    default = 1
    for part in _strings(text):
        try:
            if ":" in part:
                res, batch = part.split(":")
                per_res[int(res)] = int(batch)
            else:
                default = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"bad batch entry {part!r} in {text!r}; use RES:BATCH pairs and one plain default, e.g. 224:16,1"
            ) from None
    return per_res, default


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's options to ``parser``."""
    parser.add_argument(
        "--models", type=_strings, default=DEFAULT_MODELS, help=f"comma-separated, from: {', '.join(VARIANTS)}"
    )
    parser.add_argument("--resolutions", type=_ints, default=DEFAULT_RESOLUTIONS, help="image sides in pixels")
    parser.add_argument(
        "--batch", type=parse_batches, default=parse_batches(DEFAULT_BATCHES), help="RES:BATCH pairs and a default"
    )
    parser.add_argument(
        "--measure", type=_strings, default=list(MEASUREMENTS), help=f"which of {', '.join(MEASUREMENTS)}"
    )
    parser.add_argument(
        "--train-resolutions", type=_ints, default=[224, 448, 624, 1248], help="resolutions with training steps"
    )
    parser.add_argument("--memory-resolutions", type=_ints, default=[224, 624, 1248], help="resolutions with memory")
    parser.add_argument(
        "--memory-modes", type=_strings, default=[TRAIN], help="memory of 'infer' calls, 'train' steps or both"
    )
    parser.add_argument("--repetitions", type=int, default=3, help="timed rounds; medians are reported")
    parser.add_argument("--min-rep-seconds", type=float, default=1.0, help="a timed repetition lasts at least this")
    parser.add_argument(
        "--max-call-seconds", type=float, default=15.0, help="skip points predicted to take longer per call"
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="autocast dtype")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default benchmarks/results/<device>)")


def config_from_args(args: argparse.Namespace) -> SweepConfig:
    """The ``SweepConfig`` that the parsed options describe."""
    per_res, default = args.batch
    return SweepConfig(
        models=args.models,
        resolutions=args.resolutions,
        batch_sizes=per_res,
        default_batch=default,
        measurements=tuple(args.measure),
        train_resolutions=args.train_resolutions,
        memory_resolutions=args.memory_resolutions,
        memory_modes=tuple(args.memory_modes),
        repetitions=args.repetitions,
        min_rep_seconds=args.min_rep_seconds,
        max_call_seconds=args.max_call_seconds,
        device=args.device,
        dtype=args.dtype,
        threads=args.threads,
    )


def run(args: argparse.Namespace) -> int:
    """Run the sweep the options describe, write its outputs, and return the exit status."""
    try:
        config = config_from_args(args)
    except ValueError as error:
        print(f"weightformer bench: {error}")
        return 2
    out = args.out or Path("benchmarks/results") / torch.device(config.device).type
    result = Sweep(config).run()
    for path in write_all(result, out):
        print(f"wrote {path}")
    print(f"sweep took {result['elapsed_s']:.0f} s")
    return 0
