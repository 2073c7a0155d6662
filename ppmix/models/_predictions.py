"""What every fitted model predicts and scores, as functions of the model: the posterior over the discrete
latents, labels, log-likelihoods (per point, mean, total, weighted), the ELBO and new draws.

The public :func:`latent_posterior` and :class:`~ppmix.models.base.MixtureModel`'s public methods
(``predict_proba``, ``predict``, ``score_samples``, ``score``, ``log_likelihood``, ``elbo``, ``sample``) call
these. They read the model's ``prepare_data``, ``_output_like``, ``_weigh``, ``_forked_rng`` and three hooks a
model with an exact E-step overrides (``_posterior_marginals``, ``_responsibilities``,
``_pointwise_log_likelihood``), whose defaults (:func:`enumerated_marginals`, :func:`first_site_marginals`,
:func:`enumerated_log_likelihood`) read the Pyro program by enumeration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from pyro.infer import TraceEnum_ELBO

from ppmix._validation import check_positive_int, to_output
from ppmix.engines.enumeration import check_local_latents, enumerated_marginals, sample_program
from ppmix.engines.params import local_params
from ppmix.models._missing import refuse_missing_in_program

if TYPE_CHECKING:
    from ppmix.models.base import MixtureModel

__all__ = [
    "elbo",
    "first_site_marginals",
    "latent_posterior",
    "log_likelihood",
    "predict",
    "predict_proba",
    "program_elbo",
    "program_marginals",
    "sample",
    "score",
    "score_samples",
]


def latent_posterior(model: MixtureModel, X: Any, y: Any = None) -> dict[str, Any]:
    """The posterior marginals of every discrete latent site of a fitted model given the data.

    For a mixture or an HMM this is ``predict_proba``'s answer (``{"z": (N, K)}``, an HMM's steps stacked); it
    is the way to the others: a model given ``y`` (the mixture of experts' ``q(z | x, y)``, the pf models'
    posterior of a labelled row), and every enumerated site of a user's own ``MixtureModel`` subclass (Pyro's
    ``TraceEnum_ELBO.compute_marginals``, unless the model has an exact E-step).

    Parameters
    ----------
    model : MixtureModel
        A fitted model.
    X : array-like
        The data, as the model's ``fit`` takes it.
    y : array-like, optional
        The targets of a model that has them.

    Returns
    -------
    dict
        ``{site: (N, K) probabilities}``, numpy unless ``X`` is a tensor.

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix import GMM
    >>> from ppmix.models import latent_posterior
    >>> x = np.random.default_rng(0).normal(size=(50, 2))
    >>> gmm = GMM(2, seed=0, progress=False).fit(x)
    >>> bool(np.allclose(latent_posterior(gmm, x)["z"], gmm.predict_proba(x)))
    True
    """
    model._check_fitted()
    data = model.prepare_data(X, y)
    return {k: to_output(v, model._output_like(X)) for k, v in model._posterior_marginals(data).items()}


def program_marginals(model: MixtureModel, data: Any) -> dict[str, torch.Tensor]:
    """The default ``_posterior_marginals``: Pyro's ``TraceEnum_ELBO.compute_marginals`` on the model and guide."""
    return enumerated_marginals(model.model, model.guide, data, model.max_plate_nesting)


def first_site_marginals(model: MixtureModel, data: Any) -> torch.Tensor:
    """The default ``_responsibilities``: the posterior of the first enumerated site ``(N, K)`` (a program whose
    latents form a ``pyro.markov`` chain is refused: it has no one latent per point)."""
    check_local_latents(model.model, model.guide, data, model.max_plate_nesting, type(model).__name__)
    return next(iter(model._posterior_marginals(data).values()))


def predict_proba(model: MixtureModel, X: Any) -> Any:
    """``(N, K)`` posterior probabilities of each point's component (the model's ``_responsibilities``)."""
    model._check_fitted()
    data = model.prepare_data(X)
    return to_output(model._responsibilities(data), model._output_like(X))


def predict(model: MixtureModel, X: Any) -> Any:
    """The most probable component of each point."""
    model._check_fitted()
    data = model.prepare_data(X)
    return to_output(model._responsibilities(data).argmax(-1), model._output_like(X))


def score_samples(model: MixtureModel, X: Any) -> Any:
    """``log p(x_n)`` of every point (the model's ``_pointwise_log_likelihood``)."""
    model._check_fitted()
    data = model.prepare_data(X)
    return to_output(model._pointwise_log_likelihood(data), model._output_like(X))


def score(model: MixtureModel, X: Any, y: Any = None, sample_weight: Any = None) -> float:
    """The mean log-likelihood per point, weighted by ``sample_weight`` where given."""
    model._check_fitted()
    data = model.prepare_data(X, y)
    log_lik = model._pointwise_log_likelihood(data)
    if sample_weight is None:
        return float(log_lik.mean())
    weight = model._weigh(data, sample_weight, fitting=False).weight.to(log_lik)
    return float(log_lik @ weight / weight.sum())


def log_likelihood(model: MixtureModel, X: Any, y: Any = None) -> float:
    """``log p(X | globals)`` at the point estimates."""
    model._check_fitted()
    data = model.prepare_data(X, y)
    return float(model._pointwise_log_likelihood(data).sum())


def elbo(model: MixtureModel, X: Any, y: Any = None, num_particles: int = 1) -> float:
    """Pyro's ``TraceEnum_ELBO`` of the model and its guide on ``X``."""
    model._check_fitted()
    data = model.prepare_data(X, y)
    refuse_missing_in_program(data, "elbo")
    return program_elbo(model, data, num_particles=num_particles)


def program_elbo(model: MixtureModel, data: Any, num_particles: int = 1) -> float:
    """:func:`elbo` on already prepared data (the fitted distributional guide where there is one)."""
    with local_params(), torch.no_grad():
        objective = TraceEnum_ELBO(max_plate_nesting=model.max_plate_nesting, num_particles=num_particles)
        return -float(objective.loss(model.model, model._variational_guide or model.guide, data))


def sample(model: MixtureModel, n_samples: int = 1) -> dict[str, Any]:
    """``n_samples`` draws of the program run unconditioned at the point estimates, keyed by site."""
    model._check_fitted()
    n = check_positive_int(n_samples, "n_samples")
    template = torch.zeros(n, model.n_features_in_, dtype=model.dtype, device=model._device)
    with model._forked_rng():
        return sample_program(model.model, model.guide, template)
