"""WeightFormer: linear-time global visual modelling with input-predicted weights instead of attention.

Importing the package registers ``weightformer_tiny``, ``weightformer_small`` and
``weightformer_base`` with timm, so ``timm.create_model("weightformer_tiny")`` works.
"""

from . import checkpoint  # noqa: F401  (reads the authors' pickled yacs config safely)
from . import tasks  # noqa: F401  (registers the built-in tasks with the engine, by import path)
from .layers import DynamicDWConv, DynamicLinear, attention_as_mlp
from .models import WeightFormer

__version__ = "0.1.0"
__all__ = ["DynamicDWConv", "DynamicLinear", "WeightFormer", "attention_as_mlp", "__version__"]
