"""``python -m weightformer.bench``: the benchmark sweep, without going through the ``weightformer`` CLI."""

import argparse
import sys

from .cli import add_arguments, run


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m weightformer.bench", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
