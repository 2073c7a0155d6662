"""What the persistence audits share: the data their models are fitted on and how two fits are compared."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ppmix.io import CONFIG_FILE, TENSOR_FILE, atomic, config_checksum, schema

_rng = np.random.default_rng(0)
X = np.concatenate([_rng.normal(size=(40, 2)), _rng.normal(size=(40, 2)) + 5.0])
#: whether this platform swaps two directories atomically (renameat2); otherwise a save renames twice
SWAP_WORKS = atomic._renameat2() is not None


def same_gmm(loaded: Any, model: Any) -> bool:
    return type(loaded) is type(model) and np.array_equal(loaded.predict_proba(X), model.predict_proba(X))


def forge(path: Path, tensors: Any = None, config_edit: Any = None) -> None:
    """Rewrite a save with other tensors and/or an edited config, the checksums forged to match."""
    if tensors is not None:
        torch.save(tensors, path / TENSOR_FILE)
    config = json.loads((path / CONFIG_FILE).read_text())
    if config_edit is not None:
        config_edit(config)
    config["tensors_sha256"] = schema._sha256(path / TENSOR_FILE)
    config["config_sha256"] = config_checksum(config)
    (path / CONFIG_FILE).write_text(json.dumps(config))
