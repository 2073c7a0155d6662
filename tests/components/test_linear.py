"""The chunked weighted-Gram kernel shared by the linear families."""

from __future__ import annotations

import pytest
import torch

from ppmix.components import _linear
from ppmix.components._linear import weighted_grams
from tests.common import assert_close
from tests.components._util import parametrize_device, parametrize_dtype, rng, t


@parametrize_device
@parametrize_dtype
@pytest.mark.parametrize("q", [pytest.param(1, id="Q1"), pytest.param(5, id="Q5")])
@pytest.mark.parametrize("chunk_rows", [pytest.param(1, id="rows1"), pytest.param(7, id="rows7"), None])
@pytest.mark.parametrize("as_callable", [pytest.param(False, id="tensor"), pytest.param(True, id="callable")])
def test_weighted_grams_matches_einsum(q, chunk_rows, as_callable, dtype, device, monkeypatch):
    """Against ``einsum('nq,ni,nj->qij')`` with chunks of one row, of 7 (ragged: 53 rows) and one chunk.

    Signed weights (a softmax Hessian's off-diagonal curvatures are negative), the default
    thread count restored after.
    """
    m, rows = 4, 53
    r = rng(11)
    a, w = t(r.normal(size=(rows, m)), dtype, device), t(r.normal(size=(rows, q)), dtype, device)
    if chunk_rows is not None:
        monkeypatch.setattr(_linear, "_CHUNK_ELEMENTS", chunk_rows * q * m)
    threads = torch.get_num_threads()
    weights = (lambda chunk: w[chunk]) if as_callable else w
    grams = weighted_grams(a, weights, n_weights=q if as_callable else None)
    assert torch.get_num_threads() == threads
    assert grams.shape == (q, m, m) and grams.dtype == dtype and grams.device == a.device
    expected = torch.einsum("nq,ni,nj->qij", w.double(), a.double(), a.double())
    tol = {"rtol": 1e-5, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-12}
    assert_close(grams, expected, **tol)


def test_weighted_grams_empty_and_bad_input():
    a = torch.zeros(0, 3, dtype=torch.float64)
    assert_close(weighted_grams(a, torch.zeros(0, 2, dtype=torch.float64)), torch.zeros(2, 3, 3))
    with pytest.raises(ValueError, match="n_weights"):
        weighted_grams(a, lambda rows: a[rows, :2])
    with pytest.raises(ValueError, match="weights must have shape"):
        weighted_grams(torch.zeros(5, 3), torch.zeros(4, 2))
