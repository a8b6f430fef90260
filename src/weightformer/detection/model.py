"""Mask R-CNN and Cascade Mask R-CNN on a feature pyramid, from torchvision's parts with ViTDet's heads (a
two-conv RPN head, a 4conv1fc box head and a 4conv mask head, both with LayerNorm).

How the detector trains is its *protocol* (:data:`PROTOCOL_SETTINGS`; docs/dense.md has them point by point):
``vitdet`` (the default), detectron2's as ViTDet's COCO configs and Vim's ``det/`` run it; or ``torchvision``,
torchvision's parts at their defaults with mmdet's cascade stage weights. Explicit keyword arguments
(``rpn_post_nms_top_n_train``, ...) override the protocol's values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from timm.layers import LayerNorm2d
from torch import Tensor, nn
from torchvision.models.detection import MaskRCNN
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.faster_rcnn import FastRCNNConvFCHead, FastRCNNPredictor
from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor
from torchvision.models.detection.rpn import RegionProposalNetwork, RPNHead
from torchvision.models.detection.transform import GeneralizedRCNNTransform, resize_boxes
from torchvision.ops import MultiScaleRoIAlign, roi_align
from torchvision.ops import boxes as box_ops
from torchvision.ops.poolers import initLevelMapper

from ..models.pyramid import SimpleFeaturePyramid, build_backbone
from .cascade import STAGE_IOU_THRESHOLDS, AgnosticBoxPredictor, CascadeRoIHeads, MaskRCNNRoIHeads
from .config import DEFAULT_PROTOCOL, PROTOCOLS, SIZE_DIVISOR, canvas_side
from .transforms import resize_image

__all__ = ["FEATURE_NAMES", "PROTOCOL_SETTINGS", "AlignedMultiScaleRoIAlign", "CanvasTransform",
           "L1RegionProposalNetwork", "Protocol", "build_maskrcnn", "detection_pyramid", "detectron2_init"]

FEATURE_NAMES = ["0", "1", "2", "3"]  # the RoI poolers' levels; the RPN also sees "pool" (stride 64)
FEATURE_SCALES = [1 / 4, 1 / 8, 1 / 16, 1 / 32]  # 1 / stride of each of FEATURE_NAMES
ANCHOR_SIZES = ((32,), (64,), (128,), (256,), (512,))  # one size per level, "0" to "pool"
ASPECT_RATIOS = ((0.5, 1.0, 2.0),) * len(ANCHOR_SIZES)
CASCADE_SET = {"box_fg_iou_thresh", "box_bg_iou_thresh", "bbox_reg_weights"}  # MaskRCNN options a cascade fixes
TORCHVISION_BOX_LOSS_BETA = 1 / 9  # the smooth-L1 beta torchvision's RPN and RoI heads fix


@dataclass(frozen=True)
class Protocol:
    """The settings a protocol fixes (see the module docstring)."""

    aligned_roi_align: bool  # RoIAlignV2 (half-pixel aligned, sampling_ratio 0) instead of torchvision's (2, unaligned)
    rpn_post_nms_top_n_train: int
    box_loss_beta: float  # smooth-L1 beta of the RPN's and the box heads' regression; 0 is L1
    stage_loss_weights: tuple[float, ...]
    head_gradient_scale: float  # on the gradient each cascade stage's box head sends back
    sample_later_stages: bool  # cascade stages 2, 3 append the ground truth and resample 512 boxes
    final_norm: bool  # the pyramid reads the backbone's last block after its final norm
    pyramid_init: str  # SimpleFeaturePyramid's conv_init: PyTorch's default, or detectron2's c2_xavier_fill
    detectron2_heads: bool  # RoI heads at detectron2's init and weight decay on all but norms and pos_embed


PROTOCOL_SETTINGS = {
    "vitdet": Protocol(aligned_roi_align=True, rpn_post_nms_top_n_train=1000, box_loss_beta=0.0,
                       stage_loss_weights=(1.0, 1.0, 1.0), head_gradient_scale=1 / len(STAGE_IOU_THRESHOLDS),
                       sample_later_stages=False, final_norm=False, pyramid_init="pytorch",
                       detectron2_heads=True),
    "torchvision": Protocol(aligned_roi_align=False, rpn_post_nms_top_n_train=2000,
                            box_loss_beta=TORCHVISION_BOX_LOSS_BETA, stage_loss_weights=(1.0, 0.5, 0.25),
                            head_gradient_scale=1.0, sample_later_stages=True, final_norm=True,
                            pyramid_init="c2_xavier", detectron2_heads=False),
}
assert tuple(PROTOCOL_SETTINGS) == PROTOCOLS, "config.PROTOCOLS names the same protocols"


def _protocol(name: str) -> Protocol:
    if name not in PROTOCOL_SETTINGS:
        raise ValueError(f"unknown detection protocol {name!r}; choose one of {', '.join(PROTOCOLS)}")
    return PROTOCOL_SETTINGS[name]


class AlignedMultiScaleRoIAlign(MultiScaleRoIAlign):
    """detectron2's ``ROIPooler`` with ``ROIAlignV2``: each box pooled from one level with ``roi_align(aligned=True)``.

    A subclass of torchvision's :class:`MultiScaleRoIAlign` (never aligned; its detectors accept only that type),
    with its arguments and call: boxes in image pixels give (R, C, *output_size) in the order of the concatenated
    boxes. A box goes to level ``floor(canonical_level + log2(sqrt(area) / canonical_scale + 1e-8))``, clamped
    (detectron2's ``assign_boxes_to_levels``); the levels are at :data:`FEATURE_SCALES`. ``sampling_ratio`` 0
    samples ceil(bin size) points per bin side (detectron2's).
    """

    def __init__(self, featmap_names: Sequence[str], output_size: int, sampling_ratio: int = 0,
                 canonical_scale: int = 224, canonical_level: int = 4):
        super().__init__(list(featmap_names), output_size, sampling_ratio, canonical_scale=canonical_scale,
                         canonical_level=canonical_level)

    def forward(self, x: dict[str, Tensor], boxes: list[Tensor], image_shapes: list[tuple[int, int]]) -> Tensor:
        features = [x[name] for name in self.featmap_names]
        scales = FEATURE_SCALES
        k_min, k_max = (-round(math.log2(s)) for s in (scales[0], scales[-1]))
        rois = torch.cat([torch.cat([b.new_full((len(b), 1), i), b], 1) for i, b in enumerate(boxes)])  # (R, 5)
        side = box_ops.box_area(rois[:, 1:]).sqrt()  # (R,)
        level = torch.floor(self.canonical_level + torch.log2(side / self.canonical_scale + 1e-8))
        level = level.clamp(k_min, k_max).to(torch.int64) - k_min  # (R,): index into features
        out = features[0].new_zeros((len(rois), features[0].shape[1], *self.output_size))  # (R, C, S, S)
        for i, (feature, scale) in enumerate(zip(features, scales)):
            idx = torch.where(level == i)[0]
            pooled = roi_align(feature, rois[idx], self.output_size, spatial_scale=scale,
                               sampling_ratio=self.sampling_ratio, aligned=True)
            out[idx] = pooled.to(out.dtype)  # levels may differ in dtype under autocast
        return out


class L1RegionProposalNetwork(RegionProposalNetwork):
    """torchvision's RPN with the box loss's smooth-L1 β as an argument (torchvision fixes 1/9; detectron2 uses 0,
    plain L1). Both losses are over the sampled anchors (torchvision's; detectron2's 256 per image is the same
    number when the sampler fills it)."""

    def __init__(self, *args, box_loss_beta: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.box_loss_beta = box_loss_beta

    def compute_loss(self, objectness: Tensor, pred_bbox_deltas: Tensor, labels: list[Tensor],
                     regression_targets: list[Tensor]) -> tuple[Tensor, Tensor]:
        positive, negative = self.fg_bg_sampler(labels)  # per image, (A_i,) masks
        positive = torch.where(torch.cat(positive))[0]
        sampled = torch.cat([positive, torch.where(torch.cat(negative))[0]])
        targets = torch.cat(regression_targets)  # (A, 4)
        box_loss = F.smooth_l1_loss(pred_bbox_deltas[positive], targets[positive], beta=self.box_loss_beta,
                                    reduction="sum") / sampled.numel()
        objectness_loss = F.binary_cross_entropy_with_logits(objectness.flatten()[sampled], torch.cat(labels)[sampled])
        return objectness_loss, box_loss


def _roi_pool(aligned: bool, size: int) -> nn.Module:
    """The ``size``² RoI pooler over FEATURE_NAMES: RoIAlignV2 (aligned, adaptive sampling), or
    torchvision's (unaligned, 2×2 samples per bin) at FEATURE_SCALES, which torchvision would otherwise infer
    from the first batch's largest image, smaller than the canvas."""
    if aligned:
        return AlignedMultiScaleRoIAlign(FEATURE_NAMES, output_size=size, sampling_ratio=0)
    pool = MultiScaleRoIAlign(FEATURE_NAMES, output_size=size, sampling_ratio=2)
    pool.scales = FEATURE_SCALES
    pool.map_levels = initLevelMapper(2, 5, pool.canonical_scale, pool.canonical_level)  # levels of strides 4..32
    return pool


def detectron2_init(module: nn.Module) -> nn.Module:
    """``module``'s box-head fcs at c2_xavier_fill and its predictors at detectron2's small normals, all biases 0
    (detectron2's FastRCNNConvFCHead, FastRCNNOutputLayers, MaskRCNNConvUpsampleHead); the convs keep
    torchvision's init, which is detectron2's c2_msra_fill (the mask head's deconv is given its zero bias)."""
    stds = {"cls_score": 0.01, "bbox_pred": 0.001, "mask_fcn_logits": 0.001}
    for name, layer in module.named_modules():
        leaf = name.rpartition(".")[2]
        if leaf in stds:
            nn.init.normal_(layer.weight, std=stds[leaf])
        elif isinstance(layer, nn.Linear):  # a box head's fc
            nn.init.kaiming_uniform_(layer.weight, a=1)
        if leaf in stds or isinstance(layer, (nn.Linear, nn.ConvTranspose2d)):
            nn.init.zeros_(layer.bias)
    return module


class CanvasTransform(GeneralizedRCNNTransform):
    """torchvision's transform (resize to short side ``min_size``, long side at most ``max_size``; normalise)
    with PIL's bilinear resampling (antialiased), batching each image at the top left of one ``canvas``² of
    zeros (the mean, normalised), as detectron2's ViTDet pads to 1024² in training and test: the backbone's
    dynamic weights pool the whole input, so an image's outputs do not depend on what else is in its batch."""

    def __init__(self, min_size: int, max_size: int, image_mean: list[float], image_std: list[float], canvas: int,
                 **kwargs: Any):
        super().__init__(min_size, max_size, image_mean, image_std, **kwargs)
        if canvas < max_size or canvas % SIZE_DIVISOR:
            raise ValueError(f"canvas {canvas} must be a multiple of {SIZE_DIVISOR} of at least max_size {max_size}")
        self.canvas = canvas

    def resize(self, image: Tensor, target: Optional[dict[str, Tensor]] = None
               ) -> tuple[Tensor, Optional[dict[str, Tensor]]]:
        height, width = image.shape[-2:]
        side = self.torch_choice(self.min_size) if self.training else self.min_size[-1]
        scale = min(side / min(height, width), self.max_size / max(height, width))
        size = (int(height * scale), int(width * scale))  # floor: the long side stays within max_size
        if size != (height, width):
            image = resize_image(image, size)
            if target is not None:
                target["boxes"] = resize_boxes(target["boxes"], (height, width), size)
                if "masks" in target:
                    target["masks"] = F.interpolate(target["masks"][:, None].float(), size=size)[:, 0].byte()
        return image, target

    def batch_images(self, images: list[Tensor], size_divisible: int = SIZE_DIVISOR) -> Tensor:
        batch = images[0].new_zeros((len(images), images[0].shape[0], self.canvas, self.canvas))
        for padded, image in zip(batch, images):
            padded[:, :image.shape[-2], :image.shape[-1]].copy_(image)
        return batch


def detection_pyramid(backbone: nn.Module, channels: int, protocol: str = DEFAULT_PROTOCOL) -> SimpleFeaturePyramid:
    """The simple feature pyramid of ``channels`` channels on timm model ``backbone``, as ``protocol``
    builds it (vitdet: on the last block without the final norm, convs at PyTorch's default init)."""
    rules = _protocol(protocol)
    return SimpleFeaturePyramid(backbone, out_channels=channels, final_norm=rules.final_norm,
                                conv_init=rules.pyramid_init)


def _pyramid(backbone: Union[str, nn.Module], pretrained: bool, channels: int, protocol: str) -> nn.Module:
    """``backbone`` itself, or timm model ``backbone`` behind the protocol's simple feature pyramid."""
    if isinstance(backbone, str):
        return detection_pyramid(build_backbone(backbone, pretrained=pretrained), channels, protocol)
    if not hasattr(backbone, "out_channels"):
        raise ValueError(f"backbone {type(backbone).__name__} has no out_channels attribute; pass a feature "
                         "pyramid returning {'0','1','2','3','pool'} with out_channels, or a timm model name")
    return backbone


def build_maskrcnn(backbone: Union[str, nn.Module], num_classes: int, cascade: bool = False, min_size: int = 800,
                   max_size: int = 1333, *, canvas: Optional[int] = None, protocol: str = DEFAULT_PROTOCOL,
                   conv_dim: int = 256, fc_dim: int = 1024,
                   norm_layer: Optional[Callable[[int], nn.Module]] = LayerNorm2d, pretrained: bool = False,
                   **kwargs: Any) -> MaskRCNN:
    """A torchvision Mask R-CNN, or with ``cascade`` a Cascade Mask R-CNN.

    ``backbone``: a module mapping (B, 3, H, W) to feature maps "0" to "3" (strides 4 to 32) and "pool" (64),
    all of ``backbone.out_channels`` (:func:`detection_pyramid` builds one by the protocol); or a timm model
    name, built by :func:`~weightformer.models.pyramid.build_backbone` (timm's weights if ``pretrained``) behind
    the protocol's pyramid of ``conv_dim`` channels. ``num_classes`` counts the background (label 0): K + 1.
    Images are resized to short side ``min_size``, long side at most ``max_size`` (ViTDet: both 1024), and
    batched on one ``canvas``² (default :func:`canvas_side` of ``max_size``; :class:`CanvasTransform`).
    ``conv_dim`` / ``fc_dim``: the RoI heads' conv and fc widths; ``norm_layer``: their norm (None for none).
    Other keyword arguments go to torchvision's :class:`MaskRCNN` (``rpn_*``, ``box_*``, ``image_mean``, ...).

    Training: ``model(images, targets)`` returns a dict of losses. Eval: ``model(images)`` returns per image
    boxes (N, 4) xyxy, labels (N,), scores (N,) and masks (N, 1, H, W) in the input image's pixels.
    """
    rules = _protocol(protocol)
    if cascade and CASCADE_SET & kwargs.keys():
        raise ValueError(f"{sorted(CASCADE_SET & kwargs.keys())} are set per stage in a cascade "
                         "(cascade.STAGE_IOU_THRESHOLDS, STAGE_REG_WEIGHTS); drop them or use cascade=False")
    backbone = _pyramid(backbone, pretrained, conv_dim, protocol)
    channels = backbone.out_channels
    anchors = AnchorGenerator(ANCHOR_SIZES, ASPECT_RATIOS)
    box_roi_pool = _roi_pool(rules.aligned_roi_align, 7)

    def box_head() -> nn.Module:
        return FastRCNNConvFCHead((channels, 7, 7), [conv_dim] * 4, [fc_dim], norm_layer=norm_layer)

    kwargs.setdefault("rpn_post_nms_top_n_train", rules.rpn_post_nms_top_n_train)
    model = MaskRCNN(
        backbone, num_classes=None, min_size=min_size, max_size=max_size, rpn_anchor_generator=anchors,
        rpn_head=RPNHead(channels, anchors.num_anchors_per_location()[0], conv_depth=2), box_roi_pool=box_roi_pool,
        box_head=box_head(), box_predictor=FastRCNNPredictor(fc_dim, num_classes),
        mask_roi_pool=_roi_pool(rules.aligned_roi_align, 14),
        mask_head=MaskRCNNHeads(channels, [conv_dim] * 4, 1, norm_layer=norm_layer),
        mask_predictor=MaskRCNNPredictor(conv_dim, conv_dim, num_classes), **kwargs)
    model.transform = CanvasTransform(min_size, max_size, model.transform.image_mean, model.transform.image_std,
                                      canvas or canvas_side(max_size))
    rpn, plain = model.rpn, model.roi_heads
    if rules.detectron2_heads:
        detectron2_init(plain)
    if rules.box_loss_beta != TORCHVISION_BOX_LOSS_BETA:
        model.rpn = L1RegionProposalNetwork(
            rpn.anchor_generator, rpn.head, rpn.proposal_matcher.high_threshold, rpn.proposal_matcher.low_threshold,
            rpn.fg_bg_sampler.batch_size_per_image, rpn.fg_bg_sampler.positive_fraction, rpn._pre_nms_top_n,
            rpn._post_nms_top_n, rpn.nms_thresh, rpn.score_thresh, box_loss_beta=rules.box_loss_beta,
        )
        if not cascade:
            model.roi_heads = MaskRCNNRoIHeads(
                plain.box_roi_pool, plain.box_head, plain.box_predictor, plain.proposal_matcher.high_threshold,
                plain.proposal_matcher.low_threshold, plain.fg_bg_sampler.batch_size_per_image,
                plain.fg_bg_sampler.positive_fraction, plain.box_coder.weights, plain.score_thresh,
                plain.nms_thresh, plain.detections_per_img, plain.mask_roi_pool, plain.mask_head,
                plain.mask_predictor, box_loss_beta=rules.box_loss_beta,
            )
    if cascade:
        model.roi_heads = CascadeRoIHeads(
            box_roi_pool, [plain.box_head] + [detectron2_init(box_head()) if rules.detectron2_heads else box_head()
                                              for _ in STAGE_IOU_THRESHOLDS[1:]],
            [AgnosticBoxPredictor(fc_dim, num_classes) for _ in STAGE_IOU_THRESHOLDS], plain.mask_roi_pool,
            plain.mask_head, plain.mask_predictor, loss_weights=rules.stage_loss_weights,
            head_gradient_scale=rules.head_gradient_scale, box_loss_beta=rules.box_loss_beta,
            sample_later_stages=rules.sample_later_stages, positive_fraction=plain.fg_bg_sampler.positive_fraction,
            batch_size_per_image=plain.fg_bg_sampler.batch_size_per_image, score_thresh=plain.score_thresh,
            nms_thresh=plain.nms_thresh, detections_per_img=plain.detections_per_img)
    return model
