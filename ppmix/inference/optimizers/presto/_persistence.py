"""Saving and loading a fitted :class:`~ppmix.inference.optimizers.presto.estimator.PRESTO`: its constructor
arguments, the partition, the standardisation, the components' and the softmax router's tensors (through
:mod:`ppmix.io`: safe tensor loading, checksum, version)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ppmix._validation import as_numpy, resolve_device
from ppmix.inference.optimizers.persist import SavableEstimator, load_object_tensors, object_tensors
from ppmix.inference.optimizers.presto._routing import load_router, router_tensors
from ppmix.inference.optimizers.presto._scaling import load_scales, scale_tensors

__all__ = ["PrestoPersistence"]


class PrestoPersistence(SavableEstimator):
    """What PRESTO writes and reads back; the host defines the fitted state and ``_make_adapter``."""

    _SAVED_PARAMS = (
        "n_components",
        "ridge",
        "alpha",
        "leeway",
        "epsilon",
        "scores",
        "max_iter",
        "tol",
        "router_ridge",
        "router_weight",
        "standardize",
        "seed",
        "progress",
        "device",
    )

    def saved_params(self) -> dict[str, Any]:
        """Constructor arguments as a saved file records them.

        A component object is recorded as ``None`` (pass it to :meth:`load`), an
        ``init`` array as ``"kmeans"`` and ``executor`` not at all.
        """
        params = super().saved_params()
        params["component"] = self.component if isinstance(self.component, str) else None
        params["init"] = self.init if isinstance(self.init, str) else "kmeans"
        params["router"] = self.router if isinstance(self.router, str) else None
        return params

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Partition, component parameters and router parameters (what :meth:`save` writes)."""
        self._check_fitted()
        router = router_tensors(self.router_)
        tensors = {"partition": torch.as_tensor(self.partition_, dtype=torch.long)}
        tensors.update(scale_tensors(self.scales_))
        tensors.update(object_tensors(self.components_, "component"))
        tensors.update(router)
        return tensors

    def extra_state(self) -> dict[str, Any]:
        """JSON-able fitted state beyond the tensors."""
        return {
            "loss_history": [float(v) for v in self.loss_history_],
            "routability": float(self.routability_),
            "component_type": self.component if isinstance(self.component, str) else type(self.component).__name__,
        }

    def _restore(self, tensors: dict[str, torch.Tensor], extra: dict[str, Any], template: Any) -> None:
        k, p = int(self.n_components), int(self.n_features_in_)
        if self.component is None:
            if template is None:
                raise ValueError(
                    f"this PRESTO was saved with a {extra.get('component_type')} component object; pass an "
                    "unfitted one of the same kind to PRESTO.load(path, component=...)"
                )
            self.component = template
        device = resolve_device(self.device)
        adapter = self._make_adapter(k, p, device)
        load_object_tensors(adapter.comp, tensors, "component")
        self._adapter = adapter
        self._fit_device = device
        self.components_ = adapter.comp
        self.router_ = load_router(tensors, k, p, self.router_ridge, device)
        self.scales_ = load_scales(tensors, p, torch.float64, device)  # PRESTO computes in float64
        self.partition_ = as_numpy(tensors["partition"])
        if self.partition_.ndim != 1 or (
            self.partition_.size and not 0 <= self.partition_.min() <= self.partition_.max() < k
        ):
            raise ValueError(f"saved partition must hold part indices in [0, {k})")
        self.part_sizes_ = np.bincount(self.partition_, minlength=k)
        self.loss_history_ = [float(v) for v in extra["loss_history"]]
        if "routability" in extra:  # saved since router_weight was added
            self.routability_ = float(extra["routability"])

    @classmethod
    def load(cls, path: Any, component: Any = None, map_location: str | torch.device | None = None) -> Any:
        """Load a PRESTO written by :meth:`save` (safe tensor loading, checksum and version checked).

        Parameters
        ----------
        path : str or Path
            Directory written by :meth:`save`.
        component : object, optional
            Required when the saved PRESTO used a component object (a family or
            ``nn.Module``): an unfitted object of the same kind; its parameters are
            replaced by the saved ones.
        map_location : str or torch.device, optional
            Device to load onto; it becomes the loaded estimator's ``device``. By
            default the saved ``device`` is used (tensors are always saved from the CPU).

        Raises
        ------
        ValueError
            Corrupt or modified files, another format version, another class, or
            saved tensors that do not fit ``component``.

        Examples
        --------
        >>> import tempfile
        >>> import numpy as np
        >>> from ppmix.inference import PRESTO
        >>> X = np.linspace(-1, 1, 40)[:, None]
        >>> model = PRESTO(2, "linear", seed=0, progress=False).fit(X, np.abs(X[:, 0]))
        >>> again = PRESTO.load(model.save(tempfile.mkdtemp()))
        >>> bool((again.predict(X) == model.predict(X)).all())
        True
        """
        return cls._load(path, component, map_location)
