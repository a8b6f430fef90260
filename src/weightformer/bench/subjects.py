"""What the benchmarks measure: one list of subjects, :data:`SUBJECTS` (name, builder, inputs), by suite: ``cls``
(the sweep; size: an image side), ``dense`` (a backbone behind ViTDet's simple feature pyramid; (H, W)),
``dit`` (WF-DiT and DiT with fused or explicit attention; a latent side) and ``export`` (three runtimes).
Adding a benchmarked model is one entry; the list needs no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:
    import torch

INFER, TRAIN = "infer", "train"
PYRAMID_CHANNELS = 256  # Mask R-CNN's FPN width, as in ViTDet and the paper


@dataclass(frozen=True)
class Subject:
    """One benchmarked model. ``build(size, device, **kwargs)`` makes it; ``inputs(batch, size, device)``
    gives ``(args, target)`` for one call; ``loss(output, target)`` is what a training step backpropagates."""

    suite: str
    name: str
    label: str
    build: Callable[..., Any]
    inputs: Callable[..., Any] = None  # type: ignore[assignment]
    loss: Optional[Callable[[Any, Any], Any]] = None
    baseline: str = ""  # the subject its ratios are taken against (cls)
    family: str = ""
    modes: tuple[str, ...] = (INFER, TRAIN)
    optimizer: bool = False  # a training step ends with an AdamW step
    warmup: Any = 64  # the size of the warm-up call before a memory probe
    fixed_size: bool = False  # built for one input size: the warm-up call builds a model of its own
    attention: Optional[str] = None  # dit: "fused" or "explicit" (None: a WeightFormer-DiT)
    options: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------- cls
def _images(batch: int, size: Any, device: str) -> tuple:
    import torch

    height, width = (size, size) if isinstance(size, int) else size
    gen = torch.Generator().manual_seed(0)
    images = torch.randn(batch, 3, height, width, generator=gen).to(device)
    return (images,), torch.randint(0, 1000, (batch,), generator=gen).to(device)


def _cross_entropy(output: Any, labels: Any) -> Any:
    import torch.nn.functional as F

    return F.cross_entropy(output, labels)


def set_fused_attention(model: Any, fused: bool) -> None:
    """Switch every timm attention module of ``model`` to fused (SDPA) or explicit (softmax(QKᵀ)V) attention."""
    for module in model.modules():
        if hasattr(module, "fused_attn"):
            module.fused_attn = fused


def _classifier(timm_name: str, implementation: Optional[str] = None, fused: Optional[bool] = None,
                checkpointing: bool = False) -> Callable[..., Any]:
    def build(resolution: int, device: str = "cpu") -> Any:
        import timm

        import weightformer.models  # noqa: F401  (registers the WeightFormer models with timm)

        # DeiT's position embedding is sized for ``img_size``; dynamic_img_size admits smaller warm-up inputs.
        vit = {} if fused is None else {"img_size": resolution, "dynamic_img_size": True}
        model = timm.create_model(timm_name, num_classes=1000, device=device, **vit)
        if implementation is not None:
            model.set_implementation(implementation)
        if fused is not None:
            set_fused_attention(model, fused)
        model.set_grad_checkpointing(checkpointing)
        return model

    return build


def _classifiers(size: str, wf: str, deit: str) -> list[Subject]:
    S, base = size.upper(), f"deit-{size}"
    common = dict(suite="cls", inputs=_images, loss=_cross_entropy, baseline=base, family=size, optimizer=True)
    return [
        Subject(name=f"wf-{size}", label=f"WeightFormer-{S}", build=_classifier(wf, "fast"), **common),
        Subject(name=f"wf-{size}-naive", label=f"WeightFormer-{S} naive", build=_classifier(wf, "reference"), **common),
        # Checkpointing changes nothing in inference: measured training only.
        Subject(name=f"wf-{size}-ckpt", label=f"WeightFormer-{S} grad-ckpt", build=_classifier(wf, "fast", None, True),
                modes=(TRAIN,), **common),
        Subject(name=base, label=f"DeiT-{S} fused attn", build=_classifier(deit, fused=True), **common),
        Subject(name=f"deit-{size}-explicit", label=f"DeiT-{S} explicit attn", build=_classifier(deit, fused=False),
                **common),
    ]


# ----------------------------------------------------------------------------------------------- dense
def padded(height: int, width: int) -> tuple[int, int]:
    """The size the pyramid pads an image to: sides to a multiple of 32."""
    return math.ceil(height / 32) * 32, math.ceil(width / 32) * 32


def _pyramid(timm_name: str, **kwargs: Any) -> Callable[..., Any]:
    def build(size: Any = None, device: str = "cpu") -> Any:
        import timm

        import weightformer.models  # noqa: F401
        from ..models.pyramid import SimpleFeaturePyramid, build_backbone

        if timm_name.startswith("samvit"):  # no pretrained config to consult; num_classes=0 drops the head
            backbone = timm.create_model(timm_name, num_classes=0, **kwargs)
        else:
            backbone = build_backbone(timm_name, **kwargs)
        return SimpleFeaturePyramid(backbone, out_channels=PYRAMID_CHANNELS).to(device)

    return build


def _vitdet(dim: int, heads: int) -> dict[str, Any]:
    """ViTDet's windowed plain ViT (timm's SAM encoder without its neck, Li et al., arXiv 2203.16527):
    12 blocks, 14×14 windows, relative positions, global attention in blocks 3, 6, 9 and 12."""
    return dict(embed_dim=dim, depth=12, num_heads=heads, window_size=14, global_attn_indexes=(2, 5, 8, 11),
                use_rel_pos=True, neck_chans=0, img_size=1024)


def _feature_mean(features: Any, target: Any) -> Any:
    return sum(f.float().mean() for f in features.values())


def _dense(name: str, label: str, timm_name: str, **kwargs: Any) -> Subject:
    return Subject("dense", name, label, _pyramid(timm_name, **kwargs), _images, _feature_mean, warmup=(64, 64))


# ------------------------------------------------------------------------------------------------- dit
def dit_arguments(model: str, model_kwargs: Optional[dict] = None) -> dict[str, Any]:
    from ..models.dit_variants import DIT_VARIANTS

    return {**DIT_VARIANTS[model], **(model_kwargs or {})}


def _dit(model: str, attention: Optional[str]) -> Callable[..., Any]:
    def build(side: int, device: str = "cpu", **model_kwargs: Any) -> Any:
        import torch

        from ..models.dit_variants import create_dit

        torch.manual_seed(0)
        with torch.device(device):
            net = create_dit(model, input_size=side, in_channels=4, num_classes=1000, **model_kwargs)
        if attention is not None:
            set_fused_attention(net, attention == "fused")
        return net

    return build


def _latents(batch: int, side: int, device: str) -> tuple:
    import torch

    x = torch.randn(batch, 4, side, side, device=device)
    t = torch.randint(0, 1000, (batch,), device=device)
    return (x, t, torch.randint(0, 1000, (batch,), device=device)), None


def dit_subject(model: str, attention: Optional[str] = None) -> Subject:
    """The DiT variant ``model`` (a key of ``models.dit_variants.DIT_VARIANTS``); ``attention`` for an attention DiT."""
    patch = int(model.rsplit("_", 1)[1])
    return Subject("dit", model if attention is None else f"{model} {attention}", model, _dit(model, attention), _latents,
                   lambda out, target: out.square().mean(), warmup=4 * patch, fixed_size=True, attention=attention,
                   options={"model": model, "patch": patch})


# ---------------------------------------------------------------------------------------------- export
def _runtime(name: str) -> Callable[..., Any]:
    """A runner of ``model``: itself, ``torch.compile(dynamic=True)``, or onnxruntime on its ONNX export in ``folder``."""
    def build(model: Any, folder: Any = None, threads: int = 1) -> Callable[[Any], Any]:
        if name == "eager":
            return model
        if name == "compile":
            import torch

            return torch.compile(model, dynamic=True)
        import onnxruntime as ort

        from ..export.onnx import to_onnx

        to_onnx(model, folder / "model.onnx", check_at=[(1, 320, 256), (3, 208, 272)])
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        session = ort.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])
        return lambda x: session.run(None, {"images": x.numpy()})[0]

    return build


SUBJECTS: list[Subject] = [
    *_classifiers("t", "weightformer_tiny", "deit_tiny_patch16_224"),
    *_classifiers("s", "weightformer_small", "deit_small_patch16_224"),
    _dense("wf-t", "WeightFormer-T", "weightformer_tiny"),
    _dense("deit-t", "DeiT-T (global)", "deit_tiny_patch16_224"),
    _dense("deit-t-win", "DeiT-T (ViTDet windows)", "samvit_base_patch16", **_vitdet(192, 3)),
    _dense("wf-s", "WeightFormer-S", "weightformer_small"),
    _dense("deit-s", "DeiT-S (global)", "deit_small_patch16_224"),
    _dense("deit-s-win", "DeiT-S (ViTDet windows)", "samvit_base_patch16", **_vitdet(384, 6)),
    dit_subject("wf_dit_s_2"),
    dit_subject("dit_s_2", "fused"),
    dit_subject("dit_s_2", "explicit"),
    *(Subject("export", name, label, _runtime(name), _images) for name, label in
      (("eager", "PyTorch eager"), ("compile", "torch.compile"), ("onnxruntime", "onnxruntime"))),
]


def suite(name: str) -> dict[str, Subject]:
    return {s.name: s for s in SUBJECTS if s.suite == name}


def get_subject(suite_name: str, name: str) -> Subject:
    """A subject by suite and name (dit: any ``DIT_VARIANTS`` key, `` fused`` or `` explicit`` for attention)."""
    subjects = suite(suite_name)
    if name in subjects:
        return subjects[name]
    if suite_name == "dit":
        model, _, attention = name.partition(" ")
        return dit_subject(model, attention or None)
    raise ValueError(f"unknown model {name!r}; choose from {', '.join(subjects)}")


def make_call(subject: Subject, model: Any, mode: str, args: tuple, target: Any = None,
              dtype: Optional["torch.dtype"] = None, optimizer: Any = None) -> Callable[[], None]:
    """One inference call (eval, inference mode) or one training step of ``model`` on ``args``, under
    autocast to ``dtype`` (None or fp32: none); a cls step's AdamW is ``optimizer`` (default: a new one)."""
    import contextlib

    import torch

    device = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")
    cast = (contextlib.nullcontext if dtype in (None, torch.float32)
            else lambda: torch.autocast(device_type=device, dtype=dtype))
    if mode == INFER:
        model.eval()

        def call() -> None:
            with torch.inference_mode(), cast():
                model(*args)

        return call
    model.train()
    if subject.optimizer and optimizer is None:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        with cast():
            loss = subject.loss(model(*args), target)
        loss.backward()
        if optimizer is not None:
            optimizer.step()

    return step


def prepare(subject: Subject, mode: str, size: Any, batch: int, device: str, dtype: Any = None,
            model: Any = None, **build_kwargs: Any) -> Callable[[], None]:
    if model is None:
        model = subject.build(size, device, **build_kwargs)
    args, target = subject.inputs(batch, size, device)
    return make_call(subject, model, mode, args, target, dtype)


def param_count(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())
