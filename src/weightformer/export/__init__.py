"""Ship a trained classifier: timm's Hugging Face Hub layout, ONNX and ``torch.export`` (``.pt2``), all
with dynamic batch and image sizes; ``weightformer export`` is the command line over these functions."""

from .hub import model_card, push_to_hub, to_hf
from .onnx import check_onnx, to_onnx
from .pt2 import export_program, load_pt2, to_pt2
from .source import run_summary, trained_size

__all__ = [
    "check_onnx",
    "export_program",
    "load_pt2",
    "model_card",
    "push_to_hub",
    "run_summary",
    "to_hf",
    "to_onnx",
    "to_pt2",
    "trained_size",
]
