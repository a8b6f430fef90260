"""Mask R-CNN and Cascade Mask R-CNN on a feature pyramid, built from torchvision's detection parts.

The heads follow ViTDet's (Li et al., 2022) choices for a plain backbone behind a simple feature
pyramid: a two-conv RPN head, a 4conv1fc box head and a 4conv mask head, both with LayerNorm.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

from timm.layers import LayerNorm2d
from torch import nn
from torchvision.models.detection import MaskRCNN
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.faster_rcnn import FastRCNNConvFCHead, FastRCNNPredictor
from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor
from torchvision.models.detection.rpn import RPNHead
from torchvision.ops import MultiScaleRoIAlign

from ..models.pyramid import SimpleFeaturePyramid, build_backbone
from .cascade import STAGE_IOU_THRESHOLDS, AgnosticBoxPredictor, CascadeRoIHeads

__all__ = ["FEATURE_NAMES", "build_maskrcnn"]

FEATURE_NAMES = ["0", "1", "2", "3"]  # strides 4, 8, 16, 32; the RPN also sees "pool" (stride 64)
ANCHOR_SIZES = ((32,), (64,), (128,), (256,), (512,))  # one size per level, "0" to "pool"
ASPECT_RATIOS = ((0.5, 1.0, 2.0),) * len(ANCHOR_SIZES)
CASCADE_SET = {"box_fg_iou_thresh", "box_bg_iou_thresh", "bbox_reg_weights"}  # MaskRCNN options a cascade fixes


def _pyramid(backbone: Union[str, nn.Module], pretrained: bool, channels: int) -> nn.Module:
    """``backbone`` itself, or timm model ``backbone`` behind ViTDet's simple feature pyramid."""
    if isinstance(backbone, str):
        return SimpleFeaturePyramid(build_backbone(backbone, pretrained=pretrained), out_channels=channels)
    if not hasattr(backbone, "out_channels"):
        raise ValueError(f"backbone {type(backbone).__name__} has no out_channels attribute; pass a feature "
                         "pyramid returning {'0','1','2','3','pool'} with out_channels, or a timm model name")
    return backbone


def build_maskrcnn(
    backbone: Union[str, nn.Module],
    num_classes: int,
    cascade: bool = False,
    min_size: int = 800,
    max_size: int = 1333,
    *,
    conv_dim: int = 256,
    fc_dim: int = 1024,
    norm_layer: Optional[Callable[[int], nn.Module]] = LayerNorm2d,
    pretrained: bool = False,
    **kwargs: Any,
) -> MaskRCNN:
    """A torchvision Mask R-CNN (``cascade=False``) or Cascade Mask R-CNN (``cascade=True``).

    ``backbone``: a module mapping a (B, 3, H, W) batch to an ordered dict of feature maps "0" to "3"
    (strides 4 to 32) and "pool" (stride 64), all with ``backbone.out_channels`` channels; or a timm
    model name (e.g. "weightformer_tiny"), built by :func:`weightformer.models.pyramid.build_backbone`
    (with timm's ImageNet weights if ``pretrained``) and wrapped in a ``SimpleFeaturePyramid`` of
    ``conv_dim`` channels.
    ``num_classes`` counts the background, as torchvision does: a data set with K categories (COCO:
    80) needs ``K + 1`` (``CocoDetection.num_classes``). Label 0 is background.
    The model resizes each image so its short side is ``min_size`` and its long side at most
    ``max_size``, then normalises it; ViTDet's recipe is ``min_size=max_size=1024``.
    ``conv_dim`` / ``fc_dim``: widths of the RoI heads' convolutions and of the box head's fc layer;
    ``norm_layer``: their normalisation (None for none). Other keyword arguments go to torchvision's
    :class:`MaskRCNN` (``rpn_*``, ``box_*``, ``image_mean``, ``image_std``, ``size_divisible``, ...).

    Training mode: ``model(images, targets)`` returns a dict of losses. Eval mode: ``model(images)``
    returns one dict per image with boxes (N, 4) xyxy, labels (N,), scores (N,) and masks (N, 1, H, W)
    in the input image's pixels.
    """
    if cascade and CASCADE_SET & kwargs.keys():
        raise ValueError(f"{sorted(CASCADE_SET & kwargs.keys())} are set per stage in a cascade "
                         "(cascade.STAGE_IOU_THRESHOLDS, STAGE_REG_WEIGHTS); drop them or use cascade=False")
    backbone = _pyramid(backbone, pretrained, conv_dim)
    channels = backbone.out_channels
    anchors = AnchorGenerator(ANCHOR_SIZES, ASPECT_RATIOS)
    box_roi_pool = MultiScaleRoIAlign(FEATURE_NAMES, output_size=7, sampling_ratio=2)
    mask_roi_pool = MultiScaleRoIAlign(FEATURE_NAMES, output_size=14, sampling_ratio=2)

    def box_head() -> nn.Module:
        return FastRCNNConvFCHead((channels, 7, 7), [conv_dim] * 4, [fc_dim], norm_layer=norm_layer)

    model = MaskRCNN(
        backbone,
        num_classes=None,
        min_size=min_size,
        max_size=max_size,
        rpn_anchor_generator=anchors,
        rpn_head=RPNHead(channels, anchors.num_anchors_per_location()[0], conv_depth=2),
        box_roi_pool=box_roi_pool,
        box_head=box_head(),
        box_predictor=FastRCNNPredictor(fc_dim, num_classes),
        mask_roi_pool=mask_roi_pool,
        mask_head=MaskRCNNHeads(channels, [conv_dim] * 4, 1, norm_layer=norm_layer),
        mask_predictor=MaskRCNNPredictor(conv_dim, conv_dim, num_classes),
        **kwargs,
    )
    if cascade:
        plain = model.roi_heads
        model.roi_heads = CascadeRoIHeads(
            box_roi_pool,
            [plain.box_head] + [box_head() for _ in STAGE_IOU_THRESHOLDS[1:]],
            [AgnosticBoxPredictor(fc_dim, num_classes) for _ in STAGE_IOU_THRESHOLDS],
            plain.mask_roi_pool,
            plain.mask_head,
            plain.mask_predictor,
            batch_size_per_image=plain.fg_bg_sampler.batch_size_per_image,
            positive_fraction=plain.fg_bg_sampler.positive_fraction,
            score_thresh=plain.score_thresh,
            nms_thresh=plain.nms_thresh,
            detections_per_img=plain.detections_per_img,
        )
    return model
