"""Helpers shared by the test suite."""

from __future__ import annotations

import numpy as np
import pytest
import torch

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

#: devices every device-parametrized test runs on (CUDA only where present)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def assert_close(actual, expected, rtol: float = 1e-7, atol: float = 1e-9, msg: str = "") -> None:
    """``numpy.testing.assert_allclose`` for tensors and arrays alike."""

    def to_numpy(x):
        if isinstance(x, torch.Tensor):
            return x.detach().cpu().numpy()
        return np.asarray(x)

    np.testing.assert_allclose(to_numpy(actual), to_numpy(expected), rtol=rtol, atol=atol, err_msg=msg)
