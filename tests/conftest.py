import os

import matplotlib
import pyro
import pytest
import torch

matplotlib.use("Agg")
os.environ.setdefault("MPLBACKEND", "Agg")
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _clean_pyro_state():
    """Every test starts with an empty param store, validation on and a fixed seed."""
    pyro.clear_param_store()
    pyro.enable_validation(True)
    pyro.set_rng_seed(0)
    yield
    pyro.clear_param_store()
