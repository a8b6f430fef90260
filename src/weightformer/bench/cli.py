"""``weightformer bench``: run the benchmark sweep and write JSON, CSV, Markdown and the scaling plot.

Every setting is checked before any measurement, and so is the output folder (the rule of every
bench command: :func:`~weightformer.bench.report.claim_out_dir`): a bad one ends in one ``error:`` line
on stderr and exit status 2. Each point is appended to ``points.jsonl`` in the output folder as it is measured;
``--resume`` takes the points already there. SIGINT and SIGTERM stop the sweep between calls with
exit status 130 and 143, keeping the points measured so far.

The parser is built from torch-free modules (:mod:`.settings`, :mod:`.options`, :mod:`.variants`), so
``--help`` and a bad flag answer without importing torch; :func:`run` imports the sweep.
"""

import argparse
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from .journal import JOURNAL_NAME
from .machine import command_line
from .options import DEVICE_HELP, add_overwrite_argument, from_text, number, one_line_error, parse_int, strings
from .settings import DTYPES, MEASUREMENTS, MODES, OUTPUT_NAMES, check_choices, check_models, check_resolution
from .variants import VARIANTS

if TYPE_CHECKING:
    from .sweep import SweepConfig

DEFAULT_MODELS = ["wf-t", "wf-t-naive", "wf-t-ckpt", "deit-t", "deit-t-explicit", "wf-s", "deit-s"]
DEFAULT_RESOLUTIONS = [224, 448, 624, 896, 1248, 2048]
DEFAULT_BATCHES = "224:16,448:4,1"
DEFAULT_TRAIN_RESOLUTIONS = [224, 448, 624, 1248]
# --quick: what it leaves of the sweep, unless given explicitly.
QUICK = {"models": ["wf-t", "deit-t"], "resolutions": [224, 448], "measure": ["infer", "flops"]}
EXIT_SIGNALS = {signal.SIGINT: 130, signal.SIGTERM: 143}

DESCRIPTION = """\
Speed and memory benchmarks: throughput, peak memory, FLOPs and parameters of WeightFormer against
timm's DeiT, written as results.json, results.csv, results.md and scaling.png.

A bare `weightformer bench` runs the full sweep: WeightFormer-T (fast, naive, checkpointed) and DeiT-T
(fused and explicit attention), WeightFormer-S and DeiT-S, at 224-2048 px, inference, training steps,
FLOPs, and the extra peak memory of one inference call at every resolution and of one training step
at every training resolution (each model in a fresh process). Expect about 20 minutes on the idle
2-core machine of benchmarks/results/cpu (814 s before inference memory was measured everywhere),
more on a slower or busier one. For a quick look use --quick (WeightFormer-T and
DeiT-T, inference and FLOPs at 224 and 448 px: about 30 s there), or pick models and resolutions.

Each point is saved to points.jsonl in --out as soon as it is measured: a sweep that is killed keeps
its points, and the same command with --resume measures only the rest.

Nothing is written over unasked: an --out that already holds results of an earlier sweep (the
committed benchmarks/results/<device type> included) is refused before any measurement; --overwrite
moves them aside (<name>.previous-<time>, never deleted), --resume continues their points.jsonl."""


def _resolutions(text: str) -> List[int]:
    values = [parse_int(part) for part in strings(text)]
    if not values:
        raise ValueError(f"expected comma-separated resolutions such as 224,448, got {text!r}")
    for value in values:
        check_resolution(value)
    return values


def _models(text: str) -> List[str]:
    models = strings(text)
    check_models(models)
    return models


def _choices(allowed: Sequence[str], what: str) -> Callable[[str], List[str]]:
    def parse(text: str) -> List[str]:
        values = strings(text)
        check_choices(what, values, allowed)
        return values

    return parse


def parse_batches(text: str) -> Tuple[Dict[int, int], int]:
    """Parse "RES:BATCH,...,DEFAULT" (e.g. "224:16,448:4,1") into ({224: 16, 448: 4}, 1).

    Raises ``argparse.ArgumentTypeError`` on anything else: a bad entry, a batch below 1, two defaults.
    """
    per_res: Dict[int, int] = {}
    defaults: List[int] = []
    for part in strings(text):
        try:
            if ":" in part:
                res, batch = part.split(":")
                per_res[int(res)] = int(batch)
                check_resolution(int(res))
            else:
                defaults.append(int(part))
        except ValueError as error:
            detail = str(error) if "multiple" in str(error) else f"bad batch entry {part!r}"
            raise argparse.ArgumentTypeError(
                f"{detail} in {text!r}; use RES:BATCH pairs and one plain default, e.g. 224:16,1"
            ) from None
    if len(defaults) > 1:
        raise argparse.ArgumentTypeError(f"{len(defaults)} plain defaults in {text!r}; give one, e.g. 224:16,1")
    for batch in [*per_res.values(), *defaults]:
        if batch < 1:
            raise argparse.ArgumentTypeError(f"batch {batch} in {text!r} is below 1; batches are positive integers")
    return per_res, defaults[0] if defaults else 1


def _list(values: Sequence[Any]) -> str:
    return ",".join(map(str, values))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's options to ``parser``, with its description, help layout and one-line errors."""
    parser.description = DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.error = one_line_error(parser)  # type: ignore[method-assign]
    S = argparse.SUPPRESS  # --quick fills in what is not given; config_from_args applies the defaults
    add = parser.add_argument
    add("--quick", action="store_true",
        help=f"a short sweep: models {_list(QUICK['models'])}, resolutions {_list(QUICK['resolutions'])}, "
        f"measure {_list(QUICK['measure'])}, unless given explicitly")
    add("--models", type=from_text(_models, "models"), default=S,
        help=f"comma-separated, from: {', '.join(VARIANTS)} (default: {_list(DEFAULT_MODELS)})")
    add("--resolutions", type=from_text(_resolutions, "resolutions"), default=S,
        help=f"image sides in pixels, multiples of 16 (default: {_list(DEFAULT_RESOLUTIONS)})")
    add("--batch", type=parse_batches, default=parse_batches(DEFAULT_BATCHES), metavar="RES:BATCH,...,DEFAULT",
        help=f"batch size per resolution and a plain default for the others (default: {DEFAULT_BATCHES})")
    add("--measure", type=from_text(_choices(MEASUREMENTS, "measurements"), "measure"), default=S,
        help=f"comma-separated, from: {', '.join(MEASUREMENTS)} (default: all)")
    add("--train-resolutions", type=from_text(_resolutions, "resolutions"), default=DEFAULT_TRAIN_RESOLUTIONS,
        help=f"the resolutions that also get training steps (default: {_list(DEFAULT_TRAIN_RESOLUTIONS)})")
    add("--memory-resolutions", type=from_text(_resolutions, "resolutions"), default=None,
        help="the resolutions that also get peak memory, of each mode where it is timed (default: all: inference "
             "memory at every resolution, training memory at the --train-resolutions)")
    add("--memory-modes", type=from_text(_choices(MODES, "memory modes"), "modes"), default=list(MODES),
        help=f"memory of 'infer' calls, 'train' steps or both, comma-separated (default: {_list(MODES)})")
    add("--repetitions", type=number(1, integer=True), default=3,
        help="timed rounds per point; medians are reported (default: %(default)s)")
    add("--min-rep-seconds", type=number(0), default=1.0,
        help="a timed repetition lasts at least this many seconds (default: %(default)s)")
    add("--max-call-seconds", type=number(0, inclusive=False), default=15.0,
        help="skip points predicted to take longer per call, in seconds (default: %(default)s)")
    add("--device", default="auto", help=DEVICE_HELP)
    add("--dtype", default="float32", choices=DTYPES, help="autocast dtype (default: %(default)s)")
    add("--threads", type=number(1, integer=True), default=None,
        help="torch CPU threads (default: torch's choice)")
    add("--out", type=Path, default=None,
        help=f"output folder (default: benchmarks/results/<device type>); one that already holds "
             f"{', '.join(OUTPUT_NAMES)} or {JOURNAL_NAME} is refused unless --resume or --overwrite")
    add("--resume", action="store_true",
        help=f"take the points already in --out/{JOURNAL_NAME} (same settings only) and measure the rest")
    add_overwrite_argument(parser, f"results ({', '.join(OUTPUT_NAMES)}) and {JOURNAL_NAME}")


def config_from_args(args: argparse.Namespace) -> "SweepConfig":
    """The ``SweepConfig`` that the parsed options describe (``--quick`` applied)."""
    from .sweep import SweepConfig

    quick = getattr(args, "quick", False)

    def pick(name: str, default: Any) -> Any:
        return getattr(args, name, QUICK[name] if quick else default)

    per_res, default = args.batch
    return SweepConfig(
        models=pick("models", DEFAULT_MODELS),
        resolutions=pick("resolutions", DEFAULT_RESOLUTIONS),
        batch_sizes=per_res,
        default_batch=default,
        measurements=tuple(pick("measure", MEASUREMENTS)),
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


class Stopped(BaseException):
    """SIGTERM (or SIGINT) asked the sweep to stop."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stopped(signum: int, frame: Any) -> None:
    raise Stopped(signum)


def _log(message: str) -> None:
    print(message, flush=True)


def _sweep(config: "SweepConfig", out: Path, resume: bool, command: str) -> Optional[Dict[str, Any]]:
    """Run the sweep with SIGINT/SIGTERM turned into ``Stopped``; None (and a message) if stopped."""
    from .sweep import Sweep

    in_main_thread = threading.current_thread() is threading.main_thread()  # only there can handlers be set
    previous = {signum: signal.signal(signum, _raise_stopped) for signum in EXIT_SIGNALS if in_main_thread}
    try:
        return Sweep(config, log=_log, journal=out / JOURNAL_NAME, resume=resume, command=command).run()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def claim_sweep_out_dir(out: Path, resume: bool, overwrite: bool) -> List[Path]:
    """The bench output rule (:func:`~weightformer.bench.report.claim_out_dir`) for the sweep's folder:
    its results and journal are refused unless ``overwrite`` (moved aside) or ``resume`` with the journal
    there (continued in place). A ``resume`` without a journal has nothing to continue: results already
    there are refused as without it. Returns the files moved aside."""
    from .report import OutputError, claim_out_dir

    if resume and overwrite:
        raise OutputError("--resume continues the points in --out and --overwrite moves them aside; pass one of them")
    journal = Path(out) / JOURNAL_NAME
    hint = f" (--resume: there is no {JOURNAL_NAME} there to resume from)" if resume and not journal.exists() else ""
    return claim_out_dir(out, (*OUTPUT_NAMES, JOURNAL_NAME), overwrite, "weightformer bench",
                         keep=resume and journal.is_file(), hint=hint, log=_log)


def run(args: argparse.Namespace, command: Optional[str] = None) -> int:
    """Run the sweep the options describe, print its table, write its outputs, and return the exit status.
    ``command`` is the command line the results name (default: this process's)."""
    from .journal import JournalMismatch
    from .report import markdown_table, write_all

    try:
        config = config_from_args(args)
        out = args.out or Path("benchmarks/results") / config.device.split(":")[0]
        claim_sweep_out_dir(out, args.resume, getattr(args, "overwrite", False))
    except ValueError as error:  # a bad setting (SweepConfig) or an output folder that cannot take the results
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        result = _sweep(config, out, args.resume, command or command_line())
    except JournalMismatch as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Stopped as stop:
        print(f"stopped by {stop}; the points measured so far are in {out / JOURNAL_NAME}: "
              f"rerun the same command with --resume to finish", file=sys.stderr)
        return EXIT_SIGNALS[stop.signum]
    # The table first: if writing fails, the results are on screen (and in the journal) all the same.
    print(markdown_table(result), flush=True)
    for path in write_all(result, out):
        print(f"wrote {path}")
    print(f"sweep took {result['elapsed_s']:.0f} s ({result['points_measured']} points measured, "
          f"{result['points_reused']} taken from {out / JOURNAL_NAME})")
    return 0


# Benchmarks of their own, each a module with ``main(argv) -> int``: ``weightformer bench NAME ...``.
SUITES: Dict[str, Tuple[str, str]] = {
    "dense": ("weightformer.bench.dense", "backbone cost at detection/segmentation sizes (GFLOPs, params, memory, img/s)"),
    "dit": ("weightformer.bench.dit", "WeightFormer-DiT against DiT across latent sizes (time and memory)"),
}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``weightformer bench``: a suite named first (:data:`SUITES`), else the sweep."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in SUITES:
        from importlib import import_module

        return int(import_module(SUITES[argv[0]][0]).main(argv[1:]) or 0)
    parser = argparse.ArgumentParser(prog="weightformer bench")  # one-line errors: add_arguments
    add_arguments(parser)
    parser.description = DESCRIPTION + "\n\nOther suites: " + "; ".join(
        f"`weightformer bench {name}` ({text})" for name, (_, text) in SUITES.items())
    return run(parser.parse_args(argv), command=shlex.join(["weightformer", "bench", *argv]))
