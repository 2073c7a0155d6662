"""What every fitted model predicts and scores, from its Pyro program and the hooks it overrides.

:class:`PredictionsMixin` is a part of :class:`~ppmix.models.base.MixtureModel`: the posterior over the
discrete latents, labels, log-likelihoods (per point, mean, total, weighted), the ELBO and new draws. The
defaults read the program by enumeration; models with an exact E-step override
:meth:`~PredictionsMixin._posterior_marginals`, :meth:`~PredictionsMixin._responsibilities` and
:meth:`~PredictionsMixin._pointwise_log_likelihood`.
"""

from __future__ import annotations

from typing import Any

import torch
from pyro.infer import TraceEnum_ELBO

from ppmix._validation import check_positive_int, to_output
from ppmix.engines.enumeration import (
    check_local_latents,
    enumerated_log_likelihood,
    enumerated_marginals,
    sample_program,
)
from ppmix.engines.params import local_params
from ppmix.models._missing import refuse_missing_in_program

__all__ = ["PredictionsMixin"]


class PredictionsMixin:
    """Predictions and scores of a fitted :class:`~ppmix.models.base.MixtureModel` (which provides
    ``prepare_data``, ``_output_like``, ``model``/``guide``, ``_weigh``, ``_forked_rng`` and the fitted state)."""

    def posterior(self, X: Any, y: Any = None) -> Any:
        """Posterior marginals of the discrete latents, ``{site: (N, K) probabilities}``.

        The default uses Pyro's ``TraceEnum_ELBO.compute_marginals`` on the model and
        guide; models with an exact E-step override :meth:`_posterior_marginals`.
        """
        self._check_fitted()
        data = self.prepare_data(X, y)
        return {k: to_output(v, self._output_like(X)) for k, v in self._posterior_marginals(data).items()}

    def _posterior_marginals(self, data: Any) -> dict[str, torch.Tensor]:
        """Posterior probabilities of each enumerated site given ``data`` (tensors)."""
        return enumerated_marginals(self.model, self.guide, data, self.max_plate_nesting)

    def predict_proba(self, X: Any) -> Any:
        """Posterior probabilities ``(N, K)`` of the component of each point (the first enumerated site)."""
        self._check_fitted()
        data = self.prepare_data(X)
        return to_output(self._responsibilities(data), self._output_like(X))

    def _responsibilities(self, data: Any) -> torch.Tensor:
        """``q(z_n = k)`` for the main discrete latent, as a tensor ``(N, K)`` (the first enumerated site; a
        program whose latents form a ``pyro.markov`` chain is refused: it has no one latent per point)."""
        check_local_latents(self.model, self.guide, data, self.max_plate_nesting, type(self).__name__)
        marginals = self._posterior_marginals(data)
        return next(iter(marginals.values()))

    def predict(self, X: Any) -> Any:
        """Most probable component of each point."""
        self._check_fitted()
        data = self.prepare_data(X)
        return to_output(self._responsibilities(data).argmax(-1), self._output_like(X))

    def fit_predict(self, X: Any, y: Any = None, **fit_options: Any) -> Any:
        """``fit(X, y, **fit_options)``, then :meth:`predict` on the same ``X``."""
        return self.fit(X, y, **fit_options).predict(X)

    def _pointwise_log_likelihood(self, data: Any) -> torch.Tensor:
        """``log p(x_n | globals)`` for every data point, shape ``(N,)``.

        The default traces the model with every enumerated site enumerated in
        parallel, adds the log-densities of all sites inside the data plate and sums
        the enumerated values out. It is exact when each enumerated latent belongs
        to one data point (mixtures); models with latents spanning several points
        (HMMs) or nested plates override it.
        """
        return enumerated_log_likelihood(
            self.model, self.guide, data, self.max_plate_nesting, self.data_plate_name, type(self).__name__
        )

    def score_samples(self, X: Any) -> Any:
        """``log p(x_n)`` for every row of ``X``."""
        self._check_fitted()
        data = self.prepare_data(X)
        return to_output(self._pointwise_log_likelihood(data), self._output_like(X))

    def score(self, X: Any, y: Any = None, sample_weight: Any = None) -> float:
        """Mean log-likelihood per data point (weighted by ``sample_weight``, one per point, where given)."""
        self._check_fitted()
        data = self.prepare_data(X, y)
        log_lik = self._pointwise_log_likelihood(data)
        if sample_weight is None:
            return float(log_lik.mean())
        weight = self._weigh(data, sample_weight, fitting=False).weight.to(log_lik)
        return float(log_lik @ weight / weight.sum())

    def log_likelihood(self, X: Any, y: Any = None) -> float:
        """Total log-likelihood ``log p(X | globals)`` at the point estimates."""
        self._check_fitted()
        data = self.prepare_data(X, y)
        return float(self._pointwise_log_likelihood(data).sum())

    def elbo(self, X: Any, y: Any = None, num_particles: int = 1) -> float:
        """The ELBO of the model and guide, evaluated by Pyro's ``TraceEnum_ELBO``.

        With the default point-mass guide this equals the log-likelihood plus the log
        prior density of the point estimates (zero under flat priors); after an SVI
        fit with ``guide="normal"`` it is that guide's (stochastic) ELBO.
        """
        self._check_fitted()
        data = self.prepare_data(X, y)
        refuse_missing_in_program(data, "elbo")
        return self._elbo_tensor(data, num_particles=num_particles)

    def _elbo_tensor(self, data: Any, num_particles: int = 1) -> float:
        """:meth:`elbo` on already prepared data."""
        with local_params(), torch.no_grad():
            elbo = TraceEnum_ELBO(max_plate_nesting=self.max_plate_nesting, num_particles=num_particles)
            return -float(elbo.loss(self.model, self._variational_guide or self.guide, data))

    def sample(self, n_samples: int = 1) -> dict[str, Any]:
        """Draw ``n_samples`` new data points (and their latents) from the fitted model.

        Returns a dict keyed by site name (observed and discrete sites). The default
        runs the model unconditioned at the point estimates on an ``n_samples``-row
        placeholder; models with a faster sampler override it.
        """
        self._check_fitted()
        n = check_positive_int(n_samples, "n_samples")
        template = torch.zeros(n, self.n_features_in_, dtype=self.dtype, device=self._device)
        with self._forked_rng():
            return sample_program(self.model, self.guide, template)
