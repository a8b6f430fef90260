"""A pickle that runs code when loaded: the tests check that no loader of ours ever runs it."""

from __future__ import annotations

from pathlib import Path


class CodeRunningPickle:
    """Unpickling this calls ``open(marker, "w")``: the marker file appears if a loader runs pickled code."""

    def __init__(self, marker: Path | str):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))
