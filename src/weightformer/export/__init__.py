"""Ship a trained classifier: timm's Hub layout, ONNX and ``torch.export`` (``.pt2``), with dynamic batch and image
sizes (``weightformer export``). The names are imported on first use, so ``--help`` imports no torch."""

from ..lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "model_card": "hub", "push_to_hub": "hub", "to_hf": "hub", "check_onnx": "onnx", "to_onnx": "onnx",
    "export_program": "pt2", "load_pt2": "pt2", "to_pt2": "pt2", "run_summary": "source", "trained_size": "source",
})

__all__ = ["check_onnx", "export_program", "load_pt2", "model_card", "push_to_hub", "run_summary", "to_hf", "to_onnx",
           "to_pt2", "trained_size"]
