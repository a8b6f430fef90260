"""WeightFormer models, registered with timm on import."""

from .convnext_isotropic import ConvNeXtIsotropic
from .weightformer import Block, WeightFormer, checkpoint_filter_fn, is_dynamic_block
from .weightformer_long_range import weightformer_long_range_small, weightformer_long_range_tiny

__all__ = ["Block", "ConvNeXtIsotropic", "WeightFormer", "checkpoint_filter_fn", "is_dynamic_block",
           "weightformer_long_range_small", "weightformer_long_range_tiny"]

from .layer_decay import layer_decay_param_groups
from .pyramid import SimpleFeaturePyramid, build_backbone

__all__ += ["SimpleFeaturePyramid", "build_backbone", "layer_decay_param_groups"]
