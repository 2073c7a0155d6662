"""``PFGMMGibbs``: the full-covariance prediction-focused GMM, fitted by Gibbs sampling (Sharma et al., 2023, B.3)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ppmix._validation import NotFittedError, check_matrix, check_n_components, check_positive_int, to_output
from ppmix.algorithms.kmeans import kmeans_start
from ppmix.components.family import PriorKey, check_priors
from ppmix.engines.gibbs import GibbsDraws, NIWPrior, block_log_prob, prior_draws, run_pf_gibbs
from ppmix.models._params import check_seed, store_params
from ppmix.models.pf.switches import FrameLabels, label_relevant_features

__all__ = ["PFGMMGibbs"]


class PFGMMGibbs:
    """pf-GMM with full covariance matrices, sampled by the blocked Gibbs sampler of Supplement B.3.

    The switches ``S_d`` are shared by all points (as in B.3's conditionals) and drawn
    with the Gaussian parameters integrated out; see :mod:`ppmix.engines.gibbs` for
    the model and the sweep. Predictions average over the kept draws (the posterior
    predictive), so they account for the uncertainty in which features are relevant.

    Parameters
    ----------
    n_components : int, default 2
    switch_prior : float in (0, 1], default 0.5
    alpha : float > 0, default 1.0
        Dirichlet concentration of the weights.
    num_samples, warmup_steps : int, default 300, 200
    init_params : {"relevance", "random"}, default "relevance"
        Starting assignments: k-means on the label-relevant features (as for
        :class:`~ppmix.models.pf.pf_gmm.PFGMM`) or uniform at random.
    max_predictive_draws : int, default 100
        Draws (evenly thinned) averaged by the predictions.
    priors : dict, optional
        The priors' hyperparameters, by key (:meth:`prior_keys` lists them with their defaults; None: every
        default), numbers (``"locs_loc"`` also one per feature): ``"weights"`` the Dirichlet concentration of the
        weights (default ``alpha``, which it replaces), and of the Normal-inverse-Wishart prior of every Gaussian
        block (the components' on the switched-on features, the background's on the others) ``"locs_loc"`` its
        mean (default the data's, as :class:`~ppmix.models.pf.pf_gmm.PFGMM`'s key), ``"locs_kappa"`` the
        precision factor of a mean (its prior covariance is the block's over it; default 0.01),
        ``"covariance_scale"`` ``psi`` of the inverse-Wishart scale ``psi I`` (default the data's mean variance)
        and ``"covariance_extra_dof"`` its degrees of freedom beyond the block's size (default 2).
    seed : int, optional

    Attributes
    ----------
    draws_ : GibbsDraws
    relevance_ : ndarray or pandas Series
        Posterior probability ``P(S_d = 1 | X, Y)`` of each feature.

    Examples
    --------
    >>> from ppmix.datasets import make_pf_synthetic
    >>> data = make_pf_synthetic(200, n_relevant=2, n_features=5, seed=0)
    >>> model = PFGMMGibbs(4, switch_prior=0.3, num_samples=40, warmup_steps=20, seed=0).fit(data.X, data.y)
    >>> (model.relevance_ > 0.5).tolist()
    [True, True, False, False, False]
    >>> model.predict_proba(data.X[:3]).shape
    (3, 2)
    """

    def __init__(
        self,
        n_components: int = 2,
        *,
        switch_prior: float = 0.5,
        alpha: float = 1.0,
        num_samples: int = 300,
        warmup_steps: int = 200,
        init_params: str = "relevance",
        max_predictive_draws: int = 100,
        priors: dict[str, Any] | None = None,
        seed: int | None = None,
    ) -> None:
        store_params(self, locals())

    def prior_keys(self) -> dict[str, PriorKey]:
        """Every hyperparameter ``priors=`` may set, with its default.

        Examples
        --------
        >>> sorted(PFGMMGibbs().prior_keys())
        ['covariance_extra_dof', 'covariance_scale', 'locs_kappa', 'locs_loc', 'weights']
        """
        return {
            "weights": PriorKey("the Dirichlet concentration of the weights (default alpha)"),
            "locs_loc": PriorKey("the Normal-inverse-Wishart mean (default the data's mean)", "real"),
            "locs_kappa": PriorKey("the precision factor of a mean over its block's covariance (default 0.01)"),
            "covariance_scale": PriorKey("psi of the inverse-Wishart scale psi I (default the data's mean variance)"),
            "covariance_extra_dof": PriorKey("the inverse-Wishart degrees of freedom beyond the block's (default 2)"),
        }

    def _check_priors(self) -> None:
        """``priors`` None or a dict of :meth:`prior_keys` to values in their domains (numbers but ``locs_loc``);
        ``priors["weights"]`` and ``alpha`` not both set; else a ``ValueError`` naming ``priors``."""
        check_priors(self.priors, self.prior_keys(), "PFGMMGibbs", arrays=("locs_loc",))
        if "weights" in self._settings() and self.alpha != 1:
            raise ValueError("priors['weights'] and alpha both set the weights' concentration: set one")

    def _settings(self) -> dict[str, Any]:
        """The hyperparameters ``priors`` sets (a key set to None keeps its default)."""
        return {key: value for key, value in (self.priors or {}).items() if value is not None}

    def _alpha(self) -> float:
        """The weights' Dirichlet concentration: ``priors["weights"]``, else ``alpha``."""
        return float(self._settings().get("weights", self.alpha))

    def _niw_prior(self, rows: np.ndarray) -> NIWPrior:
        """The Normal-inverse-Wishart prior of ``priors``, each default :meth:`NIWPrior.from_data`'s."""
        settings, defaults = self._settings(), NIWPrior.from_data(rows)
        mean = np.broadcast_to(np.asarray(settings.get("locs_loc", defaults.mean), dtype=float), defaults.mean.shape)
        return NIWPrior(
            mean=mean.copy(),
            kappa=float(settings.get("locs_kappa", defaults.kappa)),
            psi=float(settings.get("covariance_scale", defaults.psi)),
            extra_dof=float(settings.get("covariance_extra_dof", defaults.extra_dof)),
        )

    def fit(self, X: Any, y: Any) -> "PFGMMGibbs":
        """Sample the posterior given features ``X`` and binary labels ``y`` (NaN = missing)."""
        p = self.switch_prior
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < float(p) <= 1.0:
            raise ValueError(f"switch_prior must be a probability in (0, 1]; got {p!r}")
        if not (isinstance(self.alpha, (int, float)) and self.alpha > 0):
            raise ValueError(f"alpha must be positive; got {self.alpha!r}")
        self._check_priors()
        if self.init_params not in ("relevance", "random"):
            raise ValueError(f"init_params must be 'relevance' or 'random'; got {self.init_params!r}")
        check_positive_int(self.num_samples, "num_samples")
        check_positive_int(self.max_predictive_draws, "max_predictive_draws")
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be a non-negative integer; got {self.warmup_steps!r}")
        x, names = check_matrix(X, "X")
        k = check_n_components(self.n_components, x.shape[0])
        labels = FrameLabels.from_values(y, x.shape[0], x.dtype, x.device)
        start = None
        seed = check_seed(self.seed)
        generator = torch.Generator().manual_seed(0 if seed is None else seed)
        if self.init_params == "relevance":
            selected = label_relevant_features(x[labels.observed], labels.y[labels.observed])
            features = x[:, selected] if selected.any() else x
            start = kmeans_start(features - features.mean(0), k, generator)[1].numpy()
        self.n_features_in_ = int(x.shape[1])
        self.feature_names_in_ = names
        rows = x.numpy()
        #: the training rows, labels and which labels are observed (``to_arviz``'s data)
        self._train = (rows, labels.y.numpy(), labels.observed.numpy())
        self.prior_ = self._niw_prior(rows)  # without priors, run_pf_gibbs's default
        self.draws_: GibbsDraws = run_pf_gibbs(
            *self._train,
            k,
            switch_prior=float(p),
            alpha=self._alpha(),
            num_samples=self.num_samples,
            warmup_steps=self.warmup_steps,
            prior=self.prior_,
            init_assignments=start,
            seed=self.seed,
        )
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "draws_"):
            raise NotFittedError("this PFGMMGibbs is not fitted yet; call fit first")

    def _data(self, X: Any) -> np.ndarray:
        self._check_fitted()
        x, _ = check_matrix(X, "X", n_features=self.n_features_in_, feature_names=self.feature_names_in_)
        return x.numpy()

    def _draw_indices(self) -> np.ndarray:
        total = self.draws_.weights.shape[0]
        return np.unique(np.linspace(0, total - 1, min(total, self.max_predictive_draws)).round().astype(int))

    def _component_log_joint(self, x: np.ndarray, i: int) -> np.ndarray:
        """``log theta_k + log N(x_S | mu_k, Sigma_k)`` of draw ``i``, ``(N, K)``."""
        d = self.draws_
        on = d.switches[i]
        log_joint = np.tile(np.log(d.weights[i]), (x.shape[0], 1))
        if on.any():
            log_joint += block_log_prob(x, d.locs[i], d.covariances[i], on)
        return log_joint

    def _label_probability(self, X: Any) -> np.ndarray:
        """Posterior predictive ``P(y=1 | x)``, ``(N,)``, averaged over the draws."""
        x = self._data(X)
        p1 = np.zeros(x.shape[0])
        indices = self._draw_indices()
        for i in indices:
            log_joint = self._component_log_joint(x, i)
            resp = np.exp(log_joint - log_joint.max(1, keepdims=True))
            p1 += (resp / resp.sum(1, keepdims=True)) @ self.draws_.label_probs[i]
        return p1 / len(indices)

    def predict_proba(self, X: Any) -> Any:
        """Posterior predictive ``[P(y=0 | x), P(y=1 | x)]``, ``(N, 2)``, averaged over the draws.

        A tensor ``X`` gives a tensor, anything else a numpy array (as every ppmix model).
        """
        p1 = self._label_probability(X)
        return to_output(torch.as_tensor(np.stack([1 - p1, p1], axis=1)), X)

    def predict(self, X: Any) -> Any:
        """The more probable label of each row."""
        return to_output(torch.as_tensor((self._label_probability(X) > 0.5).astype(np.int64)), X)

    def score_samples(self, X: Any) -> Any:
        """``log p(x)`` under the posterior predictive (the average density over the draws)."""
        return to_output(torch.as_tensor(self._log_density(X)), X)

    def _log_density(self, X: Any) -> np.ndarray:
        x = self._data(X)
        stacked = np.stack([self._draw_log_density(x, i) for i in self._draw_indices()])
        peak = stacked.max(0)
        return peak + np.log(np.exp(stacked - peak).mean(0))

    def _draw_terms(self, x: np.ndarray, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``i``'s :meth:`_component_log_joint` ``(N, K)`` on the switched-on features and the background's
        log-density ``(N,)`` on the others (zeros where every feature is on)."""
        d, off = self.draws_, ~self.draws_.switches[i]
        background = np.zeros(x.shape[0])
        if off.any():
            background = block_log_prob(x, d.background_loc[i][None], d.background_covariance[i][None], off)[:, 0]
        return self._component_log_joint(x, i), background

    def _draw_log_density(self, x: np.ndarray, i: int, terms: tuple | None = None) -> np.ndarray:
        """``log p(x_n)`` under draw ``i``, ``(N,)``: the components' mixture on the switched-on features, the
        background on the others (``terms``: :meth:`_draw_terms`, if already computed)."""
        log_joint, background = self._draw_terms(x, i) if terms is None else terms
        peak = log_joint.max(1)
        return peak + np.log(np.exp(log_joint - peak[:, None]).sum(1)) + background

    def _draw_log_joint(self, i: int, terms: tuple | None = None) -> float:
        """``log p(X, y, Z, S, theta)`` of draw ``i`` on the training data: the sampler's target, with the
        switches' ``Bern(p)``, the weights' ``Dirichlet`` (``alpha`` or ``priors``), the label probabilities'
        ``Beta(1, 1)`` and the Normal-inverse-Wishart prior (``prior_``) of every Gaussian block; the data's terms
        are each row's assigned component's and the background's (``terms``: :meth:`_draw_terms` on the training
        rows, if already computed)."""
        from scipy.stats import dirichlet

        d, (x, y, observed) = self.draws_, self._train
        on, z = d.switches[i], d.assignments[i]
        log_joint, background = self._draw_terms(x, i) if terms is None else terms
        p = float(self.switch_prior)
        total = on.sum() * np.log(p) + ((~on).sum() * np.log1p(-p) if (~on).any() else 0.0)
        total += dirichlet.logpdf(d.weights[i], np.full(d.weights.shape[1], self._alpha()))
        total += log_joint[np.arange(z.shape[0]), z].sum() + background.sum()
        eta = d.label_probs[i][z[observed]]
        total += np.where(y[observed] == 1, np.log(eta), np.log1p(-eta)).sum()
        blocks = [(on, d.locs[i][k], d.covariances[i][k]) for k in range(d.weights.shape[1])]
        blocks.append((~on, d.background_loc[i], d.background_covariance[i]))
        for coords, loc, cov in blocks:
            if coords.any():
                total += _niw_log_density(loc, cov, coords, self.prior_)
        return float(total)

    def _replicate(self, i: int, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` rows drawn from the model at draw ``i``, ``(n, D)``."""
        d = self.draws_
        on = d.switches[i]
        z = rng.choice(d.weights.shape[1], size=n, p=d.weights[i] / d.weights[i].sum())
        x = np.empty((n, self.n_features_in_))
        for k in np.unique(z) if on.any() else ():
            rows = np.flatnonzero(z == k)
            block = d.covariances[i][k][np.ix_(on, on)]
            x[np.ix_(rows, on)] = rng.multivariate_normal(d.locs[i][k][on], block, size=rows.size)
        if (~on).any():
            block = d.background_covariance[i][np.ix_(~on, ~on)]
            x[:, ~on] = rng.multivariate_normal(d.background_loc[i][~on], block, size=n)
        return x

    @property
    def relevance_(self) -> Any:
        """``P(S_d = 1 | X, Y)`` per feature (a Series named by the features for DataFrame input)."""
        self._check_fitted()
        values = self.draws_.switches.mean(0)
        if self.feature_names_in_ is None:
            return values
        import pandas as pd

        return pd.Series(values, index=self.feature_names_in_, name="relevance")

    def to_arviz(self) -> Any:
        """ArviZ ``InferenceData`` of the draws (one chain) on the training data.

        ``posterior``: switch, assignment and parameter draws; ``log_likelihood``: ``log p(x_n)`` of every row
        under every draw (for ``az.loo``); ``posterior_predictive``: one replicated ``X`` per draw (for
        ``az.plot_ppc``); ``observed_data``: ``X``; ``sample_stats``: ``lp``, the log joint density of every
        draw (:meth:`_draw_log_joint`; its trace is the Gibbs sampler's stand-in for ``az.plot_energy``);
        ``prior``: as many draws of the globals from the priors the sampler ran under (``priors`` as set;
        :func:`~ppmix.engines.gibbs.prior_draws`).
        """
        import arviz as az

        self._check_fitted()
        d = self.draws_
        x = self._train[0]
        n_draws = d.weights.shape[0]
        posterior = {
            "switches": d.switches.astype(np.int8),
            "assignments": d.assignments,
            "weights": d.weights,
            "label_probs": d.label_probs,
            "locs": d.locs,
            "covariances": d.covariances,
            "background_loc": d.background_loc,
            "background_covariance": d.background_covariance,
        }
        dims = {
            "switches": ["feature"],
            "assignments": ["obs_id"],
            "weights": ["component"],
            "label_probs": ["component"],
            "locs": ["component", "feature"],
            "covariances": ["component", "feature", "feature_bis"],
            "background_loc": ["feature"],
            "background_covariance": ["feature", "feature_bis"],
        }
        rng = np.random.default_rng(self.seed)
        coords = {"feature": self.feature_names_in_} if self.feature_names_in_ is not None else None
        log_likelihood, lp = [], []
        for i in range(n_draws):  # each draw scored once, for its log-likelihood and its log joint
            terms = self._draw_terms(x, i)
            log_likelihood.append(self._draw_log_density(x, i, terms))
            lp.append(self._draw_log_joint(i, terms))
        prior = prior_draws(
            n_draws,
            self.n_components,
            self.prior_,
            switch_prior=float(self.switch_prior),
            alpha=self._alpha(),
            seed=self.seed,
        )
        return az.from_dict(
            posterior={k: v[None] for k, v in posterior.items()},
            prior={k: v[None] for k, v in prior.items()},
            log_likelihood={"x": np.stack(log_likelihood)[None]},
            posterior_predictive={"x": np.stack([self._replicate(i, x.shape[0], rng) for i in range(n_draws)])[None]},
            observed_data={"x": x},
            sample_stats={"lp": np.array(lp)[None]},
            dims=dims,
            coords=coords,
        )


def _niw_log_density(loc: np.ndarray, covariance: np.ndarray, coords: np.ndarray, prior: NIWPrior) -> float:
    """``log NIW(loc[coords], covariance[coords, coords])`` under ``prior`` restricted to the block ``coords``."""
    from scipy.stats import invwishart, multivariate_normal

    mean, kappa, dof, psi = prior.block(coords)
    block = covariance[np.ix_(coords, coords)]
    inverse_wishart = invwishart.logpdf(block if block.shape[0] > 1 else block[0, 0], df=dof, scale=psi)
    return float(inverse_wishart + multivariate_normal.logpdf(loc[coords], mean, block / kappa))
