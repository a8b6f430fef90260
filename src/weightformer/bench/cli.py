"""``weightformer bench``: the sweep (no suite named), ``bench dense``, ``bench dit`` and ``bench export``.

Every setting (and the output folder) is checked before any measurement; a bad one is one ``error:`` line
and exit status 2. The parsers import no torch. SIGINT/SIGTERM stop the sweep with status 130/143, its
points kept in ``points.jsonl`` for ``--resume``.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..engine.cli import OneLineParser, run_reporting_errors
from ..engine.errors import ConfigError
from ..engine.run_dir import hold_run_folder
from .journal import JOURNAL_NAME
from .checks import (ALLOCATORS, DTYPES, MEASUREMENTS, MODES, RUNTIMES, SWEEP_FILES, check_choices, check_models,
                     check_number, check_resolution)
from .subjects import suite

if TYPE_CHECKING:
    from .sweep import SweepConfig

DEFAULT_MODELS = ["wf-t", "wf-t-naive", "wf-t-ckpt", "deit-t", "deit-t-explicit", "wf-s", "deit-s"]
DEFAULT_RESOLUTIONS = [224, 448, 624, 896, 1248, 2048]
DEFAULT_BATCHES = "224:16,448:4,1"
DEFAULT_TRAIN_RESOLUTIONS = [224, 448, 624, 1248]
QUICK = {"models": ["wf-t", "deit-t"], "resolutions": [224, 448], "measure": ["infer", "flops"]}
EXIT_SIGNALS = {signal.SIGINT: 130, signal.SIGTERM: 143}
DEVICE_HELP = "cpu, cuda, cuda:N or auto (default: auto, i.e. cuda where a GPU is visible, else cpu)"

DESCRIPTION = """\
Speed and memory of WeightFormer against timm's DeiT: throughput, peak memory, FLOPs and parameters, written
as results.json, results.csv, results.md and scaling.png.

A bare `weightformer bench` runs the full sweep: WeightFormer-T (fast, naive, checkpointed), DeiT-T (fused
and explicit attention), WeightFormer-S and DeiT-S at 224-2048 px: inference, training steps, FLOPs and the
extra peak memory of each call in a fresh process (about 20 minutes on an idle 2-core machine). --quick:
WeightFormer-T and DeiT-T, inference and FLOPs at 224 and 448 px (about 30 s there).

Each point is saved to points.jsonl in --out when measured, so --resume measures only the rest of a killed
sweep. An --out holding earlier results (the committed benchmarks/results/<device type> included) is
refused before any measurement; --overwrite moves them aside (<name>.previous-<time>, never deleted)."""


# ------------------------------------------------------------------------------------ values and checks
def strings(text: str) -> List[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _type(parse: Callable[[str], Any], what: str) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error) or f"bad {what}: {text!r}") from None

    convert.__name__ = what
    return convert


def _scalar(text: str, integer: bool) -> float:
    try:
        return int(text) if integer else float(text)
    except ValueError:
        raise ValueError(f"expected {'an integer' if integer else 'a number'}, got {text!r}") from None


def number(minimum: float, inclusive: bool = True, integer: bool = False) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        value = _scalar(text, integer)
        check_number("the value", value, minimum, inclusive)
        return value

    return _type(parse, "an integer" if integer else "a number")


def listed(parse: Callable[[str], Any], what: str, check: Callable[[list], None] = lambda v: None) -> Callable:
    def parse_all(text: str) -> list:
        values = [parse(part) for part in strings(text)]
        if not values:
            raise ValueError(f"no {what} given in {text!r}")
        check(values)
        return values

    return _type(parse_all, what)


def _resolution(text: str) -> int:
    value = int(_scalar(text, True))
    check_resolution(value)
    return value


def parse_batches(text: str) -> Tuple[Dict[int, int], int]:
    """"RES:BATCH,...,DEFAULT" (e.g. "224:16,448:4,1") as ({224: 16, 448: 4}, 1); ArgumentTypeError otherwise."""
    per_res: Dict[int, int] = {}
    defaults: List[int] = []
    for part in strings(text):
        try:
            if ":" in part:
                res, batch = part.split(":")
                per_res[_resolution(res)] = int(batch)
            else:
                defaults.append(int(part))
        except ValueError as error:
            detail = str(error) if "multiple" in str(error) else f"bad batch entry {part!r}"
            raise argparse.ArgumentTypeError(
                f"{detail} in {text!r}; use RES:BATCH pairs and one plain default, e.g. 224:16,1") from None
    if len(defaults) > 1:
        raise argparse.ArgumentTypeError(f"{len(defaults)} plain defaults in {text!r}; give one, e.g. 224:16,1")
    if any(batch < 1 for batch in [*per_res.values(), *defaults]):
        raise argparse.ArgumentTypeError(f"a batch in {text!r} is below 1; batches are positive integers")
    return per_res, defaults[0] if defaults else 1


def _allocator(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allocator", choices=ALLOCATORS, default="cached",
        help="cached: glibc's malloc keeps freed memory in the timing process, as jemalloc and tcmalloc do, so no "
             "call faults in pages that an earlier call handed back (by default glibc returns large blocks to the "
             "kernel; on a 2-core VM that moves 224 px ratios by up to 5%%); system: glibc's defaults. Memory is "
             "measured in fresh processes with the defaults either way (default: %(default)s)")


def _common(parser: argparse.ArgumentParser, files: Sequence[str], default_out: str, threads: bool = True) -> None:
    add = parser.add_argument
    _allocator(parser)
    add("--device", default="auto", help=DEVICE_HELP)
    if threads:
        add("--threads", type=number(1, integer=True), default=None, help="torch CPU threads (default: torch's choice)")
    add("--out", type=Path, default=None,
        help=f"output folder (default: benchmarks/results/<device type>{default_out}); one that already holds "
             f"{' or '.join(files)} is refused unless --overwrite")
    add("--overwrite", action="store_true",
        help=f"move the {', '.join(files)} already in --out aside (<name>.previous-<time>, never deleted) "
             f"instead of refusing to start")


def _list(values: Sequence[Any]) -> str:
    return ",".join(map(str, values))


# ------------------------------------------------------------------------------------------- the sweep
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    S = argparse.SUPPRESS  # --quick fills in what is not given; config_from_args applies the defaults
    resolutions = listed(_resolution, "resolutions such as 224,448")
    choices = lambda allowed, what: listed(str, what, lambda v: check_choices(what, v, allowed))  # noqa: E731
    add = parser.add_argument
    add("--quick", action="store_true",
        help=f"a short sweep: models {_list(QUICK['models'])}, resolutions {_list(QUICK['resolutions'])}, "
             f"measure {_list(QUICK['measure'])}, unless given explicitly")
    add("--models", type=_type(lambda t: (lambda m: check_models(m) or m)(strings(t)), "models"), default=S,
        help=f"comma-separated, from: {', '.join(suite('cls'))} (default: {_list(DEFAULT_MODELS)})")
    add("--resolutions", type=resolutions, default=S,
        help=f"image sides in pixels, multiples of 16 (default: {_list(DEFAULT_RESOLUTIONS)})")
    add("--batch", type=parse_batches, default=parse_batches(DEFAULT_BATCHES), metavar="RES:BATCH,...,DEFAULT",
        help=f"batch size per resolution and a plain default for the others (default: {DEFAULT_BATCHES})")
    add("--measure", type=choices(MEASUREMENTS, "measurements"), default=S,
        help=f"comma-separated, from: {', '.join(MEASUREMENTS)} (default: all)")
    add("--train-resolutions", type=resolutions, default=DEFAULT_TRAIN_RESOLUTIONS,
        help=f"the resolutions that also get training steps (default: {_list(DEFAULT_TRAIN_RESOLUTIONS)})")
    add("--memory-resolutions", type=resolutions, default=None,
        help="the resolutions that also get peak memory, of each mode where it is timed (default: all: inference "
             "memory at every resolution, training memory at the --train-resolutions)")
    add("--memory-modes", type=choices(MODES, "memory modes"), default=list(MODES),
        help=f"memory of 'infer' calls, 'train' steps or both, comma-separated (default: {_list(MODES)})")
    add("--repetitions", type=number(1, integer=True), default=3,
        help="timed rounds per point; medians are reported (default: %(default)s)")
    add("--min-rep-seconds", type=number(0), default=1.0,
        help="a timed repetition lasts at least this many seconds (default: %(default)s)")
    add("--max-call-seconds", type=number(0, inclusive=False), default=15.0,
        help="skip points predicted to take longer per call, in seconds (default: %(default)s)")
    add("--dtype", type=choices(DTYPES, "dtypes"), default=["float32"],
        help="precisions, comma-separated: float32, or autocast to bfloat16 or float16; each model is timed in "
             "each (default: float32)")
    add("--runtime", type=choices(RUNTIMES, "runtimes"), default=["eager"],
        help="runtimes, comma-separated: eager, compile (torch.compile with Inductor and dynamic shapes, as "
             "`train --compile`; its first call, compilation included, is reported apart); each model is timed "
             "in each (default: eager)")
    _common(parser, (*SWEEP_FILES, JOURNAL_NAME), "")
    add("--resume", action="store_true",
        help=f"take the points already in --out/{JOURNAL_NAME} (same settings only) and measure the rest")


def config_from_args(args: argparse.Namespace) -> "SweepConfig":
    from .sweep import SweepConfig

    quick = getattr(args, "quick", False)

    def pick(name: str, default: Any) -> Any:
        return getattr(args, name, QUICK[name] if quick else default)

    per_res, default = args.batch
    return SweepConfig(
        models=pick("models", DEFAULT_MODELS), resolutions=pick("resolutions", DEFAULT_RESOLUTIONS),
        batch_sizes=per_res, default_batch=default, measurements=tuple(pick("measure", MEASUREMENTS)),
        train_resolutions=args.train_resolutions, memory_resolutions=args.memory_resolutions,
        memory_modes=tuple(args.memory_modes), repetitions=args.repetitions, min_rep_seconds=args.min_rep_seconds,
        max_call_seconds=args.max_call_seconds, device=args.device, dtypes=tuple(args.dtype),
        runtimes=tuple(args.runtime), threads=args.threads, allocator=args.allocator)


class Stopped(BaseException):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stopped(signum: int, frame: Any) -> None:
    raise Stopped(signum)


def run_sweep(args: argparse.Namespace, command: str) -> int:
    from .results import default_out

    config = config_from_args(args)
    out = default_out(args.out, config.device)
    if args.resume and args.overwrite:
        raise ConfigError("--resume continues the points in --out and --overwrite moves them aside; pass one of them")
    journal = Path(out) / JOURNAL_NAME
    hint = f" (--resume: there is no {JOURNAL_NAME} there to resume from)" if args.resume and not journal.exists() else ""
    with hold_run_folder(out, "--out"):  # the journal and the results are one process's
        return _sweep_held(args, command, config, out, journal, hint)


def _sweep_held(args: argparse.Namespace, command: str, config: "SweepConfig", out: Path, journal: Path,
                hint: str) -> int:
    from . import sweep
    from .results import claim_out_dir, log

    claim_out_dir(out, (*SWEEP_FILES, JOURNAL_NAME), args.overwrite, "weightformer bench",
                  keep=args.resume and journal.is_file(), hint=hint, log=log)
    in_main_thread = threading.current_thread() is threading.main_thread()  # only there can handlers be set
    previous = {signum: signal.signal(signum, _raise_stopped) for signum in EXIT_SIGNALS if in_main_thread}
    try:
        result = sweep.Sweep(config, log=log, journal=journal, resume=args.resume, command=command).run()
    except Stopped as stop:
        print(f"stopped by {stop}; the points measured so far are in {journal}: "
              f"rerun the same command with --resume to finish", file=sys.stderr)
        return EXIT_SIGNALS[stop.signum]
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    print(sweep.markdown_table(result), flush=True)  # first: if writing fails, the results are on screen
    for path in sweep.write_all(result, out):
        print(f"wrote {path}")
    print(f"sweep took {result['elapsed_s']:.0f} s ({result['points_measured']} points measured, "
          f"{result['points_reused']} taken from {journal})")
    return 0


# ------------------------------------------------------------------------------------------- the suites
def _size(text: str) -> Tuple[int, int]:
    try:
        values = [int(p) for p in text.lower().split("x")]
    except ValueError:
        values = []
    if len(values) not in (1, 2) or min(values) < 32:
        raise ValueError(f"a size is S or HxW in pixels, at least 32 (e.g. 1024 or 800x1333), got {text!r}")
    return (values[0], values[-1])


def dense_parser() -> argparse.ArgumentParser:
    from .dense import DEFAULT_SIZES, FILES

    models = list(suite("dense"))
    parser = OneLineParser(prog="weightformer bench dense", formatter_class=argparse.RawDescriptionHelpFormatter,
                           description="What a backbone costs behind ViTDet's 256-channel simple feature pyramid at "
                                       "detection and segmentation sizes: GMACs and parameters of the trunk and with "
                                       "the pyramid, extra peak memory and img/s of a forward and of a training step.")
    add = parser.add_argument
    add("--models", type=listed(str, "models", lambda v: check_choices("model", v, models)), default=models,
        help=f"comma-separated (default: {','.join(models)})")
    add("--sizes", type=listed(_size, "sizes"), default=list(DEFAULT_SIZES),
        help="comma-separated S or HxW (default: 800x1333,1024,512)")
    add("--modes", type=listed(str, "modes", lambda v: check_choices("mode", v, MODES)), default=list(MODES),
        help="infer, train or both (default: infer,train)")
    add("--repetitions", type=number(1, integer=True), default=3, help="timed rounds; medians are reported (default: 3)")
    add("--max-call-seconds", type=number(0, inclusive=False), default=60.0,
        help="skip a model whose first call takes longer (default: 60)")
    add("--no-memory", action="store_true", help="skip the peak-memory measurements")
    _common(parser, FILES, "/dense", threads=False)
    return parser


def dit_parser() -> argparse.ArgumentParser:
    from .dit import ATTENTION, DEFAULT_SIDES, FILES

    parser = OneLineParser(prog="weightformer bench dit",
                           description="WeightFormer-DiT against DiT with fused attention (F.scaled_dot_product_"
                                       "attention) and with explicit attention (softmax(QKᵀ)V, the N×N scores in "
                                       "memory), across latent sides, forward and training step: time and extra peak "
                                       "memory.")
    add = parser.add_argument
    add("--models", nargs=2, default=["wf_dit_s_2", "dit_s_2"], metavar=("WF_DIT", "DIT"),
        help="the WeightFormer-DiT and the attention DiT compared (default: wf_dit_s_2 dit_s_2)")
    add("--attention", nargs="+", choices=ATTENTION, default=list(ATTENTION),
        help="the attention DiT's attention, one row each (default: fused explicit)")
    add("--sides", type=number(1, integer=True), nargs="+", default=list(DEFAULT_SIDES),
        help="latent sides, 8 px each, multiples of the patch sizes (default: 32 64 128 224, i.e. 256 to 1792 px)")
    add("--batch", type=number(1, integer=True), default=1, help="default: %(default)s")
    add("--repeats", type=number(1, integer=True), default=3,
        help="interleaved repetitions per point (default: %(default)s)")
    add("--max-seconds", type=number(0, inclusive=False), default=200.0,
        help="per-call budget, seconds > 0: points predicted to take longer are skipped, and a model stops growing "
             "once one call takes longer (default: %(default)s)")
    add("--no-memory", action="store_true", help="time only")
    _common(parser, FILES, "/dit")
    return parser


def export_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="weightformer bench export",
                           description="CPU throughput of one classifier in PyTorch eager, torch.compile(dynamic=True) "
                                       "and onnxruntime, at several image sizes with one compiled program and one "
                                       "ONNX file for all of them.")
    add = parser.add_argument
    add("--model", default="weightformer_tiny", help="a timm model name (default: %(default)s)")
    add("--rounds", type=number(1, integer=True), default=5, help="interleaved rounds (default: %(default)s)")
    add("--repeats", type=number(1, integer=True), default=2, help="calls per timed repetition (default: %(default)s)")
    add("--threads", type=number(1, integer=True), default=1, help="threads of every runtime (default: %(default)s)")
    add("--out", type=Path, default=Path("benchmarks/results/cpu/export"), help="output folder (default: %(default)s)")
    add("--overwrite", action="store_true", help="move runtimes.json and runtimes.md already in --out aside")
    _allocator(parser)
    return parser


SUITES: Dict[str, Tuple[str, str, Callable[[], argparse.ArgumentParser]]] = {  # name: (module, summary, parser)
    "dense": ("weightformer.bench.dense", "backbone cost at detection/segmentation sizes (GFLOPs, params, memory, "
              "img/s)", dense_parser),
    "dit": ("weightformer.bench.dit", "WeightFormer-DiT against DiT across latent sides (time and memory)", dit_parser),
    "export": ("weightformer.bench.export", "one classifier in eager, torch.compile and onnxruntime (CPU img/s)",
               export_parser)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in SUITES:
        module, _, make_parser = SUITES[argv[0]]
        args = make_parser().parse_args(argv[1:])
        command = shlex.join(["weightformer", "bench", *argv])

        def run_suite() -> int:
            from importlib import import_module

            from .timing import keep_freed_memory

            if args.allocator == "cached":  # every suite times under the sweep's policy
                keep_freed_memory()
            return import_module(module).run_command(args, command)

        return run_reporting_errors(run_suite)
    parser = OneLineParser(prog="weightformer bench")
    add_arguments(parser)
    parser.description = DESCRIPTION + "\n\nOther suites: " + "; ".join(
        f"`weightformer bench {name}` ({text})" for name, (_, text, _) in SUITES.items())
    args = parser.parse_args(argv)
    return run_reporting_errors(lambda: run_sweep(args, shlex.join(["weightformer", "bench", *argv])))
