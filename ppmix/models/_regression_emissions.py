"""What an :class:`~ppmix.models.hmm.HMM` does for emissions that read each step's inputs (the regression emissions of
:mod:`ppmix.components.regression_emission`, ``x_t | z_t = k, u_t``): which of its parts need ``inputs=``
(:func:`inputs_needed_by`), and drawing sequences along given inputs (:func:`sample_along_inputs`), for an
input-driven chain, regression emissions or both.

Baum-Welch itself needs nothing here: the HMM asks the family for every step's row ``[u_t, x_t]`` (its
``input_rows``), scores it by the family's components (``log p(x_t | u_t, z_t = k)``) and fits them in the M-step
by the expert family's weighted regression, the smoothed state marginals as the weights.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ppmix.components.family import DensityFamily
from ppmix.components.regression_emission import RegressionComponents
from ppmix.models._input_chain import pad_inputs

__all__ = ["INPUT_ENGINES", "emission_penalty", "inputs_needed_by", "reads_inputs", "sample_along_inputs"]

#: the engines of regression emissions under a homogeneous chain: EM, and the Pyro program (whose rows ``[u_t, x_t]``
#: carry the inputs) for SVI and NUTS; their experts have no conjugate prior (no Gibbs, no VB)
INPUT_ENGINES = ("em", "svi", "mcmc")


def reads_inputs(family: DensityFamily) -> bool:
    """Whether ``family``'s emissions read each step's inputs (it writes ``input_rows``)."""
    return callable(getattr(family, "input_rows", None))


def inputs_needed_by(transitions_read_inputs: bool, family: DensityFamily) -> str | None:
    """What of an HMM needs ``inputs=`` (its input-driven chain, its emission family), in words; None: nothing.

    Examples
    --------
    >>> from ppmix.components.registry import family_from
    >>> inputs_needed_by(False, family_from("poisson_regression"))
    "an HMM with emission='poisson_regression'"
    >>> inputs_needed_by(False, family_from("poisson")) is None
    True
    """
    parts = ["an input-driven HMM"] if transitions_read_inputs else []
    if reads_inputs(family):
        parts.append(f"an HMM with emission={family.name!r}")
    return " and ".join(parts) or None


def emission_penalty(components: Any) -> torch.Tensor | float:
    """The ridge penalty of regression emissions (the sum over the states of their experts' ``penalty()``; 0 for
    other emissions): what the experts' weighted fits subtract from the weighted log-likelihood, so EM's objective
    (``history_``) subtracts it too and rises at every iteration."""
    return components.penalty().sum() if isinstance(components, RegressionComponents) else 0.0


def sample_along_inputs(model: Any, inputs: Any, generator: torch.Generator) -> dict[str, list[np.ndarray]]:
    """One sequence along each array of ``inputs`` (``(T_b, P)``): its state path drawn step by step from the chain
    (an input-driven chain's moves at the step's inputs), then its responses from the emissions (a regression
    emission's at the step's inputs). ``{"x": [(T_b, D)], "z": [(T_b,)]}``, numpy arrays."""
    lengths = [len(values) for values in inputs]
    padded = pad_inputs(inputs, lengths, dtype=model.dtype, device="cpu", n_inputs=model.n_inputs_)
    if model._input_driven:
        log_moves = model._input_chain().log_transitions(padded.to(model._device)).cpu()
    else:
        log_moves = model.transition_.log().cpu().expand(len(lengths), max(lengths), -1, -1)
    z = [torch.multinomial(model.initial_.cpu().expand(len(lengths), -1), 1, generator=generator)[:, 0]]
    for t in range(1, max(lengths)):
        rows = log_moves[torch.arange(len(lengths)), t, z[-1]].exp()
        z.append(torch.multinomial(rows, 1, generator=generator)[:, 0])
    paths = torch.stack(z, dim=1)
    frames = _emitted_along(model.components_, paths, padded, generator)
    return {
        "x": [x[:length].numpy() for x, length in zip(frames, lengths)],
        "z": [path[:length].numpy() for path, length in zip(paths, lengths)],
    }


def _emitted_along(
    components: Any, paths: torch.Tensor, inputs: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """The frames ``(B, T, D)`` emitted along ``paths`` ``(B, T)``: given each step's ``inputs`` for regression
    emissions (``sample_given``), sequence by sequence for emissions that depend on the frames before
    (``sample_paths``), else by the family's ``sample``."""
    device = components.device
    cpu = generator if device.type == "cpu" else None
    index = paths.to(device)
    if callable(getattr(components, "sample_given", None)):
        flat = components.sample_given(index.reshape(-1), inputs.to(device).reshape(-1, inputs.shape[-1]), cpu)
    elif callable(getattr(components, "sample_paths", None)):
        return components.sample_paths(index, generator=cpu).cpu()
    else:
        flat = components.sample(index.reshape(-1), generator=cpu)
    return flat.reshape(*paths.shape, -1).cpu()
