"""Shared machinery of the families with a linear predictor ``x @ coef[k] + intercept[k]``."""

from __future__ import annotations

import torch

from ppmix.components.base import ComponentFamily


def design_matrix(x: torch.Tensor) -> torch.Tensor:
    """``[x, 1]``: the covariates with an intercept column appended."""
    return torch.cat([x, torch.ones_like(x[:, :1])], dim=1)


class LinearFamily(ComponentFamily):
    """A family whose ``K`` members each have coefficients ``coef[k]`` and ``intercept[k]``."""

    def _init_linear(self, coef: torch.Tensor, intercept: torch.Tensor | None, ridge: float) -> None:
        coef = torch.as_tensor(coef)
        if coef.dim() != 2:
            raise ValueError(f"coef must have shape (K, P); got {tuple(coef.shape)}")
        if intercept is None:
            intercept = torch.zeros(coef.shape[0], dtype=coef.dtype, device=coef.device)
        intercept = torch.as_tensor(intercept)
        if intercept.shape != coef.shape[:1]:
            raise ValueError(f"intercept must have shape ({coef.shape[0]},); got {tuple(intercept.shape)}")
        if ridge < 0:
            raise ValueError("ridge must be non-negative")
        self.coef, self.intercept, self.ridge = coef, intercept.to(coef.dtype), float(ridge)

    @property
    def n_covariates(self) -> int:
        return int(self.coef.shape[1])

    def _covariates(self, x: torch.Tensor, name: str = "x") -> torch.Tensor:
        x = torch.as_tensor(x).to(device=self.device, dtype=self.dtype)
        if x.dim() != 2 or x.shape[1] != self.n_covariates:
            raise ValueError(f"{name} must have shape (N, {self.n_covariates}); got {tuple(x.shape)}")
        return x

    def linear_predictor(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ coef.T + intercept``, shape ``(N, K)``."""
        return torch.addmm(self.intercept, self._covariates(x), self.coef.T)

    def _indexed_predictor(self, index: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
        """Linear predictor of component ``index`` (broadcast against the rows of ``x``)."""
        if index is None:
            return self.linear_predictor(x)
        return (self.coef[index] * x).sum(-1) + self.intercept[index]

    def _stacked(self) -> torch.Tensor:
        """Parameters as one ``(K, P + 1)`` matrix matching :func:`design_matrix`."""
        return torch.cat([self.coef, self.intercept[:, None]], dim=1)

    def _unstack(self, theta: torch.Tensor) -> None:
        self.coef, self.intercept = theta[:, :-1].contiguous(), theta[:, -1].contiguous()

    def _ridge_matrix(self) -> torch.Tensor:
        """Ridge penalty on the coefficients only (the intercept is not shrunk)."""
        diag = torch.full((self.n_covariates + 1,), self.ridge, dtype=self.dtype, device=self.device)
        diag[-1] = 0.0
        return torch.diag(diag)
