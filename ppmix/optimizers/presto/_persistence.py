"""Saving and loading a fitted :class:`~ppmix.optimizers.presto.estimator.PRESTO`: its constructor
arguments, the partition, the standardisation, the components' and the softmax router's tensors (through
:mod:`ppmix.io`: safe tensor loading, checksum, version)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from ppmix._validation import as_numpy, resolve_device
from ppmix.optimizers.persist import SavableEstimator, load_object_tensors, object_tensors
from ppmix.optimizers.presto._routing import load_router, router_state_shapes, router_tensors
from ppmix.optimizers.presto._scaling import SCALE_NAMES, load_scales, scale_tensors, training_scales

__all__ = ["PrestoPersistence"]

logger = logging.getLogger(__name__)


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
    _OBJECT_PARAM = "component"

    def _saved_params(self) -> dict[str, Any]:
        """Constructor arguments as a saved file records them.

        A component object is recorded as ``None`` (pass it to :meth:`load`), an
        ``init`` array as ``"kmeans"`` and ``executor`` not at all.
        """
        params = super()._saved_params()
        params["component"] = self.component if isinstance(self.component, str) else None
        params["init"] = self.init if isinstance(self.init, str) else "kmeans"
        params["router"] = self.router if isinstance(self.router, str) else None
        return params

    def _state_tensors(self) -> dict[str, torch.Tensor]:
        """Partition, component parameters and router parameters (what :meth:`save` writes)."""
        self._check_fitted()
        router = router_tensors(self.router_)
        tensors = {"partition": torch.as_tensor(self.partition_, dtype=torch.long)}
        tensors.update(scale_tensors(self.scales_))
        tensors.update(object_tensors(self.components_, "component"))
        tensors.update(router)
        return tensors

    def _extra_state(self) -> dict[str, Any]:
        """JSON-able fitted state beyond the tensors."""
        return {
            "loss_history": [float(v) for v in self.loss_history_],
            "routability": float(self.routability_),
            "component_type": self.component if isinstance(self.component, str) else type(self.component).__name__,
        }

    @classmethod
    def _upgrade_saved(
        cls, params: dict[str, Any], fitted: dict[str, Any], extra: dict[str, Any], state: dict[str, torch.Tensor]
    ) -> None:
        """Saves from before PRESTO standardised its data (no ``standardize`` argument, no ``scales.*``
        tensors) were fitted on the data as given: they load with ``standardize=False`` and identity scales."""
        if any(f"scales.{name}" in state for name in SCALE_NAMES):
            return
        if "standardize" in params:
            raise ValueError(
                f"it records standardize={params['standardize']!r} but holds no standardisation scales "
                f"(scales.{', scales.'.join(SCALE_NAMES)}); fit the model again with this ppmix and save it"
            )
        p = fitted.get("n_features_in_")
        if not isinstance(p, int):
            raise ValueError("it holds neither standardisation scales nor n_features_in_; fit it again and save it")
        params["standardize"] = False
        identity = training_scales(
            torch.zeros(1, p, dtype=torch.float64),
            torch.zeros(1, dtype=torch.float64),
            standardize=False,
            scale_y=False,
        )
        state.update(scale_tensors(identity))
        logger.info("loading a PRESTO saved before standardize existed: it loads with standardize=False")

    def _state_shapes(self) -> dict[str, tuple[int | None, ...]]:
        """Partition (any length), scales, and the component's and router's tensors for these settings."""
        k, p = int(self.n_components), int(self.n_features_in_)
        cpu = torch.device("cpu")
        component = object_tensors(self._make_adapter(k, p, cpu).comp, "component")
        scales = {f"scales.{name}": (p,) if name.startswith("x") else () for name in SCALE_NAMES}
        return {
            "partition": (None,),
            **scales,
            **{name: tuple(value.shape) for name, value in component.items()},
            **router_state_shapes(k, p),
        }

    def _restore(self, tensors: dict[str, torch.Tensor], extra: dict[str, Any]) -> None:
        k, p = int(self.n_components), int(self.n_features_in_)
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

        Saves of older ppmix versions load too (see :meth:`_upgrade_saved`); ``ppmix.io.load_model(path)``
        gives the same fitted object.

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
