"""The prediction-constrained GMM of Hughes et al. (2017) (:class:`PCGMM`), trained by Adam on
``w log p(X) + lambda log p(Y | X)``, and :class:`PredictionOnlyGMM`, the same with the generative term dropped."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from ppmix._validation import check_positive_int
from ppmix.components import DiagGaussian
from ppmix.components.centred import CentredData
from ppmix.models._params import store_params
from ppmix.models.baselines._base import _GaussianMixtureDensity, _LabelBaseline, check_binary_labels
from ppmix.models.gmm import GMM

__all__ = ["PCGMM", "PredictionOnlyGMM"]

logger = logging.getLogger(__name__)

#: window (Adam steps) of the pc-GMM stopping rule
PC_PATIENCE = 50


class PCGMM(_GaussianMixtureDensity, _LabelBaseline):
    """Prediction-constrained GMM (Hughes et al., 2017; Sharma et al., 2023, Supplement E.2).

    A supervised diagonal GMM over ``(x, y)``: ``z ~ Cat(theta)``,
    ``x | z = k ~ N(mu_k, diag(sigma_k^2))``, ``y | z = k ~ Bern(eta_k)``, with the
    prediction ``p(y = 1 | x) = sum_k p(k | x) eta_k``. It maximises, by full-batch
    Adam in an unconstrained parametrisation (softmax weights, log scales, logit
    label probabilities),

        generative_weight * mean_n log p(x_n) + lam * mean_{labelled n} log p(y_n | x_n),

    from ``n_init`` starts, each the k-means-initialised EM fit of a
    :class:`~ppmix.GMM` on ``X`` (seeds ``seed, seed + 1, ...``) with ``eta_k`` the
    responsibility-weighted label mean; the start whose final objective is highest
    is kept. Unlabelled rows enter only the generative term.

    Parameters
    ----------
    n_components : int, default 4
    lam : float, default 10.0
        Weight ``lambda`` of the prediction term. The generative term is a sum over
        ``D`` features, so ``lambda`` must grow with ``D`` to matter.
    lr : float, default 0.05
        Adam learning rate.
    num_steps : int, default 500
        Most Adam steps per start.
    tol : float, default 1e-6
        A start stops early when the best objective of its last
        :data:`PC_PATIENCE` steps exceeds the best before them by at most
        ``tol * (1 + |objective|)``; ``0`` runs all ``num_steps``.
    generative_weight : float, default 1.0
        ``0`` drops the generative term (see :class:`PredictionOnlyGMM`).
    n_init : int, default 3
    reg_covar : float, default 1e-6
        Variance floor: ``sigma^2 = exp(2 s) + reg_covar``.
    seed : int, optional

    Attributes
    ----------
    weights_ : ndarray (K,)
    means_ : ndarray (K, D)
    covariances_ : ndarray (K, D)
        Variances.
    label_probs_ : ndarray (K,)
        ``eta_k = P(y = 1 | z = k)``.
    initial_objective_, objective_ : float
        Training objective of the kept start at its initialisation and after training.
    history_ : list of float
        Objective before every Adam step of the kept start.
    n_iter_ : int
        Adam steps the kept start took.
    converged_ : bool
        Whether it stopped by ``tol`` rather than ``num_steps``.

    Examples
    --------
    >>> from ppmix.datasets import make_two_mixture
    >>> X, y = make_two_mixture(200, n_relevant=2, n_irrelevant=2, seed=0)
    >>> model = PCGMM(2, lam=5.0, num_steps=50, n_init=1, seed=0).fit(X, y)
    >>> model.initial_objective_ <= model.objective_, model.predict_proba(X).shape
    (True, (200, 2))
    """

    def __init__(
        self,
        n_components: int = 4,
        *,
        lam: float = 10.0,
        lr: float = 0.05,
        num_steps: int = 500,
        tol: float = 1e-6,
        generative_weight: float = 1.0,
        n_init: int = 3,
        reg_covar: float = 1e-6,
        seed: int | None = None,
    ) -> None:
        store_params(self, locals())

    def _validate_params(self) -> None:
        check_positive_int(self.n_components, "n_components")
        check_positive_int(self.n_init, "n_init")
        check_positive_int(self.num_steps, "num_steps")
        for name in ("lam", "tol", "generative_weight", "reg_covar"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be non-negative; got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive; got {self.lr}")
        if self.lam == 0 and self.generative_weight == 0:
            raise ValueError("lam and generative_weight are both 0: the objective is empty")

    # ---------------------------------------------------------------- the objective
    def _log_joint(self, params: dict[str, torch.Tensor], data: CentredData | torch.Tensor) -> torch.Tensor:
        """``log theta_k + log N(x_n | mu_k, sigma_k)``, shape ``(N, K)`` (a plain tensor is centred at the
        component means' mean, not the batch's, so each row's value depends on that row only)."""
        scale = (torch.exp(2 * params["log_scale"]) + self.reg_covar).sqrt()
        return DiagGaussian(params["loc"], scale).log_prob(data) + torch.log_softmax(params["logits"], 0)

    def _terms(
        self, params: dict[str, torch.Tensor], data: CentredData, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-row ``log p(x_n)`` ``(N,)`` and ``log p(y | x)`` of the labelled rows."""
        log_joint = self._log_joint(params, data)
        log_px = torch.logsumexp(log_joint, 1)
        labelled = ~torch.isnan(y)
        log_post = log_joint[labelled] - log_px[labelled, None]
        eta = params["label_logit"]
        log_eta = torch.stack([torch.nn.functional.logsigmoid(-eta), torch.nn.functional.logsigmoid(eta)])  # (2, K)
        log_label = log_eta[y[labelled].long()]
        return log_px, torch.logsumexp(log_post + log_label, 1)

    def _objective(self, params: dict[str, torch.Tensor], data: CentredData, y: torch.Tensor) -> torch.Tensor:
        log_px, log_pyx = self._terms(params, data, y)
        return self.generative_weight * log_px.mean() + self.lam * log_pyx.mean()

    def objective(self, X: Any, y: Any) -> float:
        """The training objective at the fitted parameters on ``(X, y)`` (per point, as in :meth:`fit`)."""
        x = self._prepare(X)
        labels = torch.as_tensor(check_binary_labels(y, x.shape[0]))
        with torch.no_grad():
            return float(self._objective(self._params, CentredData.from_tensor(x), labels))

    # -------------------------------------------------------------------------- fit
    def _start(self, x: torch.Tensor, y: torch.Tensor, seed: int | None) -> dict[str, torch.Tensor]:
        """Parameters from an EM fit of a GMM on ``X`` and responsibility-weighted label means."""
        # EM needs a variance floor even when Adam's parametrisation does not (reg_covar = 0)
        gmm = GMM(self.n_components, seed=seed, reg_covar=max(self.reg_covar, 1e-6), progress=False).fit(x)
        resp = gmm.predict_proba(x)
        labelled = ~torch.isnan(y)
        eta = (resp[labelled].T @ y[labelled] + 0.5) / (resp[labelled].sum(0) + 1.0)
        variance = (gmm.covariances_ - self.reg_covar).clamp_min(1e-12)
        return {
            "logits": gmm.weights_.log(),
            "loc": gmm.means_.clone(),
            "log_scale": 0.5 * variance.log(),
            "label_logit": torch.logit(eta),
        }

    def _train(
        self, params: dict[str, torch.Tensor], data: CentredData, y: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], list[float], float, bool]:
        params = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
        optimizer = torch.optim.Adam(list(params.values()), lr=self.lr)
        history: list[float] = []
        converged = False
        for step in range(self.num_steps):
            optimizer.zero_grad()
            objective = self._objective(params, data, y)
            (-objective).backward()
            optimizer.step()
            history.append(objective.item())
            if step >= PC_PATIENCE:
                recent, before = max(history[-PC_PATIENCE:]), max(history[:-PC_PATIENCE])
                if recent - before <= self.tol * (1.0 + abs(recent)):
                    converged = True
                    break
        with torch.no_grad():
            final = float(self._objective(params, data, y))
        return {k: v.detach() for k, v in params.items()}, history, final, converged

    def fit(self, X: Any, y: Any) -> "PCGMM":
        """Adam on the prediction-constrained objective from ``n_init`` GMM starts; keep the best."""
        self._validate_params()
        x, labels = self._prepare_fit(X, y)
        data, y_t = CentredData.from_tensor(x), torch.as_tensor(labels)
        best = None
        for restart in range(self.n_init):
            start = self._start(x, y_t, None if self.seed is None else self.seed + restart)
            with torch.no_grad():
                initial = float(self._objective(start, data, y_t))
            params, history, final, converged = self._train(start, data, y_t)
            logger.debug("PCGMM start %d: objective %.6g -> %.6g", restart, initial, final)
            if not np.isfinite(final):
                continue
            if best is None or final > best[0]:
                best = (final, initial, params, history, converged)
        if best is None:
            raise RuntimeError("every PCGMM start diverged (non-finite objective); lower lr")
        self.objective_, self.initial_objective_, self._params, self.history_, self.converged_ = best
        self.n_iter_ = len(self.history_)
        self.classes_ = self._fit_classes
        return self

    # ---------------------------------------------------------------- attributes
    @property
    def weights_(self) -> np.ndarray:
        self._check_fitted()
        return torch.softmax(self._params["logits"], 0).numpy()

    @property
    def means_(self) -> np.ndarray:
        self._check_fitted()
        return self._params["loc"].numpy()

    @property
    def covariances_(self) -> np.ndarray:
        self._check_fitted()
        return (torch.exp(2 * self._params["log_scale"]) + self.reg_covar).numpy()

    @property
    def label_probs_(self) -> np.ndarray:
        self._check_fitted()
        return torch.sigmoid(self._params["label_logit"]).numpy()

    def _mixture_parameters(self) -> tuple[Any, Any, Any]:
        return self.weights_, self.means_, self.covariances_

    # --------------------------------------------------------------- predictions
    def predict_proba(self, X: Any) -> np.ndarray:
        """``p(y = 1 | x) = sum_k p(k | x) eta_k`` (and its complement), shape ``(N, 2)``."""
        x = self._prepare(X)
        with torch.no_grad():
            post = torch.softmax(self._log_joint(self._params, x), 1)
            p1 = post @ torch.sigmoid(self._params["label_logit"])
        return torch.stack([1 - p1, p1], 1).numpy()

    def score_samples(self, X: Any) -> np.ndarray:
        """``log p(x)`` per row under the fitted mixture."""
        x = self._prepare(X)
        with torch.no_grad():
            return torch.logsumexp(self._log_joint(self._params, x), 1).numpy()


class PredictionOnlyGMM(PCGMM):
    """The "pf-GMM (prediction term only)" of Supplement E.1/E.2: :class:`PCGMM` with the
    generative term dropped, i.e. Adam on ``mean log p(Y | X)`` alone.

    Parameters are those of :class:`PCGMM` without ``generative_weight`` (fixed to 0)
    and with ``lam = 1``. ``score_samples`` still reports ``log p(x)`` of the mixture
    it ends with, which nothing in training asks to be good.

    Parameters
    ----------
    n_components : int, default 4
    lam : float, default 1.0
        Weight of the prediction term (the only term, so it scales the objective).
    lr, num_steps, tol, n_init, reg_covar, seed : as for :class:`PCGMM`.

    Examples
    --------
    >>> from ppmix.datasets import make_two_mixture
    >>> X, y = make_two_mixture(200, n_relevant=2, n_irrelevant=2, seed=0)
    >>> model = PredictionOnlyGMM(2, num_steps=50, n_init=1, seed=0).fit(X, y)
    >>> model.generative_weight, model.predict_proba(X).shape
    (0.0, (200, 2))
    """

    def __init__(
        self,
        n_components: int = 4,
        *,
        lam: float = 1.0,
        lr: float = 0.05,
        num_steps: int = 500,
        tol: float = 1e-6,
        n_init: int = 3,
        reg_covar: float = 1e-6,
        seed: int | None = None,
    ) -> None:
        super().__init__(generative_weight=0.0)
        store_params(self, locals())
