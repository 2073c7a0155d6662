"""What a fitted :class:`~ppmix.models.moe.MixtureOfExperts` predicts: gate probabilities, the gate's expert,
``E[y | x]`` or the class, class probabilities, posteriors given ``(x, y)``, log-likelihoods and draws."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from sklearn.utils.metaestimators import available_if

from ppmix._validation import to_output

__all__ = ["ExpertPredictionsMixin"]


class ExpertPredictionsMixin:
    """The predictions of :class:`~ppmix.models.moe.MixtureOfExperts` (which provides the fitted ``_gate`` and
    ``_experts`` on the standardised scale, ``_covariates``, ``_log_joint`` and the target's coding)."""

    def gate_probabilities(self, X: Any) -> Any:
        """``P(z = k | x)`` for every row of ``X``, shape ``(N, K)``."""
        self._check_fitted()
        return to_output(self._gate.log_prob(self._covariates(X)).exp(), X)

    def predict_components(self, X: Any) -> Any:
        """The gate-MAP expert of every row of ``X`` (does not look at ``y``)."""
        self._check_fitted()
        return to_output(self._gate.log_prob(self._covariates(X)).argmax(-1), X)

    def _expert_means(self, x: torch.Tensor) -> torch.Tensor:
        return self._expert_family().expected_target(self._experts, x)

    def _conditional_mean(self, x: torch.Tensor) -> torch.Tensor:
        return (self._gate.log_prob(x).exp() * self._expert_means(x)).sum(-1)

    def predict(self, X: Any) -> Any:
        """``E[y | x]`` for a real target; the most probable class (of ``classes_``) for classifying experts."""
        self._check_fitted()
        if self._multiclass:
            return self._decode_prediction(self._class_log_proba(self._covariates(X)).argmax(-1), X)
        mean = self._conditional_mean(self._covariates(X))
        return self._decode_prediction((mean >= 0.5).long(), X) if self._classifies else to_output(mean, X)

    def _class_log_proba(self, x: torch.Tensor) -> torch.Tensor:
        """``log sum_k gate_k(x) P_k(c | x)`` of softmax experts, shape ``(N, C)``."""
        joint = self._gate.log_prob(x)[:, :, None] + torch.log_softmax(self._experts.linear_predictor(x), dim=-1)
        return torch.logsumexp(joint, dim=1)

    @available_if(lambda self: self._classifies)
    def predict_proba(self, X: Any) -> Any:
        """``P(y = c | x)`` for every class of ``classes_``, shape ``(N, C)`` (logistic and softmax experts only:
        Gaussian experts have no such method)."""
        self._check_fitted()
        x = self._covariates(X)
        if self._multiclass:
            return to_output(self._class_log_proba(x).exp(), X)
        log_gate, eta = self._gate.log_prob(x), self._experts.linear_predictor(x)
        log_p1, log_p0 = (torch.logsumexp(log_gate + F.logsigmoid(sign * eta), -1) for sign in (1, -1))
        p1 = torch.sigmoid(log_p1 - log_p0)  # in [0, 1] by construction, unlike a sum of gate-weighted sigmoids
        return to_output(torch.stack([1 - p1, p1], dim=-1), X)

    def _responsibilities(self, data: Any) -> torch.Tensor:
        return torch.softmax(self._log_joint(*self._require_y(data)), dim=1)

    def _posterior_marginals(self, data: Any) -> dict[str, torch.Tensor]:
        return {"z": self._responsibilities(data)}

    def _pointwise_log_likelihood(self, data: Any) -> torch.Tensor:
        return torch.logsumexp(self._log_joint(*self._require_y(data)), dim=1)

    def sample(self, X: Any) -> dict[str, Any]:  # type: ignore[override]
        """Draw an expert ``z`` and a response ``y`` for every row of ``X``: ``{"y", "z"}``."""
        self._check_fitted()
        x = self._covariates(X)
        gen = self._generator(offset=7919)
        cpu = gen if self._device.type == "cpu" else None
        z = torch.multinomial(self._gate.log_prob(x).exp().cpu(), 1, generator=gen).squeeze(-1).to(self._device)
        y = self._experts.sample(z, x, generator=cpu)
        return {"y": y.cpu().numpy(), "z": z.cpu().numpy()}
