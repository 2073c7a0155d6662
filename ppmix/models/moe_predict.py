"""What a fitted mixture of experts predicts, as functions of its parts (the gate and the experts, on the
standardised covariates ``x``): ``E[y | x]``, class probabilities and draws. The public methods of
:class:`~ppmix.models.moe.MixtureOfExperts` (``predict``, ``predict_proba``, ``sample``, ...) call them."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ppmix.components import SoftmaxGate
from ppmix.components.expert_family import ExpertFamily

__all__ = ["binary_proba", "class_log_proba", "conditional_mean", "draw"]


def conditional_mean(gate: SoftmaxGate, experts: Any, family: ExpertFamily, x: torch.Tensor) -> torch.Tensor:
    """``E[y | x] = sum_k gate_k(x) E_k[y | x]``, shape ``(N,)``.

    Examples
    --------
    >>> from ppmix.components import GaussianExpert
    >>> from ppmix.components.registry import expert_family_from
    >>> gate = SoftmaxGate(torch.zeros(2, 1), torch.zeros(2))
    >>> experts = GaussianExpert(torch.tensor([[1.0], [-1.0]]), torch.tensor([2.0, 0.0]), torch.ones(2))
    >>> conditional_mean(gate, experts, expert_family_from("gaussian"), torch.tensor([[3.0]])).tolist()
    [1.0]
    """
    return (gate.log_prob(x).exp() * family.expected_target(experts, x)).sum(-1)


def class_log_proba(gate: SoftmaxGate, experts: Any, x: torch.Tensor) -> torch.Tensor:
    """``log sum_k gate_k(x) P_k(c | x)`` of softmax experts, shape ``(N, C)``."""
    joint = gate.log_prob(x)[:, :, None] + torch.log_softmax(experts.linear_predictor(x), dim=-1)
    return torch.logsumexp(joint, dim=1)


def binary_proba(gate: SoftmaxGate, experts: Any, x: torch.Tensor) -> torch.Tensor:
    """``[P(y = 0 | x), P(y = 1 | x)]`` of logistic experts, shape ``(N, 2)``: from the log-odds of the two sums,
    in ``[0, 1]`` by construction (unlike a sum of gate-weighted sigmoids)."""
    log_gate, eta = gate.log_prob(x), experts.linear_predictor(x)
    log_p1, log_p0 = (torch.logsumexp(log_gate + F.logsigmoid(sign * eta), -1) for sign in (1, -1))
    p1 = torch.sigmoid(log_p1 - log_p0)
    return torch.stack([1 - p1, p1], dim=-1)


def draw(
    gate: SoftmaxGate, experts: Any, x: torch.Tensor, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """An expert ``z`` ``(N,)`` from the gate and a response ``y`` ``(N,)`` from that expert for every row of
    ``x`` (the gate's draw on the CPU with ``generator``; the experts' with it too where ``x`` is on the CPU)."""
    cpu = generator if x.device.type == "cpu" else None
    z = torch.multinomial(gate.log_prob(x).exp().cpu(), 1, generator=generator).squeeze(-1).to(x.device)
    return z, experts.sample(z, x, generator=cpu)
