"""Tools that test the paper's claims: effective receptive fields (:mod:`.erf`), the ablation runner
(:mod:`.ablate`), the predicted updates (:mod:`.dynamics`), edge interaction (:mod:`.interaction`) and
the resolution transfer of probe classifiers (:mod:`.transfer`)."""
