"""A :class:`~ppmix.models.mixture.Mixture` at many draws of its globals at once, for ``to_arviz``: the components
of a block of draws as one set of components (draw ``s``'s component ``k`` at ``s K + k``, as the Gibbs sampler
holds its chains), so one ``log_prob`` scores every draw of the block and one ``sample`` replicates its data."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ppmix.models.mixture import Mixture

__all__ = ["DRAW_BLOCK_CELLS", "mixture_draws_log_likelihood", "mixture_draws_replicated"]

#: the draws are scored in blocks of at most this many (row, draw, component) cells: a few tens of MB of float64
DRAW_BLOCK_CELLS = 1 << 20


def _blocks(model: "Mixture", draws: dict[str, torch.Tensor], n_rows: int) -> Iterator[tuple[Any, torch.Tensor, int]]:
    """For every block of draws: their components as one set of ``B K`` (blocks of one draw where a site is shared
    by the components, e.g. a tied covariance), their log weights ``(B, K)`` and ``B``; each draw's globals set
    as :meth:`~ppmix.models.mixture.Mixture._set_globals` sets them (the fitted state is restored after)."""
    family, k = model._component_family(), int(model.n_components)
    n_draws = len(next(iter(draws.values())))
    shared = any(spec.shared for spec in family.sites(k, int(model.n_features_in_)).values())
    # a site shared by the components (a tied covariance) has no component axis to stack draws along: one at a time
    block = max(1, DRAW_BLOCK_CELLS // max(1, n_rows * k)) if not shared else 1
    with model._parameters_restored():
        for start in range(0, n_draws, block):
            values, log_weights = [], []
            for i in range(start, min(start + block, n_draws)):
                model._set_globals({name: value[i] for name, value in draws.items()})
                values.append(family.site_values(model.components_))
                log_weights.append(model.weights_.log())
            stacked = {site: torch.cat([value[site] for value in values]) for site in values[0]}
            yield family.components(stacked, model._scale), torch.stack(log_weights), len(values)


def mixture_draws_log_likelihood(
    model: "Mixture",
    data: torch.Tensor,
    draws: dict[str, torch.Tensor],
    marginals: bool = True,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``log sum_k w_k p_k(x_n)`` at every one of ``S`` draws ``{site: (S, ...)}``, ``(S, N)`` (in ``dtype``, default
    the model's), and (``marginals``) the responsibilities ``{"z": (S, N, K)}``, in blocks of
    :data:`DRAW_BLOCK_CELLS`."""
    n_rows, k = data.shape[0], int(model.n_components)
    n_draws = len(next(iter(draws.values())))
    log_lik = torch.empty(n_draws, n_rows, dtype=dtype or model.dtype, device=data.device)
    probs, start = [], 0
    for components, log_weights, n in _blocks(model, draws, n_rows):
        joint = components.log_prob(data).reshape(n_rows, n, k) + log_weights  # (N, B, K)
        # the log-sum-exp over the K components as K element-wise passes over (N, B): torch's reductions over a
        # short last axis are several times slower
        top = joint[..., 0].clone()
        for j in range(1, k):
            torch.maximum(top, joint[..., j], out=top)
        shifted = torch.exp(joint - top[..., None])
        total = shifted[..., 0].clone()
        for j in range(1, k):
            total += shifted[..., j]
        log_lik[start : start + n] = (top + total.log()).T
        if marginals:
            probs.append((shifted / total[..., None]).transpose(0, 1))
        start += n
    return log_lik, ({"z": torch.cat(probs)} if marginals else {})


def mixture_draws_replicated(model: "Mixture", data: torch.Tensor, draws: dict[str, torch.Tensor]) -> dict[str, Any]:
    """One replicated data set per draw ``{site: (S, ...)}``, ``{"x": (S, N, D)}``: every row's component drawn from
    the draw's weights, then its value from that component (torch's global generator)."""
    n_rows, k = data.shape[0], int(model.n_components)
    out = []
    for components, log_weights, n in _blocks(model, draws, n_rows):
        z = torch.multinomial(log_weights.exp(), n_rows, replacement=True)  # (B, N)
        offsets = k * torch.arange(n, device=z.device)[:, None]
        out.append(components.sample((z + offsets).reshape(-1)).reshape(n, n_rows, -1))
    return {"x": torch.cat(out)}
