"""Layer-wise learning-rate decay for a whole detector or segmenter with a timm backbone inside.

ViTDet scales the learning rate of block i of L by ``layer_decay ** (L - i)``, the stem (patch embedding,
position embedding, class token) by ``layer_decay ** (L + 1)``, and trains the neck, the heads and every
other backbone parameter, the final norm included, at the base rate (detectron2's
``get_vit_lr_decay_rate``; timm's ``group_matcher`` would merge the final norm into the last block).

timm's ``param_groups_layer_decay`` reads the layers from the model's ``group_matcher``, which a detector
wrapping the backbone lacks (timm would put every parameter in one group), so it is called on the
backbone module itself. The groups carry an ``lr_scale`` that only timm's schedulers
(``create_scheduler_v2``, as the engine uses) apply; a ``torch.optim`` scheduler ignores it.

Example, runnable as is (a tiny random WeightFormer in a torchvision Mask R-CNN)::

    from timm.optim import create_optimizer_v2
    from timm.scheduler import create_scheduler_v2
    from torchvision.models.detection import MaskRCNN
    from weightformer.models.layer_decay import layer_decay_param_groups
    from weightformer.models.pyramid import SimpleFeaturePyramid, build_backbone

    backbone = build_backbone("weightformer_tiny", embed_dim=32, depth=3)
    detector = MaskRCNN(SimpleFeaturePyramid(backbone, out_channels=64), num_classes=91)
    groups = layer_decay_param_groups(detector, "backbone.backbone", weight_decay=0.1, layer_decay=0.7)
    optimizer = create_optimizer_v2(groups, opt="adamw", lr=1e-4)
    scheduler, _ = create_scheduler_v2(optimizer, sched="cosine", num_epochs=12, warmup_epochs=1,
                                       step_on_epochs=False, updates_per_epoch=100)
    scheduler.step_update(num_updates=200)  # the engine calls this after every optimizer step
    print(sorted({round(g["lr"], 8) for g in optimizer.param_groups}))
    # 5 rates, 0.7 apart:
    # [2.24e-05, 3.2e-05, 4.572e-05, 6.531e-05, 9.33e-05]: stem, block 0, block 1,
    # block 2, the final norm with the neck and heads
"""

import fnmatch
import re
from typing import Any, Collection, Dict, List, Set, Tuple, Union

from timm.models import group_parameters
from timm.models._manipulate import MATCH_PREV_GROUP
from timm.optim import param_groups_layer_decay
from torch import nn

__all__ = ["layer_decay_param_groups"]


def _matches(name: str, patterns: Collection[str]) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in patterns)


def _above_blocks(module: nn.Module) -> Set[str]:
    """Names of ``module``'s parameters that are neither stem nor block: those its ``group_matcher``
    matches only with an entry that merges into the previous group (timm's ``MATCH_PREV_GROUP``, the
    final norm's), or matches not at all. (A callable matcher: none.)"""
    matcher = module.group_matcher(coarse=False)
    if not isinstance(matcher, dict):
        return set()
    patterns = []
    for spec in matcher.values():
        for entry in spec if isinstance(spec, (list, tuple)) else [spec]:
            if isinstance(entry, str):
                patterns.append(re.compile(entry))
            elif entry is not None and tuple(entry[1] or ()) != MATCH_PREV_GROUP:
                patterns.append(re.compile(entry[0]))
    return {n for n, _ in module.named_parameters() if not any(p.match(n) for p in patterns)}


def _find_backbone(model: nn.Module, backbone: Union[str, nn.Module]) -> Tuple[nn.Module, str]:
    """(the backbone module, its name in ``model``), from a dotted path or the module itself."""
    if isinstance(backbone, str):
        return model.get_submodule(backbone), backbone
    for name, module in model.named_modules():
        if module is backbone:
            return module, name
    raise ValueError(f"the backbone {type(backbone).__name__} is not a submodule of the {type(model).__name__} given")


def layer_decay_param_groups(model: nn.Module, backbone: Union[str, nn.Module], weight_decay: float,
                             layer_decay: float, no_weight_decay_list: Collection[str] = ()) -> List[Dict[str, Any]]:
    """Optimizer parameter groups for ``model``: per-layer ``lr_scale`` on the backbone, 1.0 elsewhere.

    Args:
        model: the whole network (detector, segmenter), or the backbone alone.
        backbone: the timm backbone inside ``model``, as a dotted path (``"backbone.backbone"``) or the
            module itself; it must have ``group_matcher`` (WeightFormer, timm's ViT/DeiT do).
        weight_decay: for weights of 2+ dimensions; 1-D parameters (norms, biases), the backbone's
            ``no_weight_decay()`` and names matching ``no_weight_decay_list`` get none.
        layer_decay: the factor per layer, in (0, 1].
        no_weight_decay_list: fnmatch patterns on parameter names in ``model`` (e.g. ``"*.rel_pos_*"``).

    Returns:
        groups of ``params``, ``weight_decay`` and ``lr_scale``, covering every trainable parameter of
        ``model`` exactly once; an lr only results under a timm scheduler (see the module docstring).
    """
    if not 0.0 < layer_decay <= 1.0:
        raise ValueError(f"layer_decay must be in (0, 1], got {layer_decay}")
    module, name = _find_backbone(model, backbone)
    if not hasattr(module, "group_matcher"):
        raise ValueError(f"the backbone {name or type(module).__name__!r} ({type(module).__name__}) has no "
                         f"group_matcher, so timm would put all its layers into one group; pass the timm model "
                         f"inside it (for SimpleFeaturePyramid, its .backbone)")
    layer_of = group_parameters(module, module.group_matcher(coarse=False), reverse=True)
    if max(layer_of.values()) == 0:
        raise ValueError(f"the group_matcher of {type(module).__name__} puts every parameter into one layer")
    prefix = f"{name}." if name else ""
    backbone_no_wd = set(getattr(module, "no_weight_decay", set)()) | {
        n for n, _ in module.named_parameters() if _matches(prefix + n, no_weight_decay_list)
    }
    groups = param_groups_layer_decay(module, weight_decay=weight_decay, no_weight_decay_list=backbone_no_wd,
                                      layer_decay=layer_decay)
    for group in groups:  # timm puts the backbone's last layer at 1; the neck and heads are one layer above
        group["lr_scale"] *= layer_decay
    above = {id(p) for n, p in module.named_parameters() if n in _above_blocks(module)}
    for group in list(groups):  # the final norm: out of the last block's group, to the neck's rate
        moved = [p for p in group["params"] if id(p) in above]
        if moved:
            group["params"] = [p for p in group["params"] if id(p) not in above]
            groups.append({"params": moved, "weight_decay": group["weight_decay"], "lr_scale": 1.0})
    groups = [g for g in groups if g["params"]]

    in_backbone = {id(p) for p in module.parameters()}
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if not p.requires_grad or id(p) in in_backbone:
            continue
        (no_decay if p.ndim <= 1 or _matches(n, no_weight_decay_list) else decay).append(p)
    if decay:
        groups.append({"params": decay, "weight_decay": weight_decay, "lr_scale": 1.0})
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0, "lr_scale": 1.0})
    return groups
