"""``GMM``: the Gaussian mixture model, with diagonal or full covariances."""

from __future__ import annotations

import math
from typing import Any

import pyro
import pyro.distributions as dist
import torch
from pyro.distributions import constraints

from ppmix._init import kmeans, kmeans_plusplus, nearest_centre
from ppmix._validation import check_n_components, check_positive_int, to_output
from ppmix.components import DiagGaussian, FullGaussian
from ppmix.components._centred import CentredData
from ppmix.models._flat import FlatPrior
from ppmix.models.base import MixtureModel

__all__ = ["GMM"]

COVARIANCE_TYPES = ("diag", "full")
INIT_METHODS = ("kmeans", "k-means++", "random")
#: k-means runs (best inertia kept) behind one ``init_params="kmeans"`` EM start
KMEANS_RUNS = 3


class GMM(MixtureModel):
    """Gaussian mixture model: ``z_n ~ Cat(weights)``, ``x_n | z_n = k ~ N(mu_k, Sigma_k)``.

    One Pyro program, three engines: ``fit(X, engine="em")`` (closed-form EM, the
    default), ``"svi"`` (``TraceEnum_ELBO`` on the same model) and ``"mcmc"`` (NUTS).
    EM and SVI estimate by maximum likelihood (flat priors, so the ELBO equals the
    log-likelihood); MCMC samples the posterior under weakly informative,
    data-scaled priors: ``weights ~ Dirichlet(1)``, ``locs ~ N(mean(X), 3 std(X))``,
    ``scales ~ LogNormal(log std(X), 1)`` and, for full covariance,
    ``corr_cholesky ~ LKJCholesky(D, 2)``.

    Parameters
    ----------
    n_components : int, default 1
    covariance_type : {"diag", "full"}, default "diag"
    n_init : int, default 1
        EM restarts; the best objective is kept.
    max_iter : int, default 100
    tol : float, default 1e-6
        EM stops when the relative change of the log-likelihood is at most ``tol``.
    reg_covar : float, default 1e-6
        Added to every variance (the covariance floor).
    init_params : {"kmeans", "k-means++", "random"}, default "kmeans"
        ``"kmeans"``: the best of 3 runs of greedy k-means++ seeding and Lloyd
        iterations; ``"k-means++"``: one seeding only; ``"random"``: random
        responsibilities.
    warm_start : bool, default False
        Continue EM from the current parameters on the next ``fit``.
    seed, device, dtype, progress : see :class:`~ppmix.models.base.MixtureModel`.

    Attributes
    ----------
    weights_ : Tensor (K,)
    components_ : DiagGaussian or FullGaussian
    means_, covariances_ : Tensor
        ``(K, D)`` and ``(K, D)`` (diag) or ``(K, D, D)`` (full).

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
    """

    def __init__(
        self,
        n_components: int = 1,
        *,
        covariance_type: str = "diag",
        n_init: int = 1,
        max_iter: int = 100,
        tol: float = 1e-6,
        reg_covar: float = 1e-6,
        init_params: str = "kmeans",
        warm_start: bool = False,
        seed: int | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype = torch.float64,
        progress: bool = True,
    ) -> None:
        super().__init__(n_components, seed=seed, device=device, dtype=dtype, progress=progress)
        self.covariance_type = covariance_type
        self.n_init = n_init
        self.max_iter = max_iter
        self.tol = tol
        self.reg_covar = reg_covar
        self.init_params = init_params
        self.warm_start = warm_start

    def validate_params(self) -> None:
        super().validate_params()
        if self.covariance_type not in COVARIANCE_TYPES:
            raise ValueError(f"covariance_type must be one of {COVARIANCE_TYPES}; got {self.covariance_type!r}")
        if self.init_params not in INIT_METHODS:
            raise ValueError(f"init_params must be one of {INIT_METHODS}; got {self.init_params!r}")
        check_positive_int(self.n_init, "n_init")
        check_positive_int(self.max_iter, "max_iter")
        if not self.reg_covar >= 0:
            raise ValueError(f"reg_covar must be non-negative; got {self.reg_covar}")

    def prepare_data(self, X: Any, y: Any = None, *, fitting: bool = False) -> torch.Tensor:
        x = super().prepare_data(X, y, fitting=fitting)
        if fitting:
            check_n_components(self.n_components, x.shape[0])
            # centre and spread of the data, for the weakly informative priors of MCMC
            self._data_mean = x.mean(0)
            self._data_std = x.std(0).clamp_min(1e-6) if x.shape[0] > 1 else torch.ones_like(x[0])
        return x

    # ------------------------------------------------------------ the program
    def model(self, x: torch.Tensor) -> None:
        """``weights -> z_n -> x_n`` with the component index enumerated in parallel."""
        k, d = self.n_components, x.shape[1]
        opts = {"dtype": x.dtype, "device": x.device}
        weights = pyro.sample("weights", self._prior("weights", k, d, opts))
        with pyro.plate("components", k):
            locs = pyro.sample("locs", self._prior("locs", k, d, opts))
            scales = pyro.sample("scales", self._prior("scales", k, d, opts))
            if self.covariance_type == "full":
                corr = pyro.sample("corr_cholesky", self._prior("corr_cholesky", k, d, opts))
        family = (
            DiagGaussian(locs, scales)
            if self.covariance_type == "diag"
            else FullGaussian(locs, scales[..., None] * corr)
        )
        with self.data_plate(x.shape[0]) as idx:
            z = pyro.sample("z", dist.Categorical(weights), infer={"enumerate": "parallel"})
            pyro.sample("x", family.pyro_dist(z), obs=x[idx])

    def _prior(self, site: str, k: int, d: int, opts: dict) -> dist.Distribution:
        """Flat priors for maximum likelihood; weakly informative ones under :meth:`bayesian`."""
        if not self.is_bayesian:
            support = {
                "weights": constraints.simplex,
                "locs": constraints.real,
                "scales": constraints.positive,
                "corr_cholesky": constraints.corr_cholesky,
            }[site]
            batch, event = ((), (k,)) if site == "weights" else ((k,), (d, d) if site == "corr_cholesky" else (d,))
            return FlatPrior(support, batch, event)
        mean, std = self._data_mean.to(**opts), self._data_std.to(**opts)
        if site == "weights":
            return dist.Dirichlet(torch.ones(k, **opts))
        if site == "locs":
            return dist.Normal(mean, 3.0 * std).to_event(1)
        if site == "scales":
            return dist.LogNormal(std.log(), 1.0).to_event(1)
        return dist.LKJCholesky(d, torch.tensor(2.0, **opts))

    # -------------------------------------------------------------- globals
    def get_globals(self) -> dict[str, torch.Tensor]:
        comp = self.components_
        if isinstance(comp, DiagGaussian):
            return {"weights": self.weights_.clone(), "locs": comp.loc.clone(), "scales": comp.scale.clone()}
        scales = comp.scale_tril.square().sum(-1).sqrt()
        return {
            "weights": self.weights_.clone(),
            "locs": comp.loc.clone(),
            "scales": scales,
            "corr_cholesky": comp.scale_tril / scales[..., None],
        }

    def set_globals(self, values: dict[str, torch.Tensor]) -> None:
        opts = {"dtype": self.dtype, "device": self._device}
        weights = torch.as_tensor(values["weights"]).to(**opts)
        locs, scales = torch.as_tensor(values["locs"]).to(**opts), torch.as_tensor(values["scales"]).to(**opts)
        self.weights_ = weights / weights.sum()
        if self.covariance_type == "diag":
            self.components_ = DiagGaussian(locs, scales, reg_covar=self.reg_covar)
        else:
            corr = torch.as_tensor(values["corr_cholesky"]).to(**opts)
            corr = corr / corr.norm(dim=-1, keepdim=True)  # rows of a correlation Cholesky have unit norm
            self.components_ = FullGaussian(locs, scales[..., None] * corr, reg_covar=self.reg_covar)
        self._invalidate_guide()

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"weights": self.weights_.clone(), **self.components_.state_dict()}

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        opts = {"dtype": self.dtype, "device": self._device}
        self.weights_ = tensors["weights"].to(**opts)
        family = DiagGaussian if self.covariance_type == "diag" else FullGaussian
        names = family.param_names
        self.components_ = family(*(tensors[n].to(**opts) for n in names), reg_covar=self.reg_covar)
        self._invalidate_guide()

    def arviz_dims(self) -> dict[str, list[str]]:
        dims = {"weights": ["component"], "locs": ["component", "feature"], "scales": ["component", "feature"]}
        if self.covariance_type == "full":
            dims["corr_cholesky"] = ["component", "feature", "feature_bis"]
        return dims

    # ------------------------------------------------------------------- EM
    def em_data(self, data: torch.Tensor) -> CentredData:
        return CentredData.from_tensor(data)

    def n_observations(self, data: Any) -> int:
        return int(data.n_samples if isinstance(data, CentredData) else data.shape[0])

    def em_initialize(self, data: CentredData, generator: torch.Generator) -> None:
        """Responsibilities from k-means (or its seeding, or at random), then one M-step."""
        x, k = data.x, self.n_components
        if self.init_params == "random":
            resp = torch.rand(x.shape[0], k, generator=generator, dtype=x.dtype).to(x.device)
            resp = resp / resp.sum(1, keepdim=True)
        else:
            centred = data.centred
            if self.init_params == "kmeans":
                _, labels = kmeans(centred, k, generator, n_init=KMEANS_RUNS)
            else:
                labels = nearest_centre(centred, kmeans_plusplus(centred, k, generator))
            resp = torch.nn.functional.one_hot(labels, k).to(x.dtype)
        family = DiagGaussian if self.covariance_type == "diag" else FullGaussian
        d = x.shape[1]
        scale = torch.ones(k, d, dtype=x.dtype, device=x.device)
        if family is FullGaussian:
            scale = torch.diag_embed(scale)
        self.components_ = family(torch.zeros(k, d, dtype=x.dtype, device=x.device), scale, reg_covar=self.reg_covar)
        self.m_step(data, resp)

    def e_step(self, data: CentredData) -> tuple[torch.Tensor, torch.Tensor]:
        """Responsibilities and the log-likelihood ``sum_n log sum_k w_k N(x_n | k)``."""
        log_joint = self.components_.log_prob(data).add_(self.weights_.log())
        # a fused, in-place log-sum-exp (several times faster than torch.logsumexp for small K)
        peak = log_joint.amax(dim=1, keepdim=True)
        resp = log_joint.sub_(peak).exp_()
        total = resp.sum(dim=1, keepdim=True)
        resp.div_(total)
        return resp, (peak + total.log()).sum()

    def m_step(self, data: CentredData, resp: torch.Tensor) -> None:
        """Closed-form weighted MLE of the components and ``weights = mean responsibility``."""
        self.components_.fit(data, resp)
        counts = resp.sum(0) + 10 * torch.finfo(resp.dtype).eps
        self.weights_ = counts / counts.sum()
        self._invalidate_guide()

    # ---------------------------------------------------------- predictions
    def _log_joint(self, data: torch.Tensor) -> torch.Tensor:
        return self.components_.log_prob(data) + self.weights_.log()

    def responsibilities(self, data: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self._log_joint(data), dim=1)

    def posterior_marginals(self, data: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"z": self.responsibilities(data)}

    def pointwise_log_likelihood(self, data: torch.Tensor) -> torch.Tensor:
        return torch.logsumexp(self._log_joint(data), dim=1)

    def bic(self, X: Any) -> float:
        """Bayesian information criterion ``-2 log L + p log N`` (lower is better)."""
        self._check_fitted()
        x = self.prepare_data(X)
        return -2.0 * float(self.pointwise_log_likelihood(x).sum()) + self.n_parameters * math.log(x.shape[0])

    def aic(self, X: Any) -> float:
        """Akaike information criterion ``-2 log L + 2 p`` (lower is better)."""
        self._check_fitted()
        x = self.prepare_data(X)
        return -2.0 * float(self.pointwise_log_likelihood(x).sum()) + 2.0 * self.n_parameters

    @property
    def n_parameters(self) -> int:
        """Number of free parameters."""
        k, d = self.n_components, self.n_features_in_
        cov = k * d if self.covariance_type == "diag" else k * d * (d + 1) // 2
        return (k - 1) + k * d + cov

    def sample(self, n_samples: int = 1) -> dict[str, Any]:
        """Draw ``n_samples`` points: ``{"x": (n, D) array, "z": (n,) component indices}``."""
        self._check_fitted()
        n = check_positive_int(n_samples, "n_samples")
        gen = self._generator(offset=7919)
        z = torch.multinomial(self.weights_.cpu(), n, replacement=True, generator=gen).to(self._device)
        x = self.components_.sample(z, generator=gen if self._device.type == "cpu" else None)
        return {"x": x.cpu().numpy(), "z": z.cpu().numpy()}

    # ------------------------------------------------------------ attributes
    @property
    def means_(self) -> torch.Tensor:
        self._check_fitted()
        return self.components_.loc

    @property
    def covariances_(self) -> torch.Tensor:
        self._check_fitted()
        comp = self.components_
        return comp.variance if isinstance(comp, DiagGaussian) else comp.covariance

    def summary(self) -> dict[str, Any]:
        """A JSON-able description of the fit."""
        self._check_fitted()
        return {
            "model": "GMM",
            "n_components": self.n_components,
            "covariance_type": self.covariance_type,
            "engine": self.engine_,
            "n_iter": self.n_iter_,
            "converged": self.converged_,
            "mean_log_likelihood": self.lower_bound_,
            "weights": to_output(self.weights_, None).tolist(),
            "means": to_output(self.means_, None).tolist(),
            "feature_names": self.feature_names_in_,
        }
