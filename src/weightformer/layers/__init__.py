"""WeightFormer layers: dynamic linear and depthwise-conv layers, and attention seen as a dynamic MLP."""

from . import long_range_predictors  # noqa: F401  (its predictors join the registries as it is imported)
from .attention_mlp import attention_as_mlp
from .dynamic_dwconv import DWCONV_PREDICTORS, DynamicDWConv, dynamic_dwconv_reference
from .dynamic_linear import LINEAR_PREDICTORS, DynamicLinear, dynamic_linear_reference, pool_2x2

__all__ = ["DWCONV_PREDICTORS", "LINEAR_PREDICTORS", "DynamicDWConv", "DynamicLinear", "attention_as_mlp",
           "dynamic_dwconv_reference", "dynamic_linear_reference", "pool_2x2"]
