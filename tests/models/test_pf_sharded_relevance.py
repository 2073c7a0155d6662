"""``relevant_features_`` after a sharded fit (:func:`ppmix.distributed.fit_em`): the test on merged statistics."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch

from ppmix.components import DiagGaussian
from ppmix.datasets import make_pf_synthetic
from ppmix.distributed import fit_em
from ppmix.models import PFGMM, SupervisedGMM
from ppmix.models.pf.switch_selection import relevant_feature_mask, relevant_mask_from_ratio
from ppmix.models.pf.switches import FrameLabels, label_ratio, label_ratio_from_statistics


def _shards(x, y, n):
    return [(x[part], y[part]) for part in np.array_split(np.arange(len(x)), n)]


def _fit_em(model, shards):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fit_em(model, shards, executor="inline", target="y")


@pytest.mark.parametrize("n_shards", [1, 4])
def test_sharded_fit_selects_the_features_an_in_memory_fit_selects(n_shards):
    data = make_pf_synthetic(600, n_relevant=3, n_features=9, seed=0)
    y = data.y.astype(float)
    y[::7] = np.nan  # some labels missing
    model = PFGMM(3, switch_prior=0.3, n_restarts=1, seed=0, progress=False)
    sharded = _fit_em(copy.deepcopy(model), _shards(data.X, y, n_shards))
    in_memory = model.fit(data.X, y)
    assert sharded.relevant_features_.tolist() == in_memory.relevant_features_.tolist() == data.relevant.tolist()
    # the same statistic: from the fitted gains and the merged moments as from the rows themselves
    train = in_memory._train_data
    expected = relevant_feature_mask(sharded.relevance_gain_, 3, train.x, train.labels)
    assert np.array_equal(sharded.relevant_features_, expected)
    assert sharded.summary()["relevant"] == data.relevant.tolist()


def test_sharded_supervised_gmm_keeps_every_feature():
    data = make_pf_synthetic(400, n_relevant=2, n_features=6, seed=1)
    sup = _fit_em(SupervisedGMM(2, seed=0, progress=False), _shards(data.X, data.y.astype(float), 2))
    assert sup.relevant_features_.all()


def test_sharded_relevance_survives_save_and_load(tmp_path):
    data = make_pf_synthetic(300, n_relevant=2, n_features=5, seed=2)
    model = _fit_em(PFGMM(2, switch_prior=0.3, seed=0, progress=False), _shards(data.X, data.y.astype(float), 3))
    model.save(tmp_path / "sharded")
    assert PFGMM.load(tmp_path / "sharded").relevant_features_.tolist() == model.relevant_features_.tolist()


def test_label_ratio_from_merged_statistics_equals_the_rows():
    rng = np.random.default_rng(0)
    y = torch.as_tensor(rng.integers(2, size=300), dtype=torch.float64)
    x = torch.as_tensor(rng.normal(size=(300, 4)), dtype=torch.float64) * (1 + y[:, None]) + 2 * y[:, None]
    family = DiagGaussian(torch.zeros(2, 4, dtype=torch.float64), torch.ones(2, 4, dtype=torch.float64))
    parts = [
        family.statistics(x[i], torch.stack([y[i] == 0, y[i] == 1], 1).double()) for i in np.array_split(range(300), 3)
    ]
    merged = parts[0].merge(parts[1]).merge(parts[2])
    torch.testing.assert_close(label_ratio_from_statistics(merged), label_ratio(x, y), rtol=1e-9, atol=1e-9)
    labels = FrameLabels(y, torch.ones(300, dtype=torch.bool))
    gain = np.array([0.5, 0.5, 0.5, 1e-4])
    assert np.array_equal(
        relevant_mask_from_ratio(gain, 2, 300, label_ratio_from_statistics(merged)),
        relevant_feature_mask(gain, 2, x, labels),
    )
