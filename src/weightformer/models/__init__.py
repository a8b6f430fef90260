"""WeightFormer models, registered with timm on import."""

from .weightformer import Block, WeightFormer, checkpoint_filter_fn, is_dynamic_block

__all__ = ["Block", "WeightFormer", "checkpoint_filter_fn", "is_dynamic_block"]

from .layer_decay import layer_decay_param_groups
from .pyramid import SimpleFeaturePyramid, build_backbone

__all__ += ["SimpleFeaturePyramid", "build_backbone", "layer_decay_param_groups"]
