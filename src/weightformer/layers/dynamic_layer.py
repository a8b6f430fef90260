"""What the dynamic layers share: a static weight and bias, a predictor chosen by name from the
registries that each predictor joins where it is defined (:func:`register_predictor`), and the switch
between the fast path and the paper's pseudocode."""

from typing import Callable, Dict, Sequence, Tuple

import torch
from torch import Tensor, nn
from timm.layers import trunc_normal_

__all__ = ["DWCONV_PREDICTORS", "LINEAR_PREDICTORS", "DynamicWeightLayer", "lower_median", "register_predictor"]

LINEAR_PREDICTORS: Dict[str, type] = {}  # name -> ΔW predictor class of DynamicLinear
DWCONV_PREDICTORS: Dict[str, type] = {}  # name -> ΔK predictor class of DynamicDWConv
_REGISTRIES = {"linear": LINEAR_PREDICTORS, "dwconv": DWCONV_PREDICTORS}


def lower_median(x: Tensor, dim: int) -> Tensor:
    """``x.median(dim, keepdim=True).values`` (the lower of the two middle values of an even count; the gradient to
    that element) as a sort: torch 2.14's ``median`` over a dimension of stride 0 (an ``expand``ed tensor) returns
    uninitialised memory, and neither ``median`` nor ``kthvalue`` converts to ONNX; ``sort`` does both right."""
    n = x.shape[dim]
    return x.sort(dim=dim).values.select(dim, (n - 1) // 2).unsqueeze(dim)  # narrow() fails torch.export's shapes


def register_predictor(kind: str, name: str) -> Callable[[type], type]:
    """Class decorator: the class is the ``kind`` ("linear" or "dwconv") predictor called ``name``."""
    registry = _REGISTRIES[kind]

    def register(cls: type) -> type:
        if registry.setdefault(name, cls) is not cls:
            raise ValueError(f"{kind} predictor {name!r} is defined twice ({registry[name].__name__}, {cls.__name__})")
        return cls

    return register


class DynamicWeightLayer(nn.Module):
    """Base of :class:`DynamicLinear` and :class:`DynamicDWConv`: the static ``weight`` and ``bias``, ``predictor =
    predictors[predictor](*predictor_args)``, and ``forward`` running the subclass's ``forward_fast``, or its
    ``forward_reference`` (the paper's pseudocode) when ``use_reference`` is set."""

    def __init__(self, kind: str, predictors: Dict[str, type], predictor: str, predictor_args: Tuple[int, ...],
                 weight_shape: Sequence[int], bias_size: int, device=None, dtype=None):
        super().__init__()
        if predictor not in predictors:
            raise ValueError(f"unknown {kind} predictor {predictor!r}; choose one of {sorted(predictors)}")
        self.predictor_name = predictor
        self.weight = nn.Parameter(torch.empty(*weight_shape, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(bias_size, device=device, dtype=dtype))
        self.predictor = predictors[predictor](*predictor_args, device=device, dtype=dtype)
        self.use_reference = False
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The static weight and bias as in the release: truncated normal, std 0.02 (the predictor has its own)."""
        trunc_normal_(self.weight, std=0.02)
        trunc_normal_(self.bias, std=0.02)

    def forward(self, x: Tensor) -> Tensor:
        if not torch.jit.is_scripting():
            if self.use_reference:
                return self.forward_reference(x)
        return self.forward_fast(x)
