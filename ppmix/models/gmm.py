"""``GMM``: the Gaussian mixture model, with diagonal or full covariances."""

from __future__ import annotations

from typing import Any

import torch

from ppmix.components.gaussian_family import GaussianFamily
from ppmix.models._params import store_params
from ppmix.models.mixture import Mixture

__all__ = ["GMM"]


class GMM(Mixture):
    """Gaussian mixture model: ``z_n ~ Cat(weights)``, ``x_n | z_n = k ~ N(mu_k, Sigma_k)``.

    :class:`~ppmix.models.mixture.Mixture` with the Gaussian family
    (:class:`~ppmix.components.gaussian_family.GaussianFamily`), whose settings are arguments here.
    One Pyro program, three engines: ``fit(X, engine="em")`` (closed-form EM, the
    default), ``"svi"`` (``TraceEnum_ELBO`` on the same model) and ``"mcmc"`` (NUTS).
    EM and SVI estimate by maximum likelihood (flat priors, so the ELBO equals the
    log-likelihood); MCMC samples the posterior under weakly informative,
    data-scaled priors: ``weights ~ Dirichlet(1)``, ``locs ~ N(mean(X), 3 std(X))``,
    every variance ``scales**2 ~ InverseGamma(1, var(X) / 100)`` and, for full and tied covariance,
    ``corr_cholesky ~ LKJCholesky(D, 2)`` (settable: ``priors``).

    Parameters
    ----------
    n_components : int, default 1
    covariance_type : {"diag", "full", "spherical", "tied"}, default "diag"
        ``"spherical"``: one variance per component (``covariances_`` keeps the ``(K, D)`` layout of
        ``"diag"``, each row constant; its Pyro site ``scales`` is ``(K,)``); ``"tied"``: one full covariance
        for all components (``covariances_`` ``(K, D, D)``, the same matrix K times; its sites ``scales`` and
        ``corr_cholesky`` are shared, outside the ``components`` plate).
    n_init : int, default 1
        EM restarts; the best objective is kept.
    max_iter : int, default 100
    tol : float, default 1e-3
        EM stops when the log-likelihood per observation changes by at most ``tol`` (nats): scikit-learn's
        ``GaussianMixture`` criterion and default, so that a default fit costs what scikit-learn's does and ends
        as close to the optimum (on hard, overlapping data within about 0.01 nats per point of a converged fit,
        ``benchmarks/bench_gmm.py``). Set ``tol=1e-6`` (the default of :class:`~ppmix.models.mixture.Mixture`
        and the other EM models) for an optimum to about six digits.
    reg_covar : float, default 1e-6
        Variance floor relative to the data: every variance (every eigenvalue, in the
        features' own scale, for ``"full"``) is at least ``reg_covar`` times the feature's
        squared robust spread in the training data, or ``reg_covar`` itself for a feature
        constant up to rounding (:func:`~ppmix.components.gaussian_family.relative_floor`;
        scikit-learn instead adds ``reg_covar`` in the data's units). The M-step is the exact
        maximiser under this floor, so EM never decreases the log-likelihood and the fit does
        not depend on the data's units.
    init_params : {"kmeans", "k-means++", "random"}, default "kmeans"
        As for :class:`~ppmix.models.mixture.Mixture`.
    warm_start : bool, default False
        Continue EM from the current parameters on the next ``fit``.
    missing : {"error", "marginalize"}, default "error"
        NaN in ``X``: an error naming ``X``, or an entry missing at random, marginalised by EM (see
        :class:`~ppmix.models.mixture.Mixture`; :meth:`impute` fills such entries in).
    priors : dict, optional
        The priors' hyperparameters, by key (each optional, a number or one per feature; None: every default):
        ``"weights"`` the Dirichlet concentration of the weights (default 1); ``"locs_loc"`` and ``"locs_scale"``
        the normal prior of every mean (``mean(X)``, ``3 std(X)``); ``"variance_concentration"`` ``a`` and
        ``"variance_rate"`` ``b`` the inverse-gamma prior of every variance (1 and ``var(X) / 100``; spherical: of
        the mean variance); ``"corr_concentration"`` the LKJ concentration of the correlations (2; full and
        tied). MCMC, Gibbs and ``to_arviz``'s ``prior`` group use them. Given (even ``{}``), ``engine="em"`` is
        MAP-EM: it maximises log-likelihood plus log prior (reported in ``history_``, never decreasing), the
        weights ``(N_k + alpha - 1) / (N + K (alpha - 1))``; diag and spherical: the means and variances in
        closed form in turn (``var = (2 b + scatter) / (2 a + 2 + n_k)``); full and tied: generalised EM, the
        means given the covariance in closed form, then Newton steps on the covariance under the inverse-gamma
        variances and the LKJ correlation (:mod:`ppmix.components.gaussian_map`); None: maximum likelihood.
    weight_concentration_prior_type : {"dirichlet_process", "dirichlet_distribution"}, default "dirichlet_process"
        ``engine="vb"`` only: the weights' prior, stick-breaking (a truncated Dirichlet process) or a symmetric
        Dirichlet, as scikit-learn's ``BayesianGaussianMixture``.
    weight_concentration_prior : float, optional
        ``engine="vb"`` only: its concentration ``alpha`` (default ``1 / n_components``); smaller leaves fewer
        components with weight.
    seed, device, dtype, progress : see :class:`~ppmix.models.base.MixtureModel`.

    Attributes
    ----------
    weights_ : Tensor (K,)
    components_ : DiagGaussian or FullGaussian
    means_, covariances_ : Tensor
        ``(K, D)`` and ``(K, D)`` (diag) or ``(K, D, D)`` (full).
    precisions_ : Tensor
        The inverses of ``covariances_``, in their layout.
    n_effective_components_ : int
        The components whose weight exceeds :data:`~ppmix.models._variational.EFFECTIVE_WEIGHT` (1 % of the data).
    variational_posterior_ : dict of Tensor
        After ``engine="vb"``: the factors of the posterior, ``weight_concentration`` (Dirichlet ``(K,)``, or the
        sticks' Beta parameters ``(2, K)``), and the Normal-Wishart ``mean_precision`` ``(K,)``, ``means``,
        ``degrees_of_freedom`` and ``covariances`` (``W_k^{-1} / nu_k``, as ``covariances_``).

    Notes
    -----
    **Variational Bayes.** ``fit(X, engine="vb")`` fits the posterior of the weights and of every component under a
    Dirichlet (or stick-breaking) prior and a Normal-Wishart prior, by mean-field coordinate ascent
    (:func:`ppmix.engines.vb.run_vb`), with scikit-learn's ``BayesianGaussianMixture`` updates, priors and lower
    bound: from the same start every iteration equals it. Components the data do not support end with negligible
    weight, so ``n_components`` is an upper bound and ``n_effective_components_`` the number used. ``weights_``,
    ``means_`` and ``covariances_`` are then the posterior means (of the covariances: the inverse of the mean
    precision), which predictions use; ``history_`` holds the lower bound per data point after every iteration
    and ``lower_bound_`` its last value (scikit-learn's ``lower_bound_`` divided by ``N``). The components' prior:
    ``fit(X, engine="vb", component_prior={...})`` with scikit-learn's keys and defaults
    (:func:`~ppmix.components.gaussian_vb.normal_wishart_prior`); ``reg_covar`` is added to every weighted variance
    as scikit-learn's, relative to the data (:func:`~ppmix.components.gaussian_family.relative_floor`).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> X = np.concatenate([rng.normal(-4, 1, (100, 2)), rng.normal(4, 1, (100, 2))])
    >>> gmm = GMM(n_components=2, seed=0, progress=False).fit(X)
    >>> np.round(np.sort(gmm.means_[:, 0].numpy()))
    array([-4.,  4.])
    >>> gmm.predict(X[:3]).shape
    (3,)

    MAP-EM under an inverse-gamma prior whose mode is about 4 pulls the unit variances up to
    ``(2 b + scatter) / (2 a + 2 + n_k) = (800 + 100) / 302``:

    >>> gmm_map = GMM(2, priors={"variance_concentration": 100.0, "variance_rate": 400.0}, seed=0, progress=False)
    >>> np.round(gmm_map.fit(X).covariances_.numpy(), 1)
    array([[3. , 2.9],
           [3. , 3. ]])

    Frozen parameters (:mod:`ppmix.models.frozen`): the weights and means held as given, the covariances fitted as
    the weighted scatter around those means:

    >>> held = GMM(2, seed=0, progress=False).fit(X, fixed={"weights_": [0.5, 0.5], "means_": [[-4, -4], [4, 4]]})
    >>> held.means_.tolist(), held.fixed_
    ([[-4.0, -4.0], [4.0, 4.0]], ('weights', 'locs'))

    Variational Bayes leaves the two clusters' weight on two of five components (each of the other three keeps
    about the weight of one row, the prior's):

    >>> gmm_vb = GMM(5, covariance_type="full", seed=0, progress=False).fit(X, engine="vb", max_iter=500)
    >>> gmm_vb.n_effective_components_, float(np.sort(gmm_vb.weights_.numpy())[-2:].sum()) > 0.98
    (2, True)
    """

    #: EM runs under ``torch.inference_mode()`` (:func:`~ppmix.engines.em.run_em`): the Gaussian hooks
    #: use no autograd, and the fitted parameters come out as ordinary tensors
    em_inference_mode = True

    def __init__(
        self,
        n_components: int = 1,
        *,
        covariance_type: str = "diag",
        n_init: int = 1,
        max_iter: int = 100,
        tol: float = 1e-3,
        reg_covar: float = 1e-6,
        init_params: str = "kmeans",
        warm_start: bool = False,
        missing: str = "error",
        priors: dict[str, Any] | None = None,
        weight_concentration_prior_type: str = "dirichlet_process",
        weight_concentration_prior: float | None = None,
        seed: int | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype = torch.float64,
        progress: bool = True,
    ) -> None:
        super().__init__()
        store_params(self, locals())

    def _component_family(self) -> GaussianFamily:
        return GaussianFamily(self.covariance_type, self.reg_covar)

    @property
    def precisions_(self) -> torch.Tensor:
        """The inverses of :attr:`covariances_`: ``(K, D, D)`` matrices, or ``(K, D)`` inverse variances."""
        covariances = self.covariances_
        return torch.linalg.inv(covariances) if covariances.dim() == 3 else 1.0 / covariances

    def summary(self) -> dict[str, Any]:
        """A JSON-able description of the fit."""
        return {**super().summary(), "covariance_type": self.covariance_type}
