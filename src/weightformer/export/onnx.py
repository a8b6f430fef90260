"""ONNX export (the dynamo exporter) with a dynamic batch, height and width, checked in onnxruntime at more than
one size; WeightFormer's dynamic layers switch to size-following traced forms while it traces."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..engine.errors import ConfigError, NonFiniteError
from ..engine.outputs import output_file
from .sizes import check_export_sizes

__all__ = ["DYNAMIC_AXES", "check_onnx", "check_opset", "onnx_opsets", "to_onnx"]

INPUT_NAME, OUTPUT_NAME = "images", "logits"
DYNAMIC_AXES = {0: "batch", 2: "height", 3: "width"}


def _example(in_chans: int, size: Sequence[int], batch: int = 2) -> torch.Tensor:
    # Batch 2, not 1: tracers specialise sizes 0 and 1, which would fix the batch.
    return torch.randn(batch, in_chans, *size, generator=torch.Generator().manual_seed(0))


def onnx_opsets() -> range:
    """The ONNX opsets this torch.onnx can write: torchlib's opset (18) up to the maximum of onnxscript's version
    converter (and ONNX's own)."""
    import onnx.defs
    from torch.onnx._internal.exporter import _constants

    low = int(_constants.TORCHLIB_OPSET)
    try:
        from onnxscript.version_converter._version_converter import SUPPORTED_MAX_ONNX_OPSET as high
    except ImportError:  # another onnxscript layout: torch's own bound
        from torch.onnx._constants import ONNX_MAX_OPSET as high
    return range(low, min(int(high), onnx.defs.onnx_opset_version()) + 1)


def check_opset(opset: int | None) -> None:
    """ConfigError unless ``opset`` is None (the exporter's default) or one :func:`onnx_opsets` writes."""
    if opset is None:
        return
    opsets = onnx_opsets()
    if opset not in opsets:
        raise ConfigError(f"--opset {opset}: this torch.onnx writes ONNX opsets {opsets.start} to {opsets.stop - 1}; "
                          f"pass one of them, or leave --opset out for the exporter's default")


def _written_opset(path: Path) -> int | None:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), None)


def check_sizes(size: Sequence[int]) -> list[tuple[int, int, int]]:
    """(batch, height, width) the export is checked at: the example's, then two other batches at the shapes
    320×256 and 208×272 (an odd 13×17 token grid) are of 224×224."""
    h, w = size
    return [(2, h, w), (1, h * 10 // 7, w * 8 // 7), (3, h * 13 // 14, w * 17 // 14)]


def to_onnx(model: nn.Module, path: str | Path, in_chans: int = 3, img_size: int | Sequence[int] = 224,
            opset: int | None = None, overwrite: bool = False, check: bool = True,
            check_at: Iterable[Sequence[int]] | None = None, atol: float = 1e-4) -> dict[str, float]:
    """Export ``model`` (eval mode) to ``path``: input ``images`` (B, in_chans, H, W), output ``logits``, all dynamic,
    traced at 2 × ``img_size``. With ``check``, onnxruntime must match PyTorch within ``atol`` at that size and
    at ``check_at`` (default :func:`check_sizes`); returns the largest difference at each. A bad ``opset`` or
    ``img_size`` is a ConfigError before any tracing."""
    size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    check_opset(opset)
    sizes = [tuple(s) for s in (check_at or check_sizes(size))]
    model = model.eval()
    check_export_sizes(model, in_chans, size, sizes)
    example = _example(in_chans, size)
    with output_file(Path(path), overwrite) as tmp:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.onnx")
            torch.onnx.export(model, (example,), str(tmp), dynamo=True, external_data=False, opset_version=opset,
                              input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                              dynamic_shapes={"x": DYNAMIC_AXES} if _forward_arg(model) == "x" else (DYNAMIC_AXES,),
                              verbose=False)
        written = _written_opset(tmp) if opset is not None else None
        if opset is not None and written != opset:  # the converter gave up and kept its own opset
            raise ConfigError(f"--opset {opset}: the exporter could not convert this model to opset {opset} and "
                              f"wrote opset {written}; pass --opset {written}, or leave --opset out")
        diffs = check_onnx(tmp, model, in_chans, sizes, atol) if check else {}
    return diffs


def _forward_arg(model: nn.Module) -> str:
    import inspect

    return next(iter(inspect.signature(model.forward).parameters))


def check_onnx(path: str | Path, model: nn.Module, in_chans: int, sizes: Iterable[Sequence[int]],
               atol: float = 1e-4) -> dict[str, float]:
    """Run the ONNX file in onnxruntime (CPU) at each (batch, height, width) and compare with ``model``:
    ``{"BxHxW": max |difference|}``, a ``RuntimeError`` (a bug, not a user's mistake) when one exceeds ``atol``."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    diffs = {}
    for batch, h, w in sizes:
        x = _example(in_chans, (h, w), batch)
        with torch.no_grad():
            expected = model(x).numpy()
        if not np.isfinite(expected).all():
            raise NonFiniteError(f"the model gave non-finite logits (NaN or Inf) at {batch}x{in_chans}x{h}x{w}; no export "
                                 f"is given from them")
        got = session.run([OUTPUT_NAME], {INPUT_NAME: x.numpy()})[0]
        diff = float(np.abs(got - expected).max()) if got.shape == expected.shape else float("inf")
        diffs[f"{batch}x{h}x{w}"] = diff
        if not diff <= atol:
            raise RuntimeError(f"the ONNX export differs from PyTorch at {batch}x{in_chans}x{h}x{w} "
                               f"(max |difference| {diff:.3g} > {atol:g}, output {got.shape} vs {expected.shape})")
    return diffs
