"""Blocked Gibbs sweeps (``engine="gibbs"``) for the mixture and the HMM of a family with a conjugate prior.

Every chain alternates two exact draws (the classical sampler of these models, e.g. Diebolt & Robert 1994
for mixtures, Scott 2002 for HMMs):

1. the globals given the latents: each component's parameters from the family's conjugate posterior
   given the rows assigned to it (:meth:`~ppmix.components.family.FamilyPriors.conjugate_posterior`),
   the mixture weights, or the HMM's initial distribution and the rows of its transition matrix (on
   their allowed entries), from their Dirichlet posteriors;
2. the latents given the globals: each row's component from its posterior, or each sequence's state
   path by forward filtering, backward sampling (:func:`~ppmix.algorithms.ffbs.sample_paths`).

The samplers are parts a structure builds for the engine (``model._gibbs_sampler()``: :class:`MixtureGibbs`,
:class:`HMMGibbs`), each with ``start`` (every chain's latents at its start) and ``sweep`` (one sweep of every chain).
The chains run together: the ``C`` chains' ``K`` components are one set of ``C K`` components (chain ``c``'s component
``k`` at ``c K + k``), so one ``log_prob`` and one ``statistics`` call serve every chain. The priors are those of the
model's program under ``bayesian()`` (the family's priors' :meth:`~ppmix.components.family.FamilyPriors.prior`, a
``Dirichlet(1)`` on the weights and the initial distribution, ``Dirichlet(transition_prior)`` on every transition row,
each as the model's ``priors=`` sets it), so Gibbs and NUTS sample the same posterior.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ppmix.algorithms.ffbs import gumbel_argmax, sample_paths
from ppmix.algorithms.simplex import dirichlet_draw, log_dirichlet
from ppmix.components.base import ComponentFamily
from ppmix.components.family import DensityFamily
from ppmix.components.family_tools import has_conjugate_prior
from ppmix.engines.chain_starts import chain_starts

if TYPE_CHECKING:
    from ppmix.models._family_components import FamilyModel
    from ppmix.models.hmm import HMM
    from ppmix.models.mixture import Mixture

__all__ = ["HMMGibbs", "MixtureGibbs"]


def _chain_counts(assignment: torch.Tensor, k: int) -> torch.Tensor:
    """How often each chain's latents ``(C, ...)`` take each of ``k`` values, ``(C, k)`` (one bincount)."""
    chains = assignment.shape[0]
    offsets = k * torch.arange(chains, device=assignment.device).reshape(chains, *[1] * (assignment.dim() - 1))
    return torch.bincount((assignment + offsets).reshape(-1), minlength=chains * k).reshape(chains, k)


def _chain_labels(assignment: torch.Tensor, k: int) -> torch.Tensor:
    """Assignments ``(C, F)`` as one-hot weights ``(F, C K)`` over every chain's components."""
    chains, rows = assignment.shape
    offsets = k * torch.arange(chains, device=assignment.device)[:, None]
    one_hot = torch.zeros(rows, chains * k, dtype=torch.float64, device=assignment.device)
    return one_hot.scatter_(1, (assignment + offsets).T, 1.0)


@dataclass
class _ChainComponents:
    """Every chain's components as one set of ``C K`` (chain ``c``'s component ``k`` at ``c K + k``), with their
    family and its sites in drawing order (looked up once per run)."""

    components: ComponentFamily
    n_chains: int
    family: DensityFamily
    sites: tuple[str, ...]


class FamilyGibbs:
    """The component step shared by the structures' samplers: the conjugate draw of every chain's components of
    ``model``'s family (the model keeps the settings, the priors and the fitted state)."""

    def __init__(self, model: FamilyModel) -> None:
        self.model = model

    def check(self, rows: Any) -> None:
        """Refuse rows with missing entries, a family without a conjugate prior, or a subclass that replaced the
        structure's program."""
        model = self.model
        if isinstance(rows, torch.Tensor) and bool(torch.isnan(rows).any()):
            raise ValueError("X has missing entries (NaN): missing='marginalize' is for EM (fit, partial_fit) only")
        program_owner = next(c for c in type(model).__mro__ if "model" in vars(c))
        sampler_owner = next(c for c in type(model).__mro__ if "_gibbs_sampler" in vars(c))
        if program_owner is not sampler_owner:
            raise TypeError(
                f"{type(model).__name__} replaces model(): engine='gibbs' draws the built-in structure's parameters, "
                "not your program's; use engine='mcmc'"
            )
        family = model._component_family()
        if not has_conjugate_prior(family):
            covariance_type = getattr(family, "covariance_type", None)
            settings = "" if covariance_type is None else f" with covariance_type={covariance_type!r}"
            raise ValueError(
                f"engine='gibbs' draws the components from a conjugate prior, which the {family.name!r} family"
                f"{settings} has not (those with one: poisson, bernoulli, exponential, categorical, multinomial, and "
                "gaussian with covariance_type 'diag' or 'spherical'): use engine='mcmc'"
            )

    def chain_components(self, starts: list[dict[str, torch.Tensor]]) -> tuple[_ChainComponents, dict[str, Any]]:
        """Every chain's components at its own start (:func:`~ppmix.engines.chain_starts.chain_starts`), the start
        of the sweeps, and the other globals of the starts stacked over the chains ``{name: (C, ...)}``; the
        model's globals are left at chain 0's start."""
        model = self.model
        family = model._prior_family()
        per_chain = []
        for start in starts:
            model._set_globals(start)
            per_chain.append(family.site_values(model.components_))
        model._set_globals(starts[0])
        values = {site: torch.cat([chain[site] for chain in per_chain]) for site in per_chain[0]}
        others = {name: torch.stack([start[name] for start in starts]) for name in starts[0] if name not in values}
        sites = tuple(family.sites(model.n_components, int(model.n_features_in_)))
        return _ChainComponents(family.components(values, model._scale), len(starts), family, sites), others

    def draw_components(
        self, rows: Any, assignment: torch.Tensor, current: _ChainComponents
    ) -> tuple[_ChainComponents, dict[str, torch.Tensor], torch.Tensor]:
        """Every chain's components drawn given the rows assigned to them ``(C, F)``: the new components, their
        site values ``{site: (C, K, ...)}`` and their log prior density ``(C,)``."""
        model = self.model
        family, k, chains, scale = current.family, model.n_components, current.n_chains, model._scale
        weights = _chain_labels(assignment, k).to(model.dtype)
        stats = current.components.statistics(rows, weights)
        opts = {"dtype": model.dtype, "device": weights.device}
        drawn, priors = family.site_values(current.components), family.priors()
        fixed = model._fixed
        for site in current.sites:  # in the family's order: a site's conditional sees the sites drawn before it
            if fixed is not None and site in fixed.values:  # a frozen site is not drawn
                drawn[site] = fixed.chain_values(site, chains)
            else:
                drawn[site] = priors.conjugate_posterior(site, stats, drawn, scale, opts).sample()
        components = family.components(drawn, scale)
        values = {site: value.reshape(chains, k, *value.shape[1:]) for site, value in drawn.items()}
        d = int(model.n_features_in_)
        log_prior = sum(priors.prior(site, k, d, scale, opts).log_prob(value).sum(-1) for site, value in values.items())
        return _ChainComponents(components, chains, family, current.sites), values, log_prior

    def structure_draw(self, site: str, concentration: torch.Tensor, allowed: torch.Tensor | None = None) -> Any:
        """Every chain's draw ``(C, ...)`` of the structure's ``site`` from its Dirichlet posterior ``concentration``
        (on the ``allowed`` entries), or its frozen value (``fit(..., fixed=...)``: not drawn)."""
        fixed = self.model._fixed
        if fixed is not None and site in fixed.values:
            return fixed.chain_values(site, concentration.shape[0])
        return dirichlet_draw(concentration, allowed)

    def chain_log_prob(self, rows: Any, current: _ChainComponents) -> torch.Tensor:
        """``log p_k(x_f)`` of every chain's components, ``(C, F, K)``."""
        log_prob = current.components.log_prob(rows)
        return log_prob.reshape(log_prob.shape[0], current.n_chains, self.model.n_components).transpose(0, 1)


@dataclass
class _MixtureLatent:
    assignment: torch.Tensor  # (C, N)
    chains: _ChainComponents


class MixtureGibbs(FamilyGibbs):
    """``engine="gibbs"`` for :class:`~ppmix.models.mixture.Mixture`: assignments, then components and
    weights (prior ``Dirichlet(1)``)."""

    model: Mixture

    def start(self, data: Any, n_chains: int, generator: torch.Generator) -> _MixtureLatent:
        """Every chain's assignments drawn given its start."""
        self.check(data)
        chains, others = self.chain_components(chain_starts(self.model, data, n_chains, generator))
        logits = self.chain_log_prob(data, chains) + others["weights"].log()[:, None, :]
        return _MixtureLatent(gumbel_argmax(logits), chains)

    def sweep(self, data: Any, latent: _MixtureLatent) -> tuple[dict[str, torch.Tensor], torch.Tensor, _MixtureLatent]:
        """One sweep of every chain: the globals ``{site: (C, ...)}``, their log joint ``(C,)``, the new latents."""
        k = self.model.n_components
        chains, values, log_prior = self.draw_components(data, latent.assignment, latent.chains)
        counts = _chain_counts(latent.assignment, k).to(self.model.dtype)
        alpha = self.model._concentration("weights", (k,)).to(counts).expand_as(counts)
        weights = self.structure_draw("weights", alpha + counts)
        logits = self.chain_log_prob(data, chains) + weights.log()[:, None, :]
        log_likelihood = torch.logsumexp(logits, dim=-1).sum(-1)
        joint = log_likelihood + log_prior + log_dirichlet(weights, alpha)
        return {"weights": weights, **values}, joint, _MixtureLatent(gumbel_argmax(logits), chains)


@dataclass
class _HMMLatent:
    paths: torch.Tensor  # (C, B, T)
    chains: _ChainComponents
    prepared: Any  # the sequences with their frames prepared once


class HMMGibbs(FamilyGibbs):
    """``engine="gibbs"`` for :class:`~ppmix.models.hmm.HMM`: state paths by forward filtering, backward
    sampling, then emissions, the initial distribution (prior ``Dirichlet(1)``) and every transition row
    (prior ``Dirichlet(transition_prior)`` on its allowed entries)."""

    model: HMM

    def start(self, data: Any, n_chains: int, generator: torch.Generator) -> _HMMLatent:
        """Every chain's state paths drawn given its start."""
        prepared = self.model._em_data(data)
        self.check(prepared.data.frames)
        chains, others = self.chain_components(chain_starts(self.model, data, n_chains, generator))
        paths, _ = self._sample_paths(prepared, chains, others["initial"], others["transition"])
        return _HMMLatent(paths, chains, prepared)

    def _sample_paths(
        self, prepared: Any, chains: _ChainComponents, initial: torch.Tensor, transition: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every chain's state paths ``(C, B, T)`` and log-likelihoods ``(C,)``."""
        batch, c, k = prepared.sequences, chains.n_chains, self.model.n_components
        b, t = batch.n_sequences, batch.max_length
        log_emit = batch.x.new_zeros(c, b, t, k)
        log_emit[:, batch.mask] = self.chain_log_prob(prepared.rows, chains)
        log_init = initial.log()[:, None, :].expand(c, b, k).reshape(c * b, k)
        log_trans = transition.log()[:, None].expand(c, b, k, k).reshape(c * b, k, k)
        lengths = batch.lengths.repeat(c)
        paths, log_likelihood = sample_paths(log_init, log_trans, log_emit.reshape(c * b, t, k), lengths)
        return paths.reshape(c, b, t), log_likelihood.reshape(c, b).sum(-1)

    def sweep(self, data: Any, latent: _HMMLatent) -> tuple[dict[str, torch.Tensor], torch.Tensor, _HMMLatent]:
        """One sweep of every chain: the globals ``{site: (C, ...)}``, their log joint ``(C,)``, the new paths."""
        model, prepared = self.model, latent.prepared
        k, chain = model.n_components, model._markov_chain()
        mask, paths = prepared.mask, latent.paths
        chains, values, log_prior = self.draw_components(prepared.rows, paths[:, mask], latent.chains)
        c = paths.shape[0]
        first = _chain_counts(paths[:, :, 0], k).to(model.dtype)
        both = (mask[:, 1:] & mask[:, :-1]).to(model.dtype)  # pairs of valid steps
        pair_index = paths[:, :, :-1] * k + paths[:, :, 1:]  # (C, B, T - 1)
        pairs = torch.zeros(c, k * k, dtype=model.dtype, device=paths.device)
        pairs.scatter_add_(1, pair_index.reshape(c, -1), both.expand(c, -1, -1).reshape(c, -1))
        pairs = pairs.reshape(c, k, k)
        allowed = chain.mask.to(pairs.device).expand(c, k, k)
        alpha_initial = model._concentration("initial", (k,)).to(first).expand_as(first)
        initial = self.structure_draw("initial", alpha_initial + first)
        alpha = torch.as_tensor(chain.transition_concentration).to(pairs).expand_as(pairs)
        transition = self.structure_draw("transition", alpha + pairs, allowed)
        new_paths, log_likelihood = self._sample_paths(prepared, chains, initial, transition)
        log_prior = (
            log_prior + log_dirichlet(initial, alpha_initial) + log_dirichlet(transition, alpha, allowed).sum(-1)
        )
        values = {"initial": initial, "transition": transition, **values}
        return values, log_likelihood + log_prior, _HMMLatent(new_paths, chains, prepared)
