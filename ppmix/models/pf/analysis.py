"""The switch-prior analysis (Sharma et al., 2023, §6, eqs. 26–32): when does a mixture pick label-aligned components?

Setting (§6.2): ``X = [X_R, X_Ir]``, each an equal mixture of two isotropic Gaussians
``N(0, s^2 I)`` and ``N(mu 1, s^2 I)`` with signal-to-noise ratio ``Delta = mu / s``,
and ``Y`` equal to the relevant mixture's component. For a two-component model the
population log-likelihood has three local optima: components aligned with ``(X_R, Y)``,
unaligned (following ``X_Ir``), and, for pf-GMM, a single Gaussian (every switch off).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["SwitchPriorWindow", "likelihood_gaps", "snr_term", "switch_prior_window"]


def _sigmoid(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v))


def _check(n_relevant: int, n_irrelevant: int, snr_relevant: float, snr_irrelevant: float) -> None:
    for name, value in (("n_relevant", n_relevant), ("n_irrelevant", n_irrelevant)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer; got {value!r}")
    for name, value in (("snr_relevant", snr_relevant), ("snr_irrelevant", snr_irrelevant)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite non-negative number; got {value!r}")


def snr_term(n_features: int, snr: float) -> float:
    """``Q = (1/2) [D (1 - Delta^2) / (D Delta^2 + 1) + log(D Delta^2 + 1)]`` of §6.4.1.

    Examples
    --------
    >>> round(snr_term(1, 1.0), 6)  # (1/2) log 2
    0.346574
    """
    spread = n_features * snr**2 + 1.0
    return 0.5 * (n_features * (1.0 - snr**2) / spread + math.log(spread))


def likelihood_gaps(
    n_relevant: int, n_irrelevant: int, snr_relevant: float, snr_irrelevant: float, switch_prior: float = 0.5
) -> dict[str, float]:
    """Population log-likelihood gaps of eqs. 26–29 (aligned minus the alternative).

    Returns ``gmm`` (26), ``sup_gmm`` (27), ``pf_gmm_vs_unaligned`` (28) and
    ``pf_gmm_vs_single`` (29); a positive gap means the aligned components are preferred.

    Parameters
    ----------
    n_relevant, n_irrelevant : int
        ``D_R`` and ``D_Ir``, the numbers of relevant and irrelevant features.
    snr_relevant, snr_irrelevant : float
        The distance between the two cluster means of each group, in standard deviations.
    switch_prior : float in (0, 1), default 0.5
        ``p``, pf-GMM's prior probability that a feature is relevant.

    Returns
    -------
    dict of str to float

    Examples
    --------
    >>> gaps = likelihood_gaps(2, 6, 5.0, 5.0, switch_prior=0.4)
    >>> round(gaps["sup_gmm"] - gaps["gmm"], 6) == round(math.log(2), 6)
    True
    """
    _check(n_relevant, n_irrelevant, snr_relevant, snr_irrelevant)
    if not 0.0 < switch_prior < 1.0:
        raise ValueError(f"switch_prior must be in (0, 1); got {switch_prior!r}")
    q_r, q_ir = snr_term(n_relevant, snr_relevant), snr_term(n_irrelevant, snr_irrelevant)
    logit = math.log(switch_prior) - math.log1p(-switch_prior)
    return {
        "gmm": q_r - q_ir,
        "sup_gmm": math.log(2) + q_r - q_ir,
        "pf_gmm_vs_unaligned": (n_relevant - n_irrelevant) * logit + math.log(2) + q_r - q_ir,
        "pf_gmm_vs_single": n_relevant * logit + math.log(2) + q_r,
    }


@dataclass(frozen=True)
class SwitchPriorWindow:
    """The switch priors ``p`` in ``(lower, upper)`` make pf-GMM prefer the aligned components.

    ``p_single`` is ``p_{1-G/a}`` (eq. 32), ``p_unaligned`` is ``p_{u/a}`` (eqs. 30–31; None
    when ``D_R = D_Ir``, where ``p`` does not enter eq. 28); ``feasible`` says whether the
    window is non-empty.
    """

    lower: float
    upper: float
    p_single: float
    p_unaligned: float | None
    q_relevant: float
    q_irrelevant: float

    @property
    def feasible(self) -> bool:
        return self.lower < self.upper

    def contains(self, switch_prior: float) -> bool:
        """Whether ``switch_prior`` lies strictly inside the window."""
        return self.lower < switch_prior < self.upper


def switch_prior_window(
    n_relevant: int, n_irrelevant: int, snr_relevant: float, snr_irrelevant: float
) -> SwitchPriorWindow:
    """The window ``(p_{1-G/a}, p_{u/a})`` of eqs. 30–32 for the §6.2 setting.

    * ``D_R < D_Ir``: ``p_{1-G/a} < p < p_{u/a}`` with ``p_{u/a} = sigma((log 2 + Q_R - Q_Ir) / |D_R - D_Ir|)``;
    * ``D_R > D_Ir``: ``p > max(p_{1-G/a}, p_{u/a})`` with ``p_{u/a} = sigma(-(log 2 + Q_R - Q_Ir) / |D_R - D_Ir|)``;
    * ``D_R = D_Ir``: ``p > p_{1-G/a}`` if ``log 2 + Q_R - Q_Ir > 0``, else no ``p`` works;

    and ``p_{1-G/a} = sigma(-(log 2 + Q_R) / D_R)`` throughout.

    Parameters
    ----------
    n_relevant, n_irrelevant : int
        ``D_R`` and ``D_Ir``, the numbers of relevant and irrelevant features.
    snr_relevant, snr_irrelevant : float
        The distance between the two cluster means of each group, in standard deviations.

    Returns
    -------
    SwitchPriorWindow
        ``lower``, ``upper``, ``feasible`` and ``contains(p)``.

    Examples
    --------
    >>> w = switch_prior_window(2, 6, 5.0, 5.0)
    >>> w.feasible, w.contains(0.4), w.contains(0.9), w.contains(0.05)
    (True, True, False, False)
    """
    _check(n_relevant, n_irrelevant, snr_relevant, snr_irrelevant)
    q_r, q_ir = snr_term(n_relevant, snr_relevant), snr_term(n_irrelevant, snr_irrelevant)
    margin = math.log(2) + q_r - q_ir
    p_single = _sigmoid(-(math.log(2) + q_r) / n_relevant)
    gap = abs(n_relevant - n_irrelevant)
    if n_relevant < n_irrelevant:
        p_unaligned: float | None = _sigmoid(margin / gap)
        lower, upper = p_single, p_unaligned
    elif n_relevant > n_irrelevant:
        p_unaligned = _sigmoid(-margin / gap)
        lower, upper = max(p_single, p_unaligned), 1.0
    else:
        p_unaligned = None
        lower, upper = (p_single, 1.0) if margin > 0 else (1.0, 1.0)
    return SwitchPriorWindow(lower, upper, p_single, p_unaligned, q_r, q_ir)
