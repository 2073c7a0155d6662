"""Optimizers that are not generative models: PRESTO (:mod:`.presto`), Regularized Weighting (:mod:`.rw`)
and the optimal-transport reduction of distributed mixtures of experts (:mod:`.ot`)."""
