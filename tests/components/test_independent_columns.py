"""The independent family (``ppmix.components.Independent``): a family per column, for mixed-type data.

Known answers: the log-density is the sum of the column families' (1e-12); EM's M-step is each column family's own on
its column; with every column Gaussian it is the diagonal GMM from the same start (1e-10); integer sample weights
are repeated rows; a missing entry is marginalised (the row scored by its observed columns); save/load keeps the
categories; a DataFrame's categorical columns are coded and a frame whose categories come in another order predicts
the same. ``check_family`` runs on mixed columns; the registered-family suites (tests/components/test_families.py)
run its default (Gaussian columns).
"""

from __future__ import annotations

import copy
import pickle
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pyro.distributions.transforms import biject_to

from ppmix import GMM, HMM, HSMM, Mixture
from ppmix.components import Independent
from ppmix.components.family_tools import placeholder
from ppmix.components.frame_coding import decode_frame
from ppmix.components.registry import family_from
from ppmix.testing import check_family

QUIET = {"seed": 0, "progress": False}
MIXED = ["gamma", "poisson", "bernoulli", "categorical", "gaussian"]
F64 = torch.float64


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _mixed_rows(n: int = 120, seed: int = 0) -> np.ndarray:
    """``2 n`` rows from two planted components, one column per family of :data:`MIXED`."""
    rng = np.random.default_rng(seed)
    return np.column_stack(
        [
            np.concatenate([rng.gamma(2.0, 1.0, n), rng.gamma(9.0, 1.0, n)]),
            np.concatenate([rng.poisson(1.0, n), rng.poisson(6.0, n)]),
            np.concatenate([rng.binomial(1, 0.2, n), rng.binomial(1, 0.8, n)]),
            np.concatenate([rng.choice(3, n, p=[0.7, 0.2, 0.1]), rng.choice(3, n, p=[0.1, 0.2, 0.7])]),
            np.concatenate([rng.normal(0.0, 1.0, n), rng.normal(3.0, 1.0, n)]),
        ]
    ).astype(float)


def _frame(n: int = 100, seed: int = 0) -> pd.DataFrame:
    """A DataFrame of mixed dtypes: counts, a ``category`` column, a string column, floats; two planted groups."""
    rng = np.random.default_rng(seed)
    group = np.arange(2 * n) % 2
    return pd.DataFrame(
        {
            "visits": rng.poisson(np.where(group == 1, 8.0, 1.0)),
            "region": pd.Categorical(
                np.where(rng.random(2 * n) < np.where(group == 1, 0.85, 0.1), "south", "north"),
                categories=["north", "south", "east"],
            ),
            "smoker": np.where(rng.random(2 * n) < np.where(group == 1, 0.8, 0.2), "yes", "no").astype(object),
            "bmi": rng.normal(np.where(group == 1, 30.0, 22.0), 2.0),
        }
    )


FRAME_FAMILY = {"visits": "poisson", "region": "categorical", "smoker": "bernoulli", "bmi": "gaussian"}


def test_mixed_columns_pass_check_family():
    """``ppmix.testing.check_family`` (M-step, EM = TraceEnum_ELBO, shards, sample_weight = rows repeated,
    save/load) on a gamma, Poisson, Bernoulli, categorical and Gaussian column, in Mixture and HMM."""
    check_family(Independent(MIXED), _mixed_rows())


#: MIXED and more columns of its Poisson, Gaussian and Bernoulli families: the E-step scores the columns of each of
#: those together, as one batch (``JOINED_CLASSES``)
REPEATED = [*MIXED, "poisson", "gaussian", "bernoulli", "gaussian"]


def _repeated_rows(n: int = 120, seed: int = 0) -> np.ndarray:
    return np.column_stack([_mixed_rows(n, seed), _mixed_rows(n, seed + 1)[:, [1, 4, 2, 4]]])


def _fitted_columns(rows: np.ndarray):
    """The family of :data:`REPEATED` measured on ``rows`` and its components after one M-step from fixed
    responsibilities."""
    family = Independent(REPEATED)
    x = torch.as_tensor(rows)
    scale = family.data_scale(x)
    family = family.measured(scale)
    resp = torch.softmax(torch.as_tensor(np.random.default_rng(1).normal(size=(len(rows), 2))), dim=1)
    components = placeholder(family, 2, rows.shape[1], scale, {"dtype": F64})
    components.fit_statistics(components.statistics(family.prepare(x), resp))
    return family, scale, components, x, resp


def test_m_step_is_each_column_familys_own_and_log_density_their_sum():
    """From the same responsibilities every column's parameters are those its family fits on its column alone, and
    a row's log-density under the fitted components is the sum of the column families' (1e-12)."""
    rows = _repeated_rows()
    family, scale, components, x, resp = _fitted_columns(rows)
    total = torch.zeros(len(rows), 2, dtype=F64)
    for j, name in enumerate(REPEATED):
        alone = family_from(name)
        column = x[:, j : j + 1]
        alone = alone.measured(alone.data_scale(column))
        own = placeholder(alone, 2, 1, alone.data_scale(column), {"dtype": F64})
        own.fit_statistics(own.statistics(alone.prepare(column), resp))
        for key, value in own.state_dict().items():
            torch.testing.assert_close(components.state_dict()[f"{j}.{key}"], value, rtol=1e-12, atol=0.0)
        total += own.log_prob(alone.prepare(column))
    torch.testing.assert_close(components.log_prob(family.prepare(x)), total, rtol=1e-12, atol=0.0)


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_log_density_is_the_sum_of_the_columns_at_any_parameters(seed):
    """At random parameters of every column family (each site drawn in its support), the log-density of random rows
    is the sum of the column families' log-densities (1e-12), and the Pyro distribution of whole rows agrees."""
    rows = _repeated_rows(20, seed=seed % 1000)
    family, scale, components, x, _ = _fitted_columns(rows)
    generator = torch.Generator().manual_seed(seed)
    specs, values = family.sites(2, rows.shape[1]), {}
    for site, value in family.site_values(components).items():
        transform = biject_to(specs[site].support)
        free = transform.inv(value)
        values[site] = transform(free + 0.5 * torch.randn(free.shape, generator=generator, dtype=F64))
    moved = family.components(values, scale)
    expected = sum(part.log_prob(x[:, j : j + 1]) for j, part in enumerate(moved.parts))
    torch.testing.assert_close(moved.log_prob(family.prepare(x)), expected, rtol=1e-12, atol=1e-12)
    z = torch.arange(2)[:, None]
    torch.testing.assert_close(moved.pyro_dist(z).log_prob(x).T, expected, rtol=1e-12, atol=1e-12)


def test_every_column_gaussian_is_the_diagonal_gmm_from_the_same_start():
    """Gaussian columns are the diagonal Gaussian: from the same start, after each of EM's first iterations, the
    same weights, means, variances and history as ``GMM(covariance_type="diag")`` (1e-10; EM converges in 4, where
    the GMM's fused E-step and the columns' two passes may stop one iteration apart at a change of 1e-10), and the
    same converged log-likelihood (1e-12)."""
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(0.0, 1.0, (150, 3)), rng.normal(3.0, 0.5, (150, 3))])
    for family in (Independent(["gaussian"] * 3), Independent("gaussian")):
        for max_iter in (1, 2, 3, 4):
            gmm = _quiet(GMM(2, covariance_type="diag", max_iter=max_iter, tol=0.0, **QUIET).fit, x)
            mix = _quiet(Mixture(2, family=family, max_iter=max_iter, tol=0.0, **QUIET).fit, x)
            np.testing.assert_allclose(mix.weights_, gmm.weights_, rtol=1e-10)
            np.testing.assert_allclose(mix.means_, gmm.means_, rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(mix.covariances_, gmm.covariances_, rtol=1e-10)
            np.testing.assert_allclose(mix.history_, gmm.history_, rtol=1e-12)
        converged = [
            _quiet(m.fit, x).score(x)
            for m in (GMM(2, covariance_type="diag", **QUIET), Mixture(2, family=family, **QUIET))
        ]
        np.testing.assert_allclose(converged[1], converged[0], rtol=1e-12)


def test_columns_by_name_by_position_and_as_a_list_are_one_family():
    rows = _mixed_rows(60)
    by_name = Independent(dict(zip("abcde", MIXED, strict=True)))
    fits = [
        _quiet(Mixture(2, family=family, max_iter=20, **QUIET).fit, rows)._get_globals()
        for family in (Independent(MIXED), Independent(dict(enumerate(MIXED))), by_name)
    ]
    for fit in fits[1:]:
        for site, value in fits[0].items():
            torch.testing.assert_close(fit[site], value, rtol=0.0, atol=0.0)


def test_a_missing_entry_is_marginalised():
    """A row with a missing column is scored by its observed columns (the missing one integrates to one), and an EM
    iteration fits each column family on that column's observed entries alone, under the E-step's
    responsibilities."""
    rows = _mixed_rows(80)
    holed = rows.copy()
    holed[::7, 3] = np.nan  # categorical
    holed[1::9, 0] = np.nan  # gamma
    model = _quiet(Mixture(2, family=Independent(MIXED), missing="marginalize", max_iter=5, **QUIET).fit, holed)
    x = torch.as_tensor(holed)
    observed = ~torch.isnan(x)
    filled = torch.where(observed, x, torch.as_tensor(rows))  # any value: masked out
    log_joint = model.weights_.log() + sum(
        torch.where(observed[:, j, None], part.log_prob(filled[:, j : j + 1]), 0.0)
        for j, part in enumerate(model.components_.parts)
    )
    np.testing.assert_allclose(model.score_samples(holed), torch.logsumexp(log_joint, 1).numpy(), rtol=1e-12)
    resp = torch.softmax(log_joint, dim=1)
    step = copy.deepcopy(model).set_params(warm_start=True, max_iter=1, tol=0.0)
    _quiet(step.fit, holed)
    for j, part in enumerate(step.components_.parts):
        rows_j = observed[:, j]
        alone = model._component_family().families[j]
        own = model.components_.parts[j].clone()
        own.fit_statistics(own.statistics(alone.prepare(x[rows_j, j : j + 1]), resp[rows_j]))
        for key, value in own.state_dict().items():
            torch.testing.assert_close(part.state_dict()[key], value, rtol=1e-9, atol=1e-12)


def test_a_dataframe_of_mixed_dtypes_is_coded_and_predicts_by_category_not_order(tmp_path):
    """``category`` and string columns are coded (categories that no row holds left out), the categories are kept
    (``categories_``, saved), and a frame with its columns and categories in another order predicts the same."""
    frame = _frame()
    model = _quiet(Mixture(2, family=Independent(FRAME_FAMILY), **QUIET).fit, frame)
    assert model.categories_ == {"region": ["north", "south"], "smoker": ["no", "yes"]}
    assert model.feature_names_in_ == list(FRAME_FAMILY)
    shuffled = frame[["bmi", "smoker", "region", "visits"]].copy()
    shuffled["region"] = shuffled["region"].cat.reorder_categories(["east", "south", "north"])
    shuffled["smoker"] = pd.Categorical(shuffled["smoker"], categories=["yes", "no"])
    np.testing.assert_array_equal(model.predict(shuffled), model.predict(frame))
    np.testing.assert_allclose(model.score_samples(shuffled), model.score_samples(frame), rtol=0.0)
    codes = np.column_stack(
        [
            frame["visits"],
            (frame["region"] == "south").astype(float),
            (frame["smoker"] == "yes").astype(float),
            frame["bmi"],
        ]
    )
    np.testing.assert_allclose(model.score_samples(codes), model.score_samples(frame), rtol=0.0)
    loaded = type(model).load(model.save(tmp_path / "model"))
    assert loaded.categories_ == model.categories_
    np.testing.assert_allclose(loaded.score_samples(shuffled), model.score_samples(frame), rtol=0.0)


def test_an_unseen_category_and_a_column_of_strings_under_a_family_of_numbers_are_refused():
    frame = _frame(30)
    model = _quiet(Mixture(2, family=Independent(FRAME_FAMILY), **QUIET).fit, frame)
    new = frame.copy()
    new.loc[3, "smoker"] = "sometimes"
    with pytest.raises(ValueError, match=r"column 'smoker' of X holds the category 'sometimes'"):
        model.predict(new)
    new = frame.copy()
    new["region"] = new["region"].cat.set_categories(["north", "south", "east"])
    new.loc[0, "region"] = "east"  # a category of the dtype that no training row held
    with pytest.raises(ValueError, match=r"column 'region' of X holds the category 'east'"):
        model.predict(new)
    with pytest.raises(TypeError, match=r"column 'smoker' of X holds \w+ values, but its family is 'poisson'"):
        _quiet(Mixture(2, family=Independent({**FRAME_FAMILY, "smoker": "poisson"}), **QUIET).fit, frame)
    with pytest.raises(ValueError, match=r"missing \['bmi'\]"):
        model.predict(frame.drop(columns="bmi"))


def test_missing_categories_in_a_frame_are_marginalised():
    frame = _frame(60)
    frame.loc[::5, "region"] = None
    frame.loc[1::7, "smoker"] = None
    model = _quiet(Mixture(2, family=Independent(FRAME_FAMILY), missing="marginalize", **QUIET).fit, frame)
    assert model.categories_ == {"region": ["north", "south"], "smoker": ["no", "yes"]}
    assert np.isfinite(model.score_samples(frame)).all()


def test_an_hmm_and_an_hsmm_take_a_list_of_frames_and_samples_decode_to_categories():
    frames = [_frame(20, seed=s) for s in range(4)]
    model = _quiet(HMM(2, emission=Independent(FRAME_FAMILY), **QUIET).fit, frames)
    assert model.categories_ == {"region": ["north", "south"], "smoker": ["no", "yes"]}
    assert len(model.predict(frames)) == 4
    decoded = decode_frame(model, model.sample(3, length=10))
    assert decoded.shape == (30, 4)
    assert list(decoded.columns) == list(FRAME_FAMILY)
    assert set(decoded["region"]) <= {"north", "south"} and set(decoded["smoker"]) <= {"no", "yes"}
    semi_markov = _quiet(HSMM(2, emission=Independent(FRAME_FAMILY), max_duration=8, **QUIET).fit, frames)
    assert semi_markov.categories_ == model.categories_ and len(semi_markov.predict(frames)) == 4


def test_components_pickle_and_the_family_saves_as_a_config():
    model = _quiet(Mixture(2, family=Independent(MIXED), max_iter=5, **QUIET).fit, _mixed_rows(40))
    again = pickle.loads(pickle.dumps(model.components_))
    torch.testing.assert_close(again.state_dict(), model.components_.state_dict())
    assert model._saved_params()["family"] == {"name": "independent", "columns": MIXED}
    assert family_from({"name": "independent", "columns": {"a": "poisson"}}).names == ("a",)


def test_map_em_and_gibbs_are_each_column_familys_own():
    """With ``priors`` (a column family's keys as ``"<column>.<key>"``; for one family of every column, its own keys)
    MAP-EM is each column family's: Poisson columns fit as the Poisson family under the same priors (1e-10), and
    on mixed columns with missing entries the priors of one column move that column only. Gibbs draws every column
    from its family's conjugate posterior."""
    rows = _mixed_rows(60)
    counts = rows[:, [1, 1]] + rows[:, [2, 2]] * np.array([0.0, 3.0])
    priors = {"weights": 2.0, "rate_concentration": 3.0, "rate_rate": 0.5}
    plain = _quiet(Mixture(2, family="poisson", priors=priors, max_iter=50, **QUIET).fit, counts)
    columns = _quiet(Mixture(2, family=Independent("poisson"), priors=priors, max_iter=50, **QUIET).fit, counts)
    np.testing.assert_allclose(columns.means_, plain.means_, rtol=1e-10)
    np.testing.assert_allclose(columns.history_, plain.history_, rtol=1e-10)
    family = Independent(dict(zip("abcde", MIXED, strict=True)))
    assert "b.rate_rate" in Mixture(2, family=family).prior_keys()
    holed = rows.copy()
    holed[::5, 0] = np.nan
    resp = torch.softmax(torch.as_tensor(np.random.default_rng(0).normal(size=(len(rows), 2))), dim=1)
    start = Mixture(2, family=family, priors={"b.rate_concentration": 1.0}, missing="marginalize", max_iter=2, **QUIET)
    _quiet(start.fit, holed)
    steps = []
    for column_priors in ({"b.rate_concentration": 1.0}, {"b.rate_concentration": 50.0}):
        model = copy.deepcopy(start).set_params(priors=column_priors)  # one state, then MAP-EM's M-step from resp
        model._m_step(model._em_data(model.prepare_data(holed)), resp)
        steps.append(model.components_.parts)
    assert [j for j in range(5) if not torch.equal(steps[0][j].moments().mean, steps[1][j].moments().mean)] == [1]
    alone = Mixture(2, family="poisson", priors={"rate_concentration": 50.0}, **QUIET)
    _quiet(alone.fit, rows[:, 1:2])
    alone._m_step(alone._em_data(alone.prepare_data(rows[:, 1:2])), resp)
    torch.testing.assert_close(steps[1][1].rate, alone.components_.rate, rtol=1e-12, atol=0.0)
    with pytest.raises(ValueError, match=r"unknown key 'rate_rate'"):
        _quiet(Mixture(2, family=family, priors={"rate_rate": 1.0}, **QUIET).fit, rows)
    gibbs = Independent(["poisson", "bernoulli", "categorical"])
    draws = _quiet(Mixture(2, family=gibbs, **QUIET).fit, rows[:, 1:4], engine="gibbs", num_samples=20, warmup_steps=10)
    assert np.isfinite(draws.score(rows[:, 1:4]))


def test_map_em_on_mixed_columns_never_decreases_its_objective():
    rows = _mixed_rows(60)
    model = _quiet(
        Mixture(2, family=Independent(MIXED), priors={"weights": 2.0}, max_iter=30, tol=0.0, **QUIET).fit, rows
    )
    assert np.all(np.diff(model.history_) >= -1e-9 * np.abs(model.history_[1:]))


@pytest.mark.parametrize(
    "columns, error, message",
    [
        ({}, ValueError, "at least one column"),
        ({0: "poisson", 2: "gamma"}, ValueError, r"keyed 0\.\.1"),
        ({"a": "autoregressive"}, ValueError, "family of rows"),
        (3, TypeError, "columns must be a dict"),
        ({"a": "nope"}, ValueError, "unknown component family 'nope'"),
    ],
)
def test_bad_columns_are_refused_naming_them(columns, error, message):
    with pytest.raises(error, match=message):
        Mixture(2, family=Independent(columns), **QUIET).fit(_mixed_rows(10)[:, :1])
