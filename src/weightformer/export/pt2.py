"""``torch.export`` with a dynamic batch, height and width: an ExportedProgram file (``.pt2``), or an
AOTInductor package compiled from it. Both load in a fresh process without the model's code."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn
from torch.export import Dim

from ..engine.outputs import output_file
from .onnx import _example, check_sizes
from .sizes import check_export_sizes

__all__ = ["export_program", "load_pt2", "to_pt2"]


def export_program(model: nn.Module, in_chans: int = 3, img_size: int | Sequence[int] = 224) -> torch.export.ExportedProgram:
    """``torch.export`` of ``model`` in eval mode, traced at 2 × ``img_size`` with batch, height and width
    ``Dim.AUTO``; an ``img_size`` it cannot be traced at is a ConfigError first."""
    size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    check_export_sizes(model, in_chans, size, check_sizes(size)[1:])
    with torch.no_grad():
        return torch.export.export(model.eval(), (_example(in_chans, size),),
                                   dynamic_shapes=({0: Dim.AUTO, 2: Dim.AUTO, 3: Dim.AUTO},))


def to_pt2(model: nn.Module, path: str | Path, in_chans: int = 3, img_size: int | Sequence[int] = 224,
           aoti: bool = False, overwrite: bool = False) -> Path:
    """Write ``model`` as a ``.pt2`` ExportedProgram, or with ``aoti`` an AOTInductor package, atomically."""
    program = export_program(model, in_chans, img_size)
    path = Path(path)
    with output_file(path, overwrite) as tmp:
        if aoti:
            torch._inductor.aoti_compile_and_package(program, package_path=str(tmp))
        else:
            torch.export.save(program, tmp)
    return path


def load_pt2(path: str | Path) -> nn.Module:
    """A callable module from a file written by :func:`to_pt2` (either kind)."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        compiled = any(name.endswith(".so") or "/aotinductor/" in name for name in archive.namelist())
    if compiled:
        return torch._inductor.aoti_load_package(str(path))
    return torch.export.load(str(path)).module()
