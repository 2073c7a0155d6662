"""Gibbs sampler for the full-covariance prediction-focused GMM (Sharma et al., 2023, Supplement B.3).

Model (switches per feature, shared by all points, as in B.3's conditionals)::

    S_d ~ Bern(p)                  Z_n ~ Cat(theta),  theta ~ Dirichlet(alpha)
    Y_n | Z_n = k ~ Bern(eta_k),   eta_k ~ Beta(1, 1)
    X_n[S] | Z_n = k ~ N(mu_k, Sigma_k)          (mu_k, Sigma_k) ~ NIW on the |S| relevant coordinates
    X_n[~S] ~ N(mu_bg, Sigma_bg)                 (mu_bg, Sigma_bg) ~ NIW on the other coordinates

with Normal-inverse-Wishart priors ``NIW(m0, kappa0, nu0 = |block| + 2, psi0 I)`` centred on
the data mean. One sweep draws, in this order (a blocked Gibbs sampler):

1. each ``S_d`` from ``p(S_d | S_-d, Z, X)`` with every Gaussian parameter integrated out
   (closed-form NIW marginal likelihoods of the component and background blocks);
2. the Gaussian parameters from their NIW posteriors given ``S`` and ``Z``;
3. each ``Z_n`` from ``p(Z_n | parameters, S, x_n, y_n)`` (the background does not depend on ``k``);
4. ``theta`` and ``eta`` from their Dirichlet / Beta posteriors.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy.special import multigammaln

from ppmix.components import FullGaussian

__all__ = [
    "GibbsDraws",
    "NIWPrior",
    "collapsed_log_likelihood",
    "block_log_prob",
    "log_marginal_niw",
    "prior_draws",
    "run_pf_gibbs",
    "sufficient_stats",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class NIWPrior:
    """``NIW(mean, kappa, |block| + extra_dof, psi I)`` restricted to any block of coordinates."""

    mean: np.ndarray
    kappa: float = 0.01
    psi: float = 1.0
    extra_dof: float = 2.0

    @classmethod
    def from_data(cls, x: np.ndarray) -> "NIWPrior":
        """The default prior for rows ``x``: centred on their mean, ``psi`` their mean feature variance (1 if 0)."""
        return cls(mean=x.mean(0), psi=float(x.var(0).mean()) or 1.0)

    def block(self, coords: np.ndarray) -> tuple[np.ndarray, float, float, np.ndarray]:
        d = int(coords.sum())
        return self.mean[coords], self.kappa, d + self.extra_dof, self.psi * np.eye(d)


@dataclass
class GibbsDraws:
    """Posterior draws kept after warm-up (one row per draw)."""

    switches: np.ndarray  # (S, D) bool
    assignments: np.ndarray  # (S, N) int
    weights: np.ndarray  # (S, K)
    label_probs: np.ndarray  # (S, K)
    locs: np.ndarray  # (S, K, D), NaN on switched-off coordinates
    covariances: np.ndarray  # (S, K, D, D), NaN outside the switched-on block
    background_loc: np.ndarray  # (S, D), NaN on switched-on coordinates
    background_covariance: np.ndarray  # (S, D, D), NaN outside the switched-off block


def sufficient_stats(x: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """``(n, mean, scatter matrix)`` of the rows of ``x`` (zeros for no rows)."""
    n = x.shape[0]
    if n == 0:
        return 0, np.zeros(x.shape[1]), np.zeros((x.shape[1], x.shape[1]))
    mean = x.mean(0)
    centred = x - mean
    return n, mean, centred.T @ centred


def _posterior(stats: tuple[int, np.ndarray, np.ndarray], coords: np.ndarray, prior: NIWPrior) -> tuple:
    n, mean, scatter = stats
    m0, k0, nu0, psi0 = prior.block(coords)
    mean, scatter = mean[coords], scatter[np.ix_(coords, coords)]
    kn, nun = k0 + n, nu0 + n
    diff = mean - m0
    psin = psi0 + scatter + (k0 * n / kn) * np.outer(diff, diff)
    mn = (k0 * m0 + n * mean) / kn
    return mn, kn, nun, psin


def log_marginal_niw(stats: tuple[int, np.ndarray, np.ndarray], coords: np.ndarray, prior: NIWPrior) -> float:
    """``log p(X[:, coords])`` with the Gaussian's mean and covariance integrated out under ``prior``.

    ``stats`` are ``(n, mean, scatter)`` of all coordinates; an empty block has log-marginal 0.

    Examples
    --------
    >>> x = np.array([[0.0], [1.0]])
    >>> round(log_marginal_niw(sufficient_stats(x), np.array([True]), NIWPrior(np.zeros(1), 1.0, 1.0, 1.0)), 4)
    -2.7157
    """
    d = int(coords.sum())
    n = stats[0]
    if d == 0 or n == 0:
        return 0.0
    _, k0, nu0, psi0 = prior.block(coords)
    _, kn, nun, psin = _posterior(stats, coords, prior)
    return float(
        -0.5 * n * d * math.log(math.pi)
        + multigammaln(nun / 2, d)
        - multigammaln(nu0 / 2, d)
        + 0.5 * nu0 * np.linalg.slogdet(psi0)[1]
        - 0.5 * nun * np.linalg.slogdet(psin)[1]
        + 0.5 * d * (math.log(k0) - math.log(kn))
    )


def _sample_niw(rng: np.random.Generator, posterior: tuple) -> tuple[np.ndarray, np.ndarray]:
    from scipy.stats import invwishart

    mn, kn, nun, psin = posterior
    sigma = np.atleast_2d(invwishart.rvs(df=nun, scale=psin, random_state=rng))
    mu = rng.multivariate_normal(mn, sigma / kn)
    return mu, sigma


def _draw_gaussians(
    rng: np.random.Generator, switches: np.ndarray, cluster_stats: list, all_stats: tuple, prior: NIWPrior
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every component's Gaussian on the switched-on block and the background's on the rest, each drawn from its
    Normal-inverse-Wishart posterior given its rows' statistics (``(n, mean, scatter)``; ``n = 0``: the prior):
    ``locs (K, D)``, ``covariances (K, D, D)``, ``background_loc (D,)``, ``background_covariance (D, D)``, NaN
    outside their blocks."""
    k, d = len(cluster_stats), switches.shape[0]
    locs, covs = np.full((k, d), np.nan), np.full((k, d, d), np.nan)
    if switches.any():
        for j in range(k):
            mu, sigma = _sample_niw(rng, _posterior(cluster_stats[j], switches, prior))
            locs[j, switches], covs[j][np.ix_(switches, switches)] = mu, sigma
    bg_loc, bg_cov = np.full(d, np.nan), np.full((d, d), np.nan)
    if (~switches).any():
        mu, sigma = _sample_niw(rng, _posterior(all_stats, ~switches, prior))
        bg_loc[~switches], bg_cov[np.ix_(~switches, ~switches)] = mu, sigma
    return locs, covs, bg_loc, bg_cov


def prior_draws(
    n_draws: int, n_components: int, prior: NIWPrior, *, switch_prior: float, alpha: float, seed: int | None = None
) -> dict[str, np.ndarray]:
    """``n_draws`` draws of the pf-GMM's globals from the prior :func:`run_pf_gibbs` samples under: switches
    ``~ Bern(switch_prior)``, weights ``~ Dirichlet(alpha)``, label probabilities ``~ Beta(1, 1)`` and the
    Gaussians of :func:`_draw_gaussians` from ``prior`` (NaN outside their blocks), as ``GibbsDraws``' arrays
    less the assignments.

    Examples
    --------
    >>> draws = prior_draws(200, 2, NIWPrior(np.zeros(3), psi=1.0), switch_prior=0.3, alpha=1.0, seed=0)
    >>> draws["locs"].shape, round(float(draws["switches"].mean()), 1)
    ((200, 2, 3), 0.3)
    """
    rng = np.random.default_rng(seed)
    d = prior.mean.shape[0]
    nothing = (0, np.zeros(d), np.zeros((d, d)))
    keep: dict[str, list] = {name: [] for name in GibbsDraws.__dataclass_fields__ if name != "assignments"}
    for _ in range(n_draws):
        switches = rng.random(d) < switch_prior
        locs, covs, bg_loc, bg_cov = _draw_gaussians(rng, switches, [nothing] * n_components, nothing, prior)
        for name, value in (
            ("switches", switches),
            ("weights", rng.dirichlet(np.full(n_components, alpha))),
            ("label_probs", rng.beta(1.0, 1.0, n_components)),
            ("locs", locs),
            ("covariances", covs),
            ("background_loc", bg_loc),
            ("background_covariance", bg_cov),
        ):
            keep[name].append(value)
    return {name: np.stack(values) for name, values in keep.items()}


def collapsed_log_likelihood(switches: np.ndarray, prior: NIWPrior, cluster_stats: list, all_stats: tuple) -> float:
    """``log p(X | S, Z)`` with every Gaussian parameter integrated out (components on S, background on ~S).

    ``cluster_stats[k]`` are the ``(n, mean, scatter)`` of the points assigned to ``k``.
    """
    total = log_marginal_niw(all_stats, ~switches, prior)
    for stats in cluster_stats:
        total += log_marginal_niw(stats, switches, prior)
    return total


def block_log_prob(x: np.ndarray, locs: np.ndarray, covariances: np.ndarray, coords: np.ndarray) -> np.ndarray:
    """``log N(x_n[coords] | locs_k[coords], covariances_k[coords, coords])`` for every row and component, ``(N, K)``.

    Evaluated by the shared :class:`~ppmix.components.FullGaussian` family on the block.
    """
    block = np.ix_(coords, coords)
    cov = torch.as_tensor(np.stack([c[block] for c in covariances]))
    family = FullGaussian(torch.as_tensor(locs[:, coords]), torch.linalg.cholesky(cov), reg_covar=0.0)
    return family.log_prob(torch.as_tensor(x[:, coords])).numpy()


def run_pf_gibbs(
    x: np.ndarray,
    y: np.ndarray,
    observed: np.ndarray,
    n_components: int,
    *,
    switch_prior: float = 0.5,
    alpha: float = 1.0,
    num_samples: int = 500,
    warmup_steps: int = 200,
    prior: NIWPrior | None = None,
    init_assignments: np.ndarray | None = None,
    seed: int | None = None,
) -> GibbsDraws:
    """Draw from the full-covariance pf-GMM posterior by the blocked Gibbs sampler above.

    Parameters
    ----------
    x : ndarray (N, D)
    y, observed : ndarray (N,)
        Binary labels and which are observed (missing labels carry no information).
    n_components : int
    switch_prior : float in (0, 1]
    alpha : float > 0
        Dirichlet concentration of the weights.
    num_samples, warmup_steps : int
    prior : NIWPrior, optional
        Default: centred on the data mean, ``kappa = 0.01``, ``psi = `` the mean feature variance.
    init_assignments : ndarray (N,), optional
        Starting ``Z`` (default: uniform at random).
    seed : int, optional

    Returns
    -------
    GibbsDraws

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> z = rng.integers(0, 2, 40)
    >>> x = np.c_[5.0 * z + rng.normal(size=40), rng.normal(size=40)]
    >>> draws = run_pf_gibbs(x, z.astype(float), np.ones(40, bool), 2, num_samples=50, warmup_steps=20, seed=0)
    >>> draws.switches.mean(0).round(1).tolist()
    [1.0, 0.0]
    """
    rng = np.random.default_rng(seed)
    n, d = x.shape
    k = n_components
    if prior is None:
        prior = NIWPrior.from_data(x)
    z = rng.integers(0, k, n) if init_assignments is None else np.asarray(init_assignments, dtype=np.int64).copy()
    switches = rng.random(d) < switch_prior
    log_p, log_not_p = math.log(switch_prior), (math.log1p(-switch_prior) if switch_prior < 1 else -math.inf)
    all_stats = sufficient_stats(x)
    theta = np.full(k, 1.0 / k)
    eta = np.full(k, 0.5)
    keep: dict[str, list] = {name: [] for name in GibbsDraws.__dataclass_fields__}
    for sweep in range(warmup_steps + num_samples):
        # 1. switches, parameters integrated out
        cluster_stats = [sufficient_stats(x[z == j]) for j in range(k)]
        for feature in range(d):
            weights = []
            for value in (False, True):
                switches[feature] = value
                prior_term = log_p if value else log_not_p
                weights.append(prior_term + collapsed_log_likelihood(switches, prior, cluster_stats, all_stats))
            switches[feature] = rng.random() < 1.0 / (1.0 + math.exp(min(weights[0] - weights[1], 700.0)))
        # 2. Gaussian parameters given S and Z
        locs, covs, bg_loc, bg_cov = _draw_gaussians(rng, switches, cluster_stats, all_stats, prior)
        # 3. assignments
        log_joint = np.tile(np.log(theta), (n, 1))
        if switches.any():
            log_joint += block_log_prob(x, locs, covs, switches)
        label_ll = np.where(y[:, None] == 1, np.log(eta), np.log1p(-eta))
        log_joint += label_ll * observed[:, None]
        log_joint -= log_joint.max(1, keepdims=True)
        probs = np.exp(log_joint)
        probs /= probs.sum(1, keepdims=True)
        z = (probs.cumsum(1) > rng.random((n, 1))).argmax(1)
        # 4. weights and label probabilities
        counts = np.bincount(z, minlength=k)
        theta = rng.dirichlet(alpha + counts)
        ones = np.bincount(z[observed], weights=y[observed], minlength=k)
        labelled = np.bincount(z[observed], minlength=k)
        eta = rng.beta(1.0 + ones, 1.0 + labelled - ones)
        if sweep >= warmup_steps:
            for name, value in (
                ("switches", switches.copy()),
                ("assignments", z.copy()),
                ("weights", theta),
                ("label_probs", eta),
                ("locs", locs),
                ("covariances", covs),
                ("background_loc", bg_loc),
                ("background_covariance", bg_cov),
            ):
                keep[name].append(value)
    logger.info("pf-GMM Gibbs: %d draws after %d warm-up sweeps", num_samples, warmup_steps)
    return GibbsDraws(**{name: np.stack(values) for name, values in keep.items()})
