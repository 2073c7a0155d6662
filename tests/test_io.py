"""Saving and loading: round trip, corruption, version and unpickling safety."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ppmix import GMM, MixtureModel
from ppmix.io import FORMAT_VERSION, config_checksum
from tests.common import assert_close


@pytest.fixture(params=["diag", "full"])
def fitted(request, tmp_path):
    x = np.random.default_rng(0).normal(size=(120, 3)) + np.repeat([[0, 0, 0], [5, 5, 5]], 60, axis=0)
    gmm = GMM(2, covariance_type=request.param, seed=0, progress=False).fit(x)
    path = gmm.save(tmp_path / "gmm")
    return x, gmm, path


def test_round_trip_gives_identical_predictions(fitted):
    x, gmm, path = fitted
    loaded = GMM.load(path)
    assert loaded.get_params() == gmm.get_params()
    assert_close(loaded.predict_proba(x), gmm.predict_proba(x), rtol=0, atol=0)
    assert_close(loaded.score_samples(x), gmm.score_samples(x), rtol=0, atol=0)
    assert loaded.history_ == gmm.history_ and loaded.converged_ == gmm.converged_
    assert MixtureModel.load(path).__class__ is GMM


def test_truncated_tensor_file_is_rejected(fitted):
    _, _, path = fitted
    data = (path / "tensors.pt").read_bytes()
    (path / "tensors.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="checksum"):
        GMM.load(path)


def test_tampered_tensor_file_is_rejected(fitted):
    _, _, path = fitted
    tensors = torch.load(path / "tensors.pt", weights_only=True)
    tensors["state.loc"] = tensors["state.loc"] + 1.0
    torch.save(tensors, path / "tensors.pt")
    with pytest.raises(ValueError, match="checksum"):
        GMM.load(path)


def test_corrupt_config_is_rejected(fitted):
    _, _, path = fitted
    text = (path / "config.json").read_text()
    (path / "config.json").write_text(text[:40])
    with pytest.raises(ValueError, match="not valid JSON"):
        GMM.load(path)


def test_incompatible_version_is_rejected(fitted):
    _, _, path = fitted
    config = json.loads((path / "config.json").read_text())
    config["format_version"] = FORMAT_VERSION + 1
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="format version"):
        GMM.load(path)


def test_missing_files_and_wrong_class(fitted, tmp_path):
    _, _, path = fitted
    with pytest.raises(FileNotFoundError, match="config.json"):
        GMM.load(tmp_path / "nowhere")
    config = json.loads((path / "config.json").read_text())
    config["class"] = "NoSuchModel"
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="unknown model class"):
        GMM.load(path)


class _Boom:
    """Unpickling this would run arbitrary code."""

    def __reduce__(self):
        return (_explode, ())


def _explode():
    raise AssertionError("arbitrary code ran while loading")


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_loading_never_unpickles_arbitrary_objects(fitted):
    _, _, path = fitted
    with open(path / "tensors.pt", "wb") as fh:
        pickle.dump({"state.loc": _Boom()}, fh)
    # forge a matching checksum so only the safe loader stands in the way
    import hashlib

    config = json.loads((path / "config.json").read_text())
    config["tensors_sha256"] = hashlib.sha256((path / "tensors.pt").read_bytes()).hexdigest()
    config["config_sha256"] = config_checksum(config)
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="could not be read safely"):
        GMM.load(path)


def test_saving_unfitted_model_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="not fitted"):
        GMM(2).save(tmp_path / "x")


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
        lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4),
        max_leaves=20,
    )
)
@settings(max_examples=200, deadline=None)
def test_reports_are_standard_json_with_non_finite_numbers_as_null(report):
    import json
    import math

    from ppmix.io.reports import strict_json

    def refuse(constant):
        raise AssertionError(f"non-standard JSON constant {constant}")

    def expected(value):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {k: expected(v) for k, v in value.items()}
        if isinstance(value, list):
            return [expected(v) for v in value]
        return value

    assert json.loads(strict_json(report), parse_constant=refuse) == expected(report)


def _sampled(engine):
    """A small two-group sample fitted by NUTS (a GMM) or by Gibbs (a Poisson mixture), with its data."""
    from ppmix import Mixture

    rng = np.random.default_rng(1)
    if engine == "mcmc":
        x = np.r_[rng.normal(size=(30, 1)) - 3, rng.normal(size=(30, 1)) + 3]
        return x, GMM(2, seed=0, progress=False).fit(x, engine="mcmc", num_samples=30, warmup_steps=30)
    x = np.r_[rng.poisson(2.0, size=(40, 1)), rng.poisson(12.0, size=(40, 1))].astype(float)
    model = Mixture(2, family="poisson", seed=0, progress=False)
    return x, model.fit(x, engine="gibbs", num_samples=40, warmup_steps=20, num_chains=2)


@pytest.mark.parametrize("engine", ["mcmc", "gibbs"])
def test_sampler_statistics_survive_save_and_load(engine, tmp_path):
    """Issue 40: ``to_arviz()`` of a loaded sampler fit has the ``sample_stats`` group it had (NUTS's statistics,
    the Gibbs log joint), so ``az.bfmi`` gives the same values."""
    az = pytest.importorskip("arviz")
    x, model = _sampled(engine)
    loaded = MixtureModel.load(model.save(tmp_path / "m"))
    before, after = model.to_arviz(x, num_samples=5), loaded.to_arviz(x, num_samples=5)
    assert "sample_stats" in before.groups() and before.sample_stats.equals(after.sample_stats)
    if engine == "mcmc":
        assert {"energy", "diverging", "tree_depth", "step_size"} <= set(after.sample_stats.data_vars)
        assert after.sample_stats["diverging"].dtype == bool
        np.testing.assert_array_equal(az.bfmi(before), az.bfmi(after))
    else:
        assert torch.equal(loaded.gibbs_log_joint_, model.gibbs_log_joint_)


def test_sampler_statistics_are_checked_and_optional(tmp_path):
    """Statistics that are not one per draw are refused on save (and so never written); a save without them (as
    ppmix wrote before it kept them) loads without a ``sample_stats`` group."""
    x, model = _sampled("mcmc")
    stats = model.mcmc_sample_stats_
    model.mcmc_sample_stats_ = {**stats, "lp": stats["lp"][:, :-1]}
    with pytest.raises(ValueError, match=r"cannot save.*per-draw statistic 'lp' has shape \(2, 29\).*\(2, 30\)"):
        model.save(tmp_path / "bad")
    del model.mcmc_sample_stats_
    loaded = MixtureModel.load(model.save(tmp_path / "old"))
    assert not hasattr(loaded, "mcmc_sample_stats_") and loaded.mcmc_samples_["locs"].shape == (2, 30, 2, 1)
    assert "sample_stats" not in loaded.to_arviz(x, num_samples=5).groups()
    # after a Gibbs fit, the statistics an earlier NUTS fit left (of other draws) are not saved
    x, model = _sampled("gibbs")
    model.mcmc_sample_stats_ = stats
    loaded = MixtureModel.load(model.save(tmp_path / "refit"))
    assert not hasattr(loaded, "mcmc_sample_stats_") and loaded.gibbs_log_joint_.shape == (2, 40)
