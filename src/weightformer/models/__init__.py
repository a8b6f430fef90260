"""WeightFormer models, registered with timm on import."""

from .weightformer import Block, WeightFormer, checkpoint_filter_fn, is_dynamic_block

__all__ = ["Block", "WeightFormer", "checkpoint_filter_fn", "is_dynamic_block"]
