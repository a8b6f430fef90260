"""Layer-wise learning-rate decay for a whole detector or segmenter with a timm backbone inside.

ViTDet (detectron2's ``get_vit_lr_decay_rate``) scales the rate of block i of L by ``layer_decay ** (L - i)``,
the stem by ``layer_decay ** (L + 1)``, and trains the neck, the heads and the backbone's final norm at the
base rate. timm's ``param_groups_layer_decay`` is called on the backbone itself (a detector has no
``group_matcher``). The groups carry an ``lr_scale`` that only timm's schedulers apply.
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
    """Names of ``module``'s parameters that its ``group_matcher`` matches only with a ``MATCH_PREV_GROUP``
    entry (the final norm's) or not at all; none for a callable matcher."""
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
    """Groups of ``params``, ``weight_decay`` and ``lr_scale`` (per layer on the backbone, 1.0 elsewhere)
    covering every trainable parameter of ``model`` once. ``backbone``: a dotted path or the module, with a
    ``group_matcher``. 1-D parameters, the backbone's ``no_weight_decay()`` and names matching the fnmatch
    patterns ``no_weight_decay_list`` get no weight decay."""
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
