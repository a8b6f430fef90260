"""Tools that test the paper's claims: effective receptive fields (:mod:`.erf`) and the ablation runner
(:mod:`.ablate`)."""
