"""Label switching in mixture posteriors: relabel MCMC draws, then check that the chains agree.

A mixture's likelihood is invariant under any permutation of its K components, so
a sampler may visit the K! relabelled copies of every mode: two chains in swapped
labellings give r_hat far above 1 and a posterior mean that averages components.
:func:`relabel_draws` undoes this with the iterative assignment relabelling of
Stephens (2000, JRSS-B 62, "Dealing with label switching in mixture models", the
squared-loss form of his Algorithm 1 on the component parameters; Celeux 1998):

1. the reference is one coherent labelling, the last draw of the first chain;
2. each draw takes the permutation of its components whose means (the key
   sites: ``locs``) are nearest the reference's in squared distance (a Hungarian
   assignment, :func:`scipy.optimize.linear_sum_assignment`);
3. the reference becomes the mean of the relabelled draws, and 2-3 repeat until
   no draw changes its permutation;
4. a refinement on every per-component site (weights, means, scales, ...) with
   each coordinate scaled by its spread within a label (Celeux's normalised
   form), repeated until no draw changes.

The permutation of a draw is applied to every component axis of every site
(both axes of an HMM's transition matrix), so each draw stays the same point of
the parameter space; the posterior of the discrete latents, computed from the
relabelled draws, follows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from pyro import poutine
from pyro.distributions import constraints
from scipy.optimize import linear_sum_assignment

from ppmix.engines.params import local_params

if TYPE_CHECKING:
    from ppmix.models.base import MixtureModel

__all__ = ["COMPONENT_DIMS", "component_axes", "relabel_draws", "find_permutations", "apply_permutations", "max_rhat"]

#: dimension names (in :meth:`MixtureModel._arviz_dims`) of axes that index exchangeable components
COMPONENT_DIMS = ("component", "component_to")


def component_axes(model: "MixtureModel", data: Any, samples: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    """The axes (after chain and draw) of each global site that index the ``K`` components.

    Read from :meth:`~ppmix.models.base.MixtureModel._arviz_dims` (axes named
    ``"component"`` or ``"component_to"``). Sites it does not name (a user's model)
    are read from the program: an axis of a plate of size ``K`` (other than the data
    plate) and the last axis of a simplex of size ``K`` index components. Models
    whose components are not exchangeable name their axes otherwise (the experts of
    a mixture of experts share a softmax gate with a fixed reference, so they are
    named ``"expert"``/``"gate"`` and left alone).
    """
    declared = model._arviz_dims()
    axes: dict[str, tuple[int, ...]] = {}
    for name in samples:
        if name in declared:
            found = tuple(i for i, dim in enumerate(declared[name]) if dim in COMPONENT_DIMS)
            if found:
                axes[name] = found
    undeclared = [name for name in samples if name not in declared]
    if undeclared:
        axes.update(_traced_component_axes(model, data, samples, undeclared))
    return axes


def _traced_component_axes(
    model: "MixtureModel", data: Any, samples: dict[str, torch.Tensor], names: list[str]
) -> dict[str, tuple[int, ...]]:
    k = int(model.n_components)
    values = {name: value[0, 0] for name, value in samples.items()}
    with local_params(), torch.no_grad(), model.bayesian():
        trace = poutine.trace(poutine.condition(model.model, values)).get_trace(data)
    axes: dict[str, tuple[int, ...]] = {}
    for name in names:
        site = trace.nodes.get(name)
        if site is None or site["type"] != "sample":
            continue
        fn, value = site["fn"], site["value"]
        n_event = len(getattr(fn, "event_shape", ()))
        found = set()
        for frame in site["cond_indep_stack"]:
            if frame.size == k and frame.dim is not None and frame.name != model.data_plate_name:
                axis = value.dim() - n_event + frame.dim
                if axis >= 0:
                    found.add(axis)
        support = getattr(fn, "support", None)
        if n_event >= 1 and value.shape[-1] == k and _is_simplex(support):
            found.add(value.dim() - 1)
        if found:
            axes[name] = tuple(sorted(found))
    return axes


def _is_simplex(support: Any) -> bool:
    while isinstance(support, constraints.independent):
        support = support.base_constraint
    return support is constraints.simplex


def _features(samples: dict[str, torch.Tensor], axes: dict[str, tuple[int, ...]], names: list[str]) -> np.ndarray:
    """Features ``(chains * draws, K, F)`` per component: the values of the sites ``names`` (one component axis)."""
    blocks = []
    for name in names:
        value = samples[name].detach().cpu().double().numpy()
        n_chains, n_draws = value.shape[:2]
        block = np.moveaxis(value, 2 + axes[name][0], 2)
        blocks.append(block.reshape(n_chains * n_draws, block.shape[2], -1))
    feats = np.concatenate(blocks, axis=-1)
    varying = feats.reshape(-1, feats.shape[-1]).std(axis=0) > 0
    return feats[..., varying]


def _assign(cost: np.ndarray) -> np.ndarray:
    """Per draw the permutation minimising ``sum_j cost[m, perm[j], j]`` (Hungarian), ``perm[m, j]``."""
    perms = np.empty(cost.shape[:2], dtype=np.int64)
    for m in range(cost.shape[0]):
        rows, cols = linear_sum_assignment(cost[m])
        perms[m, cols] = rows
    return perms


def find_permutations(
    key: np.ndarray, features: np.ndarray | None = None, reference: int = -1, max_iter: int = 50
) -> np.ndarray:
    """Per draw, the permutation ``perm[m, j]`` = the component of draw ``m`` that takes label ``j``.

    1. Match the ``key`` features ``(M, K, F)`` (the component means, in their own units) of
       every draw to those of the reference draw, then to the mean of the relabelled draws,
       until no draw changes (squared Euclidean distance; Hungarian assignment).
    2. Refine with all ``features`` ``(M, K, G)`` (weights, means, scales, ...): the cost of
       giving component ``i`` label ``j`` is ``sum_g (theta_ig - mu_jg)^2 / s_jg^2`` with
       ``mu_j``, ``s_j`` the mean and spread of label ``j`` over the relabelled draws (Celeux's
       normalised form of Stephens' algorithm), so features that do not tell components
       apart (e.g. equal weights) add noise to no assignment; again until no draw changes.
    """
    ref = key[reference]
    perms = np.tile(np.arange(key.shape[1]), (key.shape[0], 1))
    for iteration in range(max_iter):
        new = _assign(((key[:, :, None, :] - ref[None, None]) ** 2).sum(-1))
        if iteration > 0 and np.array_equal(new, perms):
            break
        perms = new
        ref = np.take_along_axis(key, perms[:, :, None], axis=1).mean(axis=0)
    if features is None or features.shape[-1] == 0:
        return perms
    floor = 1e-6 * features.reshape(-1, features.shape[-1]).var(axis=0)
    for _ in range(max_iter):
        ordered = np.take_along_axis(features, perms[:, :, None], axis=1)
        mu, var = ordered.mean(axis=0), np.maximum(ordered.var(axis=0), floor)
        new = _assign((((features[:, :, None, :] - mu[None, None]) ** 2) / var[None, None]).sum(-1))
        if np.array_equal(new, perms):
            break
        perms = new
    return perms


def apply_permutations(
    samples: dict[str, torch.Tensor], axes: dict[str, tuple[int, ...]], perms: np.ndarray
) -> dict[str, torch.Tensor]:
    """Permute every component axis of every site by the draw's permutation ``perms`` ``(chains, draws, K)``."""
    out = dict(samples)
    for name, site_axes in axes.items():
        value = samples[name]
        index = torch.tensor(np.array(perms), device=value.device, dtype=torch.long)
        for axis in site_axes:
            dim = 2 + axis
            shape = [1] * value.dim()
            shape[0], shape[1], shape[dim] = value.shape[0], value.shape[1], value.shape[dim]
            value = torch.take_along_dim(value, index.reshape(shape).expand(value.shape), dim=dim)
        out[name] = value
    return out


def relabel_draws(
    samples: dict[str, torch.Tensor], axes: dict[str, tuple[int, ...]], key_sites: list[str] | None = None
) -> tuple[dict[str, torch.Tensor], float]:
    """Relabel draws ``{site: (chains, draws, ...)}``; returns them and the fraction of draws that changed labels.

    ``key_sites`` are the sites first matched on (the component means: by default the sites
    with one component axis named ``loc``/``locs``/``means``, else all of them). Draws
    without any component site (``axes`` empty) are returned unchanged.
    """
    single = [name for name, site_axes in axes.items() if len(site_axes) == 1]
    if not single:
        return dict(samples), 0.0
    if key_sites is None:
        key_sites = [name for name in single if name in ("loc", "locs", "mean", "means")]
    key_sites = [name for name in key_sites if name in single] or single
    first = samples[single[0]]
    n_chains, n_draws = first.shape[:2]
    key = _features(samples, axes, key_sites)
    features = _features(samples, axes, single)
    reference = n_draws - 1  # the last draw of the first chain: one coherent labelling
    perms = find_permutations(key, features, reference=reference).reshape(n_chains, n_draws, -1)
    changed = float((perms != np.arange(perms.shape[-1])).any(-1).mean())
    return apply_permutations(samples, axes, perms), changed


def max_rhat(samples: dict[str, torch.Tensor]) -> dict[str, float]:
    """ArviZ's rank-normalised split r_hat, the largest over each site's coordinates (NaN with one chain)."""
    import arviz as az

    n_chains = next(iter(samples.values())).shape[0]
    if n_chains < 2:
        return {name: float("nan") for name in samples}
    dataset = az.convert_to_dataset({k: v.detach().cpu().double().numpy() for k, v in samples.items()})
    rhat = az.rhat(dataset)
    result = {}
    for name in samples:
        values = np.asarray(rhat[name].values, dtype=float)
        finite = values[np.isfinite(values)]
        result[name] = float(finite.max()) if finite.size else float("nan")
    return result
