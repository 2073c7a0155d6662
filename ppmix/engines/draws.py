"""Posterior draws of the global sites, whichever sampler made them: relabelled, checked across chains and
kept on the model (``mcmc_samples_``, ``mcmc_diagnostics_``, the point estimates at their means)."""

from __future__ import annotations

import logging
import warnings
from typing import TYPE_CHECKING, Any

import torch

from ppmix.engines.relabel import component_axes, max_rhat, relabel_draws

if TYPE_CHECKING:
    from ppmix.models.base import MixtureModel

__all__ = ["ChainsDisagreeWarning", "RHAT_THRESHOLD", "keep_draws"]

#: the largest r_hat of a site that counts as agreement between chains (Vehtari et al. 2021 recommend 1.01;
#: 1.05 is the older, looser rule for short runs)
RHAT_THRESHOLD = 1.05

logger = logging.getLogger(__name__)


class ChainsDisagreeWarning(UserWarning):
    """Issued when, after relabelling, some site's r_hat exceeds :data:`RHAT_THRESHOLD`.

    Examples
    --------
    The threshold is Vehtari et al.'s (2021); the warning is a ``UserWarning``, filtered as usual:

    >>> import warnings
    >>> RHAT_THRESHOLD, issubclass(ChainsDisagreeWarning, UserWarning)
    (1.05, True)
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("error", ChainsDisagreeWarning)  # make disagreeing chains an error
    """


def keep_draws(
    model: "MixtureModel", data: Any, samples: dict[str, torch.Tensor], relabel: bool, **diagnostics: Any
) -> dict[str, Any]:
    """Relabel ``samples`` ``{site: (chains, draws, ...)}`` (when ``relabel``), keep them as
    ``model.mcmc_samples_`` with ``model.mcmc_diagnostics_`` (``r_hat`` per site after relabelling,
    ``r_hat_before_relabelling``, ``relabelled_fraction`` and the sampler's own ``diagnostics``), set the
    point estimates to the posterior means and warn (:class:`ChainsDisagreeWarning`) naming the sites whose
    chains disagree. Returns the diagnostics."""
    diagnostics = {"r_hat_before_relabelling": max_rhat(samples), "relabelled_fraction": 0.0, **diagnostics}
    if relabel:
        try:
            axes = component_axes(model, data, samples)
            samples, diagnostics["relabelled_fraction"] = relabel_draws(samples, axes)
        except Exception as err:  # noqa: BLE001 - never lose the draws of a long run to the relabelling
            axes = {}
            warnings.warn(f"draws left as sampled: relabelling failed ({type(err).__name__}: {err})", stacklevel=4)
        if not axes:
            logger.info("no site with a component axis: draws left as sampled")
    diagnostics["r_hat"] = max_rhat(samples)
    model.mcmc_samples_ = samples
    model.mcmc_diagnostics_ = diagnostics
    model._set_globals({k: v.mean(dim=(0, 1)) for k, v in samples.items()})
    _warn_if_chains_disagree(diagnostics["r_hat"], relabel)
    return diagnostics


def _warn_if_chains_disagree(rhat: dict[str, float], relabelled: bool) -> None:
    """Warn (:class:`ChainsDisagreeWarning`) naming every site whose largest r_hat exceeds the threshold."""
    bad = {name: value for name, value in rhat.items() if value > RHAT_THRESHOLD}
    if not bad:
        return
    listed = ", ".join(f"{name} ({value:.2f})" for name, value in sorted(bad.items(), key=lambda kv: -kv[1]))
    after = "after relabelling " if relabelled else ""
    warnings.warn(
        f"chains disagree {after}(largest r_hat per site above {RHAT_THRESHOLD}): {listed}. "
        "Run more warmup_steps and num_samples, or check for several modes; see model.mcmc_diagnostics_.",
        ChainsDisagreeWarning,
        stacklevel=5,  # the user's call of model.fit
    )
