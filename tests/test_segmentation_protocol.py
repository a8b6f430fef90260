"""The ViT UperNet protocol of Vim and BEiT, point by point against the references.

7. Features (hustvl/Vim seg/backbone/vim.py, seg/configs/_base_/models/upernet_vim.py; BEiT's
   semantic_segmentation/backbone/beit.py): four blocks ``out_indices`` spread over the depth, read without
   the final norm, to strides 4 (ConvT, BN, GELU, ConvT), 8 (ConvT), 16 (identity), 32 (max-pool) at the
   backbone's width; UPerHead as wide as the backbone; the auxiliary FCN head on level 2.
8. Recipe (seg/configs/vim/upernet/upernet_vim_small_24_512_slide_60k.py): AdamW 1e-4 at 4 x 8 images,
   weight decay 0.05, layer decay 0.92, poly with 1500 linear warm-up steps, 60k steps, slide 512/341.
   Layer decay (BEiT's LayerDecayOptimizerConstructor, which Vim's seg/mmcv_custom carries): the rule matches
   ``backbone.blocks.<i>``; Vim's backbone names its blocks ``layers``, so Vim's runs decay the stem alone.
9. Sliding inference (mmseg's EncoderDecoder.slide_inference, which decodes a side shorter than the crop as
   it is): here the image is zero-padded to the crop once, so every window is exactly the crop (a named
   difference: a WeightFormer's output depends on its whole canvas, and training crops are padded to the crop).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from weightformer.engine.config import load_config_file, validate_config
from weightformer.engine.distributed import DistInfo
from weightformer.engine.errors import ConfigError
from weightformer.models.multiblock_pyramid import MultiBlockPyramid, spread_indices
from weightformer.models.pyramid import SimpleFeaturePyramid, build_backbone
from weightformer.segmentation import build_upernet, slide_inference, whole_inference
from weightformer.segmentation import recipes
from weightformer.segmentation.config import SegmentationConfig
from weightformer.segmentation.synthetic import write_shapes
from weightformer.segmentation.task import SegmentationTask, build_segmenter

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "segmentation"
VIM_CONFIG = CONFIGS / "ade20k_upernet_weightformer_s_vim_60k.yaml"
ALTERNATIVE_CONFIG = CONFIGS / "ade20k_upernet_weightformer_s_160k.yaml"
ADE20K_TRAIN_IMAGES = 20_210

pytestmark = pytest.mark.usefixtures("one_thread")


def _tiny_backbone(depth: int = 6) -> nn.Module:
    torch.manual_seed(0)
    backbone = build_backbone("weightformer_tiny", embed_dim=32, depth=depth)
    with torch.no_grad():  # a final norm far from identity, so that features read through it would differ
        backbone.norm.weight.uniform_(2.0, 3.0)
        backbone.norm.bias.uniform_(-1.0, 1.0)
    return backbone


def _block_outputs(backbone: nn.Module, images: torch.Tensor) -> list[torch.Tensor]:
    """Every block's output as (B, C, h, w), caught by forward hooks on a plain forward of the backbone."""
    caught: list[torch.Tensor] = []
    hooks = [block.register_forward_hook(lambda _m, _i, out: caught.append(out.permute(0, 3, 1, 2)))
             for block in backbone.blocks]  # WeightFormer's blocks work on (B, h, w, C)
    try:
        backbone.forward_features(images)
    finally:
        for hook in hooks:
            hook.remove()
    return caught


# -- 7. features ---------------------------------------------------------------------------------------


def test_spread_indices_are_vims_for_24_blocks_and_every_fourth_for_17():
    assert spread_indices(24) == [5, 11, 17, 23]  # upernet_vim_{tiny,small}_24_512_slide_60k.py's out_indices
    assert spread_indices(17) == [4, 8, 12, 16]  # WeightFormer-T/S/B
    assert spread_indices(12) == [2, 5, 8, 11]  # mmseg's ViT-B (upernet_vit-b16_ln_mln.py)
    assert spread_indices(4) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="reads 4 different blocks, and the backbone has 3"):
        spread_indices(3)


@pytest.mark.parametrize("out_indices", [[0, 2, 3, 5], [1, 2, 4, 5]])
def test_each_level_is_its_block_resampled_without_the_final_norm(out_indices):
    backbone = _tiny_backbone(depth=6)
    pyramid = MultiBlockPyramid(backbone, out_indices).eval()
    images = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        levels = pyramid(images)
        blocks = _block_outputs(backbone, images)
        # the references' ops, written out: fpn1 = ConvT, BN, GELU, ConvT; fpn2 = ConvT; fpn3 = id; fpn4 = max-pool
        up1, bn, _, up2 = pyramid.levels[0]
        x = blocks[out_indices[0]]
        x = F.conv_transpose2d(x, up1.weight, up1.bias, stride=2)
        x = F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, training=False, eps=bn.eps)
        expected0 = F.conv_transpose2d(F.gelu(x), up2.weight, up2.bias, stride=2)
        deconv = pyramid.levels[1]
        expected1 = F.conv_transpose2d(blocks[out_indices[1]], deconv.weight, deconv.bias, stride=2)
        expected2 = blocks[out_indices[2]]
        expected3 = F.max_pool2d(blocks[out_indices[3]], 2)
    for key, expected in zip("0123", (expected0, expected1, expected2, expected3)):
        torch.testing.assert_close(levels[key], expected)
    normed = backbone.norm(blocks[out_indices[2]].permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
    assert not torch.allclose(levels["2"], normed)  # read before the final norm, as BEiT and Vim do


def test_a_block_not_read_reaches_the_levels_only_through_later_blocks():
    """With blocks 0, 1, 2 and 5 read, perturbing block 4's output changes level 3 (block 5 follows it) and
    leaves levels 0-2, read before it, as they were."""
    backbone = _tiny_backbone(depth=6)
    pyramid = MultiBlockPyramid(backbone, [0, 1, 2, 5]).eval()
    images = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        clean = pyramid(images)
        hook = backbone.blocks[4].register_forward_hook(lambda _m, _i, out: out + 1.0)
        try:
            perturbed = pyramid(images)
        finally:
            hook.remove()
    for key in "012":
        torch.testing.assert_close(perturbed[key], clean[key])
    assert not torch.allclose(perturbed["3"], clean["3"])


@pytest.mark.parametrize("size, grid", [((64, 96), (2, 3)), ((70, 90), (3, 3))])
def test_levels_are_at_strides_4_8_16_32_of_the_padded_input(size, grid):
    pyramid = MultiBlockPyramid(_tiny_backbone(depth=4)).eval()  # 70 x 90 is padded to 96 x 96
    with torch.no_grad():
        levels = pyramid(torch.randn(1, 3, *size))
    assert pyramid.strides == {"0": 4, "1": 8, "2": 16, "3": 32}
    for key, stride in pyramid.strides.items():
        assert levels[key].shape == (1, 32, grid[0] * 32 // stride, grid[1] * 32 // stride)


def test_out_indices_must_be_four_increasing_blocks_ending_with_the_last():
    backbone = _tiny_backbone(depth=6)
    for bad in ([0, 1, 2], [0, 2, 1, 5], [1, 1, 2, 5], [0, 1, 2, 4], [-1, 1, 2, 5], [0, 1, 2, 6]):
        with pytest.raises(ValueError, match="out_indices must be 4 increasing block indices ending with the last"):
            MultiBlockPyramid(backbone, bad)


def test_vim_protocol_head_widths_aux_level_and_blocks_for_weightformer_s():
    model = build_upernet("weightformer_small", num_classes=150, protocol="vim")
    assert isinstance(model.pyramid, MultiBlockPyramid) and model.pyramid.out_indices == [4, 8, 12, 16]
    assert model.pyramid.out_channels == 384
    assert model.head.in_channels == [384] * 4  # upernet_vim_small: in_channels=[384, 384, 384, 384]
    assert model.head.fuse[0].out_channels == 384  # channels=384 (the backbone's width)
    assert model.head.ppm.stages[0][1][0].out_channels == 384
    assert model.aux_level == "2"  # auxiliary_head in_index=2
    aux_conv = model.aux_head.conv[0]
    assert (aux_conv.in_channels, aux_conv.out_channels) == (384, 256)  # in_channels=384, channels=256
    assert model.pyramid.levels[0][1].num_features == 384  # the BN between the two deconvolutions


def test_simple_pyramid_protocol_is_unchanged():
    model = build_upernet("weightformer_tiny", num_classes=3, embed_dim=32, depth=2)
    assert isinstance(model.pyramid, SimpleFeaturePyramid) and model.pyramid.out_channels == 256
    assert model.head.fuse[0].out_channels == 512


def test_auxiliary_head_reads_level_2():
    model = build_upernet(_tiny_backbone(depth=4), num_classes=3, protocol="vim", aux_channels=8).eval()
    seen = {}
    model.pyramid.register_forward_hook(lambda _m, _i, out: seen.update(levels=out))
    model.aux_head.register_forward_pre_hook(lambda _m, args: seen.update(aux_input=args[0]))
    with torch.no_grad():
        model(torch.randn(1, 3, 64, 64), with_aux=True)
    assert seen["aux_input"] is seen["levels"]["2"]


def test_every_trainable_parameter_gets_a_gradient_and_the_final_norm_is_frozen():
    """DistributedDataParallel without find_unused_parameters needs every trainable parameter used."""
    model = build_upernet(_tiny_backbone(depth=4), num_classes=3, protocol="vim", channels=16, aux_channels=8)
    logits, aux = model(torch.randn(2, 3, 64, 64), with_aux=True)
    (logits.square().mean() + aux.square().mean()).backward()
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert frozen == ["pyramid.backbone.norm.weight", "pyramid.backbone.norm.bias"]
    assert [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None] == []


def _beit_lr_scale(name: str, num_layers: int, rate: float) -> float:
    """BEiT's LayerDecayOptimizerConstructor, restated (beit/semantic_segmentation/mmcv_custom/
    layer_decay_optimizer_constructor.py, the file Vim's seg/mmcv_custom uses): layer 0 for backbone.pos_embed,
    cls_token, mask_token and backbone.patch_embed.*, i + 1 for backbone.blocks.<i>.*, num_layers + 1 for every
    other name (the rest of the backbone, the neck, the heads); scale rate ** (num_layers + 1 - layer)."""
    if name in ("backbone.cls_token", "backbone.mask_token", "backbone.pos_embed") or \
            name.startswith("backbone.patch_embed"):
        layer = 0
    elif name.startswith("backbone.blocks"):
        layer = int(name.split(".")[2]) + 1
    else:
        layer = num_layers + 1
    return rate ** (num_layers + 1 - layer)


def test_beits_layer_decay_rule_leaves_vims_own_blocks_at_the_full_rate():
    """Vim's config asks for 0.92 over 24 blocks; its backbone (VisionMamba) names them layers.<i>, so its runs
    train every block, the final norm and the neck at the full rate and decay only the embeddings."""
    vim_names = ["backbone.patch_embed.proj.weight", "backbone.pos_embed", "backbone.layers.0.mixer.in_proj.weight",
                 "backbone.layers.23.mixer.in_proj.weight", "backbone.norm_f.weight", "backbone.fpn1.0.weight",
                 "decode_head.conv_seg.weight"]
    scales = {name: _beit_lr_scale(name, 24, 0.92) for name in vim_names}
    assert scales["backbone.patch_embed.proj.weight"] == scales["backbone.pos_embed"] == pytest.approx(0.92 ** 25)
    assert all(scales[name] == 1.0 for name in vim_names[2:])
    assert _beit_lr_scale("backbone.blocks.0.attn.qkv.weight", 24, 0.92) == pytest.approx(0.92 ** 24)  # BEiT's own
    assert _beit_lr_scale("backbone.blocks.23.attn.qkv.weight", 24, 0.92) == pytest.approx(0.92)


@pytest.mark.parametrize("scope, blocks_named", [("per-block", "blocks"), ("stem-only", "layers")])
def test_layer_decay_scope_is_beits_rule_on_blocks_or_on_vims_layers(scope: str, blocks_named: str):
    """per-block (the default) is BEiT's rule on a backbone whose blocks are named blocks, as BEiT intended;
    stem-only is the same rule on Vim's naming, what Vim's runs do. The frozen final norm is in no group."""
    cfg = validate_config(SegmentationConfig(layer_decay=0.92, weight_decay=0.05, seg_layer_decay=scope))
    model = build_upernet(_tiny_backbone(depth=4), num_classes=3, protocol="vim", channels=16, aux_channels=8)
    groups = SegmentationTask(cfg).param_groups(model)
    scale_of = {id(p): g["lr_scale"] for g in groups for p in g["params"]}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            assert id(param) not in scale_of and name.startswith("pyramid.backbone.norm."), name
            continue
        as_reference = (name.replace("pyramid.backbone.", "backbone.")
                        .replace("backbone.norm_pre.", "backbone.patch_embed.norm.")  # the stem's own norm
                        .replace("backbone.blocks.", f"backbone.{blocks_named}."))
        assert scale_of[id(param)] == pytest.approx(_beit_lr_scale(as_reference, 4, 0.92)), name
    assert len(scale_of) == sum(p.requires_grad for p in model.parameters())


def test_each_protocol_refuses_the_others_options():
    with pytest.raises(ValueError, match="pyramid_channels=16 is the simple-pyramid protocol's width"):
        build_upernet("weightformer_tiny", 3, protocol="vim", embed_dim=32, depth=4, pyramid_channels=16)
    with pytest.raises(ValueError, match=r"out_indices=\[0, 1, 2, 3\] is the vim protocol's"):
        build_upernet("weightformer_tiny", 3, embed_dim=32, depth=4, out_indices=[0, 1, 2, 3])
    with pytest.raises(ValueError, match="protocol 'beit' is not one of vim, simple-pyramid"):
        build_upernet("weightformer_tiny", 3, protocol="beit")


def test_protocol_setting_is_checked():
    assert validate_config(SegmentationConfig(seg_protocol="vim")).seg_protocol == "vim"
    with pytest.raises(ConfigError, match="seg_protocol"):
        validate_config(SegmentationConfig(seg_protocol="beit"))


# -- 8. recipe -----------------------------------------------------------------------------------------


def test_vim_config_is_vims_recipe():
    values = load_config_file(VIM_CONFIG, SegmentationConfig)
    cfg = validate_config(SegmentationConfig(**values))
    gpus = 4  # "trained on 4 GPUs with 8 images per GPU"
    total = cfg.batch_size * gpus
    steps_per_epoch = ADE20K_TRAIN_IMAGES // total  # the loader drops the last partial batch
    assert (cfg.model, cfg.seg_protocol, cfg.num_classes, cfg.img_size) == ("weightformer_small", "vim", None, 512)
    assert total == 32
    assert cfg.opt == "adamw" and cfg.lr * total / 512 == pytest.approx(1e-4)
    assert (cfg.weight_decay, cfg.layer_decay, cfg.clip_grad) == (0.05, 0.92, None)
    assert (cfg.sched, cfg.decay_rate, cfg.min_lr) == ("poly", 1.0, 0.0)
    assert round(cfg.warmup_epochs * steps_per_epoch) == 1500
    assert cfg.warmup_lr / cfg.lr == pytest.approx(1e-6)  # warmup_ratio=1e-6
    assert abs(cfg.epochs * steps_per_epoch - 60_000) < steps_per_epoch / 2  # the nearest whole epochs
    assert (cfg.seg_inference, cfg.seg_crop, cfg.seg_stride) == ("slide", 512, 341)
    assert cfg.amp == "none"  # use_fp16=False


def test_the_papers_recipe_is_the_vim_config_and_the_alternative_stays():
    assert recipes.recipe(recipes.ADE20K).path == VIM_CONFIG
    alternative = validate_config(SegmentationConfig(**load_config_file(ALTERNATIVE_CONFIG, SegmentationConfig)))
    assert (alternative.seg_protocol, alternative.epochs, alternative.batch_size) == ("simple-pyramid", 127, 2)


@pytest.mark.parametrize("path, reference", [
    (VIM_CONFIG, "hustvl/Vim seg/configs/vim/upernet/upernet_vim_small_24_512_slide_60k.py"),
    (ALTERNATIVE_CONFIG, "open-mmlab/mmsegmentation configs/vit/upernet_deit-s16_512x512_160k_ade20k.py"),
])
def test_each_config_names_the_reference_it_follows_first(path: Path, reference: str):
    assert path.read_text().splitlines()[0].startswith(f"# Follows {reference}")


# -- 9. sliding inference on an image smaller than the crop: one canvas, the crop ----------------------


class Recording(nn.Module):
    """A 3x3 conv (so that a window's borders change its logits) that records the size of every window."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.sizes: list[tuple[int, int]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.sizes.append(tuple(x.shape[-2:]))
        return self.conv(x)


def _mmseg_slide(model: nn.Module, images: torch.Tensor, crop: int, stride: int) -> torch.Tensor:
    """mmseg 0.x EncoderDecoder.slide_inference, restated: grids, window corners clamped into the image."""
    _, _, h_img, w_img = images.shape
    h_grids = max(h_img - crop + stride - 1, 0) // stride + 1
    w_grids = max(w_img - crop + stride - 1, 0) // stride + 1
    preds, count = None, torch.zeros(1, 1, h_img, w_img)
    for h_idx in range(h_grids):
        for w_idx in range(w_grids):
            y1, x1 = h_idx * stride, w_idx * stride
            y2, x2 = min(y1 + crop, h_img), min(x1 + crop, w_img)
            y1, x1 = max(y2 - crop, 0), max(x2 - crop, 0)
            logits = model(images[:, :, y1:y2, x1:x2])
            padded = F.pad(logits, (x1, w_img - x2, y1, h_img - y2))
            preds = padded if preds is None else preds + padded
            count[:, :, y1:y2, x1:x2] += 1
    return preds / count


@pytest.mark.parametrize("size, windows", [((40, 60), 1), ((40, 100), 2), ((90, 50), 2), ((64, 64), 1)])
def test_every_window_is_the_crop_a_shorter_side_padded_once(size, windows):
    """mmseg's loop on the image zero-padded (bottom, right) to at least the crop, cut back to the image."""
    model = Recording()
    images = torch.randn(2, 3, *size)
    canvas = F.pad(images, (0, max(64 - size[1], 0), 0, max(64 - size[0], 0)))
    with torch.no_grad():
        ours = slide_inference(model, images, crop=64, stride=43)
        assert model.sizes == [(64, 64)] * windows
        assert ours.shape[-2:] == size
        torch.testing.assert_close(ours, _mmseg_slide(model, canvas, crop=64, stride=43)[..., :size[0], :size[1]])
        if size == (64, 64):
            torch.testing.assert_close(ours, whole_inference(model, images))


# --protocol reaches the model through the task, is saved in the checkpoint's meta, and a meta without it
# (every checkpoint before --protocol) rebuilds as the simple pyramid it was trained with.
CPU = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), owns_process_group=False)


def test_the_task_builds_the_protocols_model_and_saves_it_in_the_meta(tmp_path: Path):
    data = write_shapes(tmp_path / "shapes", train=2, val=1)
    kwargs = {"embed_dim": 32, "depth": 4, "channels": 16, "aux_channels": 8}
    cfg = validate_config(SegmentationConfig(data=str(data), model_kwargs=kwargs, img_size=32, num_classes=4,
                                             seg_protocol="vim"))
    task = SegmentationTask(cfg)
    model, meta = task.build_model(task.build_data(CPU), torch.device("cpu"))
    assert isinstance(model.pyramid, MultiBlockPyramid) and meta["protocol"] == "vim"
    assert isinstance(SegmentationTask.model_from_meta(meta).pyramid, MultiBlockPyramid)
    before = {key: value for key, value in meta.items() if key != "protocol"}  # a checkpoint from before --protocol
    upgraded = SegmentationTask.upgrade_checkpoint({"meta": before}, 0)["meta"]
    assert isinstance(build_segmenter(upgraded).pyramid, SimpleFeaturePyramid)
