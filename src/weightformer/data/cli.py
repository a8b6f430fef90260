"""``weightformer data pack | verify``: a thin command line over :mod:`.pack`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _pack(args: argparse.Namespace) -> int:
    from .pack import pack_dataset

    info = pack_dataset(args.source, args.out, shard_size=args.shard_size, splits=args.splits, seed=args.seed,
                        overwrite=args.overwrite)
    for split, entry in info["splits"].items():
        print(f"{split}: {entry['num_samples']} samples of {info['num_classes']} classes in "
              f"{len(entry['filenames'])} shard(s)")
    skipped = f"; {len(info['skipped'])} unreadable source file(s) left out" if info["skipped"] else ""
    print(f"wrote {args.out}{skipped}; check it with: weightformer data verify {args.out}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from .pack import verify_shards

    reports = verify_shards(args.out, decode=not args.no_decode, workers=args.workers)
    for report in reports:
        print(f"{report.name}: {report.samples} samples in {report.shards} shard(s), "
              f"{sum(1 for n in report.class_counts if n)} of {len(report.class_counts)} classes present"
              f"{'' if report.problems else ': ok'}")
    problems = [f"{report.name}/: {', '.join(report.problems)}" for report in reports if report.problems]
    if problems:
        print(f"error: {args.out} does not match its info: {'; '.join(problems)}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``weightformer data pack SRC OUT ...`` and ``weightformer data verify OUT ...``."""
    from ..engine.cli import OneLineParser, run_reporting_errors

    parser = OneLineParser(prog="weightformer data", description="Data sets as webdataset tar shards.")
    sub = parser.add_subparsers(dest="command", required=True)
    pack = sub.add_parser("pack", help="write an ImageFolder tree or a bundled set as tar shards",
                          description="Write SRC (an ImageFolder tree SRC/<split>/<class>/*, or a bundled set such "
                                      "as mnist) as OUT/<split>/<split>-000000.tar, ... and OUT/_info.json. An "
                                      "interrupted pack continues when run again with the same arguments.")
    pack.add_argument("source", metavar="SRC", help="an ImageFolder tree or a bundled data set's name")
    pack.add_argument("out", metavar="OUT", help="the folder to write")
    pack.add_argument("--shard-size", type=int, default=1000, metavar="SAMPLES",
                      help="samples per shard (default: 1000, about 110 MB of ImageNet JPEGs)")
    pack.add_argument("--splits", nargs="+", default=["train", "val"], help="splits to pack (default: train val)")
    pack.add_argument("--seed", type=int, default=0, help="seed of the sample order's shuffle (default: 0)")
    pack.add_argument("--overwrite", action="store_true", help="move an existing OUT aside (never deleted)")
    verify = sub.add_parser("verify", help="read the shards back and check them against OUT/_info.json",
                            description="Count the samples and classes of every split, and report truncated tars, "
                                        "samples without a label and undecodable images; exit 1 on any mismatch.")
    verify.add_argument("out", metavar="OUT", help="the folder `weightformer data pack` wrote")
    verify.add_argument("--no-decode", action="store_true", help="count only; do not decode the images")
    verify.add_argument("--workers", type=int, help="processes reading shards (default: one per core, at most 8)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.command == "pack" and args.shard_size < 1:
        parser.error(f"--shard-size must be at least 1, got {args.shard_size}")
    return run_reporting_errors(lambda: (_pack if args.command == "pack" else _verify)(args))
