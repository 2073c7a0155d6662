"""Leave-one-out marginal gains ``G(S_k) - G(S_k \\ {i})`` without retraining.

PRESTO (Sangani et al., Algorithm 1, line 14) retrains every component once per
removed point. These helpers compute the same quantities for all members of all
``K`` subsets at once from the fitted parameters.

Per-subset objectives (``a = [x, 1]``, ``Lambda = diag(ridge, ..., ridge, 0)``; the
intercept is never shrunk):

* linear-Gaussian expert, noise variance profiled out (refitted):
  ``G(S) = min_{beta, s2} sum_{i in S} [(y_i - a_i beta)^2 / (2 s2) + log(2 pi s2) / 2]
  + beta' Lambda beta / (2 s2)``. With ``Q(S) = min_beta ||y - A beta||^2 + beta' Lambda beta``
  the optimum is ``s2 = Q / n`` and ``G(S) = n/2 (log(2 pi Q / n) + 1)`` (with a
  variance floor: ``s2 = max(Q / n, floor)``). Removing ``i`` changes ``Q`` exactly by
  the hat-matrix formula ``Q(S) - Q(S \\ i) = e_i^2 / (1 - h_i)``, where ``e_i`` is the
  residual of the full fit and ``h_i = a_i' (A'A + Lambda)^{-1} a_i`` the ridge
  leverage; ``s2`` of the reduced set is refitted in closed form as well, so the
  gain is exact (:func:`gaussian_loo_gains`).
* logistic expert: ``G(S) = min_theta sum_{i in S} l_i(theta) + ridge/2 ||coef||^2``
  with ``l_i`` the negative Bernoulli log-likelihood. There is no closed form; the
  gain is approximated by one Newton step from the full fit (the influence
  function): removing ``i`` moves ``theta`` by ``H_{-i}^{-1} g_i`` and lowers the
  remaining objective by ``g_i' H_{-i}^{-1} g_i / 2`` to second order, so
  ``G(S) - G(S \\ i) ~= l_i + (p_i - y_i)^2 h_i / (2 (1 - v_i h_i))``, with
  ``g_i = (p_i - y_i) a_i``, ``v_i = p_i (1 - p_i)``, ``h_i = a_i' H^{-1} a_i`` and
  ``H`` the penalised Hessian at the fit (Sherman-Morrison for ``H_{-i}``). The
  same formula is exact for a quadratic loss (:func:`logistic_loo_gains`).
* softmax-regression expert with ``C`` classes (last class the reference, ``F = C - 1`` free
  rows): the same one Newton step. Point ``i`` contributes the gradient ``g_i = U_i r_i`` and
  the Hessian ``U_i B_i U_i'`` with ``U_i = I_F kron a_i``, ``r_i = (p_i - t_i)[:F]`` and
  ``B_i = diag(p_i) - p_i p_i'`` (restricted to the free classes); Woodbury gives
  ``g_i' H_{-i}^{-1} g_i = r_i' (I - V_i B_i)^{-1} V_i r_i`` with the ``F x F`` leverage matrix
  ``V_i = U_i' H^{-1} U_i``, computed as ``s' (I - W)^{-1} s`` (``V_i = L L'``, ``s = L' r_i``,
  ``W = L' B_i L``) with the eigenvalues of ``I - W`` clamped at ``1e-6``. With ``C = 2`` this
  is the logistic formula (:func:`softmax_loo_gains`).

**Sample weights.** ``onehot`` may hold membership weights, a member row's ``sample_weight`` in place of
its 1: the fits, Hessians, residual sums and counts are then weighted, and the gains are those of
removing one copy of the row (one unit of its weight), which with integer weights are exactly the gains
of every copy in the problem with the rows repeated.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ppmix.components._linear import design_matrix
from ppmix.components.softmax_gate import softmax_hessian

__all__ = ["gaussian_loo_gains", "logistic_loo_gains", "profile_gaussian_objective", "softmax_loo_gains"]


def profile_gaussian_objective(q: torch.Tensor, n: torch.Tensor, floor: float) -> torch.Tensor:
    """``min_{s2 >= floor} q / (2 s2) + n/2 log(2 pi s2)``, elementwise (0 where ``n == 0``)."""
    n = n.to(q.dtype)
    s2 = torch.where(n > 0, q / n.clamp_min(1.0), torch.ones_like(q)).clamp_min(floor)
    value = q / (2 * s2) + 0.5 * n * torch.log(2 * math.pi * s2)
    return torch.where(n > 0, value, torch.zeros_like(value))


def _ridge_diag(p: int, ridge: float, like: torch.Tensor) -> torch.Tensor:
    diag = torch.full((p + 1,), float(ridge), dtype=like.dtype, device=like.device)
    diag[-1] = 0.0
    return torch.diag(diag)


def gaussian_loo_gains(
    x: torch.Tensor, y: torch.Tensor, onehot: torch.Tensor, ridge: float, floor: float = 1e-8
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact ``G(S_k)`` and leave-one-out gains of ridge linear-Gaussian experts.

    Parameters
    ----------
    x : Tensor, shape (N, P)
    y : Tensor, shape (N,)
    onehot : Tensor, shape (N, K)
        Membership mask (0/1) of the ``K`` subsets, or membership weights (see the module docstring).
    ridge : float
        Penalty on the coefficients (as in :class:`~ppmix.components.GaussianExpert`).
    floor : float
        Variance floor.

    Returns
    -------
    objective : Tensor, shape (K,)
        ``G(S_k)`` (noise variance profiled out).
    gains : Tensor, shape (N, K)
        ``G(S_k) - G(S_k \\ {i})`` for members, 0 elsewhere.

    Examples
    --------
    >>> import torch
    >>> x, y = torch.randn(20, 2, dtype=torch.float64), torch.randn(20, dtype=torch.float64)
    >>> g, gains = gaussian_loo_gains(x, y, torch.ones(20, 1, dtype=torch.float64), 0.1)
    >>> tuple(g.shape), tuple(gains.shape)
    ((1,), (20, 1))
    """
    a = design_matrix(x)
    w = onehot.T[:, :, None]  # (K, N, 1)
    gram = (w * a[None]).mT @ a + _ridge_diag(x.shape[1], ridge, a)  # (K, M, M)
    empty = onehot.sum(0) == 0  # no members, no gains: any well-posed system will do
    gram = gram + empty.to(a.dtype)[:, None, None] * torch.eye(a.shape[1], dtype=a.dtype, device=a.device)
    chol, info = torch.linalg.cholesky_ex(gram)
    if (info > 0).any():
        raise ValueError("a subset's ridge least squares is singular; increase ridge or use more points per subset")
    rhs = ((w * a[None]).mT @ y)[..., None]
    theta = torch.cholesky_solve(rhs, chol).squeeze(-1)  # (K, M)
    resid = y[:, None] - a @ theta.T  # (N, K)
    pen = ridge * theta[:, :-1].square().sum(-1)
    q = (onehot * resid.square()).sum(0) + pen
    n = onehot.sum(0)
    objective = profile_gaussian_objective(q, n, floor)
    solved = torch.cholesky_solve(a.T.expand(gram.shape[0], -1, -1), chol)  # (K, M, N)
    leverage = (a.T[None] * solved).sum(1).T  # (N, K)
    drop = resid.square() / (1 - leverage).clamp_min(1e-12)
    reduced = profile_gaussian_objective((q - drop).clamp_min(0.0), n - 1, floor)
    gains = torch.where(onehot > 0, objective - reduced, torch.zeros_like(drop))
    return objective, gains


def logistic_loo_gains(
    x: torch.Tensor, y: torch.Tensor, onehot: torch.Tensor, coef: torch.Tensor, intercept: torch.Tensor, ridge: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``G(S_k)`` at the fitted parameters and one-step-Newton leave-one-out gains.

    ``gain_ik ~= l_ik + (p_ik - y_i)^2 h_ik / (2 (1 - v_ik h_ik))`` (see the module
    docstring); ``1 - v h`` is clamped at ``1e-6``.

    Returns
    -------
    objective : Tensor, shape (K,)
    gains : Tensor, shape (N, K)
        Approximate ``G(S_k) - G(S_k \\ {i})`` for members, 0 elsewhere.

    Examples
    --------
    >>> import torch
    >>> x = torch.randn(30, 2, dtype=torch.float64)
    >>> y = (x[:, 0] > 0).double()
    >>> w = torch.ones(30, 1, dtype=torch.float64)
    >>> g, gains = logistic_loo_gains(x, y, w, torch.zeros(1, 2, dtype=torch.float64),
    ...                               torch.zeros(1, dtype=torch.float64), 1.0)
    >>> bool((gains >= 0).all())
    True
    """
    a = design_matrix(x)
    theta = torch.cat([coef, intercept[:, None]], dim=1)
    eta = a @ theta.T  # (N, K)
    loss = -(y[:, None] * F.logsigmoid(eta) + (1 - y[:, None]) * F.logsigmoid(-eta))
    objective = (onehot * loss).sum(0) + 0.5 * ridge * coef.square().sum(-1)
    p = torch.sigmoid(eta)
    v = p * (1 - p)
    hess = ((onehot * v).T[:, :, None] * a[None]).mT @ a + _ridge_diag(x.shape[1], ridge, a)
    chol, info = torch.linalg.cholesky_ex(hess)
    if (info > 0).any():
        eye = torch.eye(a.shape[1], dtype=a.dtype, device=a.device)
        chol, _ = torch.linalg.cholesky_ex(hess + 1e-8 * eye)
    solved = torch.cholesky_solve(a.T.expand(hess.shape[0], -1, -1), chol)
    leverage = (a.T[None] * solved).sum(1).T  # (N, K): a_i' H_k^{-1} a_i
    correction = (p - y[:, None]).square() * leverage / (2 * (1 - v * leverage).clamp_min(1e-6))
    gains = torch.where(onehot > 0, loss + correction, torch.zeros_like(loss))
    return objective, gains


def softmax_loo_gains(
    x: torch.Tensor,
    targets: torch.Tensor,
    onehot: torch.Tensor,
    coef: torch.Tensor,
    intercept: torch.Tensor,
    ridge: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``G(S_k)`` at the fitted parameters and one-step-Newton leave-one-out gains of softmax experts.

    Parameters
    ----------
    x : Tensor, shape (N, P)
    targets : Tensor, shape (N, C)
        One-hot labels (or rows of class probabilities).
    onehot : Tensor, shape (N, K)
        Membership mask (0/1) of the ``K`` subsets, or membership weights (see the module docstring).
    coef, intercept : Tensor, shapes (K, C, P) and (K, C)
        Fitted parameters of :class:`~ppmix.components.SoftmaxExpert` (last class 0).
    ridge : float

    Returns
    -------
    objective : Tensor, shape (K,)
    gains : Tensor, shape (N, K)
        Approximate ``G(S_k) - G(S_k \\ {i})`` (see the module docstring) for members, 0 elsewhere.

    Examples
    --------
    >>> import torch
    >>> x = torch.randn(30, 2, dtype=torch.float64)
    >>> t = torch.nn.functional.one_hot(x.argmax(1) + (x.sum(1) > 1), 3).double()
    >>> coef, intercept = torch.zeros(1, 3, 2, dtype=torch.float64), torch.zeros(1, 3, dtype=torch.float64)
    >>> g, gains = softmax_loo_gains(x, t, torch.ones(30, 1, dtype=torch.float64), coef, intercept, 1.0)
    >>> tuple(gains.shape), bool((gains >= 0).all())
    ((30, 1), True)
    """
    a = design_matrix(x)
    m, free = a.shape[1], coef.shape[1] - 1
    log_p = torch.log_softmax(torch.einsum("nm,kcm->nkc", a, torch.cat([coef, intercept[..., None]], -1)), -1)
    loss = -torch.einsum("nkc,nc->nk", log_p, targets)
    objective = (onehot * loss).sum(0) + 0.5 * ridge * coef.square().sum((1, 2))
    p = log_p[..., :free].exp()  # (N, K, F): the free classes
    block_ridge = torch.kron(torch.eye(free, dtype=a.dtype, device=a.device), _ridge_diag(x.shape[1], ridge, a))
    eye = torch.eye(free, dtype=a.dtype, device=a.device)
    quad = torch.zeros_like(loss)
    for k in range(coef.shape[0]):
        pk = p[:, k]
        hess = softmax_hessian(a, onehot[:, k : k + 1] * pk, pk) + block_ridge
        chol, info = torch.linalg.cholesky_ex(hess)
        if info > 0:
            chol, _ = torch.linalg.cholesky_ex(hess + 1e-8 * torch.eye(hess.shape[0], dtype=a.dtype, device=a.device))
        hinv = torch.cholesky_inverse(chol).reshape(free, m, free, m)
        leverage = torch.einsum("nm,cmdl,nl->ncd", a, hinv, a)  # V_i, (N, F, F)
        lower = torch.linalg.cholesky_ex(leverage + 1e-12 * eye)[0]
        s = (lower.mT @ (pk - targets[:, :free])[..., None]).squeeze(-1)  # L' r_i
        b = torch.diag_embed(pk) - pk[:, :, None] * pk[:, None, :]
        eigval, eigvec = torch.linalg.eigh(lower.mT @ b @ lower)  # W = L' B L
        quad[:, k] = ((eigvec.mT @ s[..., None]).squeeze(-1).square() / (1 - eigval).clamp_min(1e-6)).sum(-1)
    gains = torch.where(onehot > 0, loss + 0.5 * quad, torch.zeros_like(loss))
    return objective, gains
