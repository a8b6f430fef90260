"""The choices of ``gen sample``, torch-free for its command line: how classifier-free guidance combines
the two noise predictions (:meth:`WeightFormerDiT.forward_with_cfg`), and the samplers of :mod:`.sampling`."""

GUIDANCE_MODES = ("release", "standard")
SAMPLERS = ("ddpm", "ddim")
