"""``python -m weightformer.bench``: ``weightformer bench`` without going through the ``weightformer`` CLI."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
