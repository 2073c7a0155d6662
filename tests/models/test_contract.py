"""The model contract, checked once for every public model class (instead of a copy per model).

Every model: ``fit`` returns the model and records ``n_iter_``, ``converged_`` and ``history_``; its
predictions have the documented shapes and finite values; numpy in gives numpy out and a tensor in gives a
tensor out; using it before ``fit`` is a clear error; ``save`` then ``load`` (also ``MixtureModel.load``)
gives identical predictions; ``to_arviz()`` has a ``posterior`` group; bad input (NaN, a 1-D ``X``, another
number of features, labels of the wrong length) is a ``ValueError``/``TypeError`` that names the argument.

``CASES`` holds one tiny, fast fit per class. What a class does not offer is listed in one table,
``NOT_OFFERED``, and ``test_not_offered_is_really_absent`` checks every entry (so the table cannot go
stale). Known ppmix bugs are strict xfails listed in ``KNOWN_BUGS``.
"""

from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pytest
import torch

import ppmix
import ppmix.models
from ppmix import GMM, HMM, HSMM, PFGMM, PFHMM, Mixture, MixtureModel, MixtureOfExperts, SupervisedGMM, SupervisedHMM
from ppmix.engines.params import local_params
from ppmix.engines.potential import FlatPotential, likelihood_potential
from ppmix.engines.result import ConvergenceWarning
from ppmix.models import PFGMMGibbs
from tests.common import (
    FAMILY_DATA,
    StudentTMixture,
    assert_close,
    make_blobs,
    make_expert_data,
    make_family_rows,
    make_family_sequences,
    make_labelled_blobs,
    make_sequences,
)

pytestmark = pytest.mark.filterwarnings("ignore::ppmix.engines.result.ConvergenceWarning")


class UserStudentT(StudentTMixture):
    """A mixture a user writes: only the Pyro program (proper priors) and a data-driven start; fitted by SVI."""

    def _init_values(self, data: torch.Tensor, generator: torch.Generator) -> dict[str, torch.Tensor]:
        rows = torch.randperm(data.shape[0], generator=generator)[: self.n_components]
        return {"loc": data[rows]}


# ------------------------------------------------------------------------------------------ the cases
@dataclass(frozen=True)
class Case:
    """One model class under the contract."""

    make: Callable[[], Any]  # a fresh, unfitted model
    data: Callable[[], tuple[Any, Any]]  # (X, y); y is None for an unsupervised model
    fit_options: dict = field(default_factory=dict)
    sequences: bool = False  # X is a list of (T_i, D) arrays: per-row outputs come per sequence
    n_columns: int = 2  # columns of predict_proba
    n_labels: int | None = 2  # predict gives integers in [0, n_labels); None: real values (a regression)
    score_needs_y: bool = False  # score(X, y) rather than score(X)


def _blobs():
    return make_blobs(40, n_features=2)[0], None


def _labelled_blobs():
    return make_labelled_blobs(60, n_features=3)


def _sequences():
    return make_sequences(6, (4, 10), n_features=2)[0], None


def _labelled_sequences():
    x, y, _ = make_sequences(6, (4, 10), n_features=3, n_relevant=1)
    return x, y


QUIET = {"seed": 0, "progress": False}

CASES: dict[str, Case] = {
    "GMM-diag": Case(lambda: GMM(2, covariance_type="diag", max_iter=20, **QUIET), _blobs),
    "GMM-full": Case(lambda: GMM(2, covariance_type="full", max_iter=20, **QUIET), _blobs),
    "GMM-spherical": Case(lambda: GMM(2, covariance_type="spherical", max_iter=20, **QUIET), _blobs),
    "GMM-tied": Case(lambda: GMM(2, covariance_type="tied", max_iter=20, **QUIET), _blobs),
    "HMM-tied": Case(lambda: HMM(2, covariance_type="tied", max_iter=10, **QUIET), _sequences, sequences=True),
    "HMM": Case(lambda: HMM(2, max_iter=10, **QUIET), _sequences, sequences=True),
    "HMM-autoregressive": Case(
        lambda: HMM(2, emission={"name": "autoregressive", "lags": 2}, max_iter=10, **QUIET), _sequences, sequences=True
    ),
    "HMM-left-right-MAP": Case(
        lambda: HMM(
            2, transition_pattern="left-right", transition_prior=2.0, init_params="segments", max_iter=10, **QUIET
        ),
        _sequences,
        sequences=True,
    ),
    "HSMM": Case(lambda: HSMM(2, max_duration=4, max_iter=10, **QUIET), _sequences, sequences=True),
    "HSMM-poisson-nonparametric": Case(
        lambda: HSMM(2, emission="poisson", duration="nonparametric", max_duration=4, max_iter=10, **QUIET),
        lambda: (make_family_sequences("poisson")[0], None),
        sequences=True,
    ),
    "PFGMM": Case(lambda: PFGMM(2, switch_prior=0.5, max_iter=20, **QUIET), _labelled_blobs, score_needs_y=True),
    "SupervisedGMM": Case(lambda: SupervisedGMM(2, max_iter=20, **QUIET), _labelled_blobs, score_needs_y=True),
    "PFHMM": Case(
        lambda: PFHMM(2, switch_prior=0.5, max_iter=10, **QUIET),
        _labelled_sequences,
        sequences=True,
        score_needs_y=True,
    ),
    "SupervisedHMM": Case(
        lambda: SupervisedHMM(2, max_iter=10, **QUIET), _labelled_sequences, sequences=True, score_needs_y=True
    ),
    "MoE-gaussian": Case(
        lambda: MixtureOfExperts(2, max_iter=20, **QUIET),
        lambda: make_expert_data(60, expert="gaussian"),
        n_labels=None,
        score_needs_y=True,
    ),
    "MoE-logistic": Case(
        lambda: MixtureOfExperts(2, expert="logistic", max_iter=20, **QUIET),
        lambda: make_expert_data(60, expert="logistic"),
        score_needs_y=True,
    ),
    "MoE-poisson": Case(
        lambda: MixtureOfExperts(2, expert="poisson", max_iter=20, **QUIET),
        lambda: make_expert_data(60, expert="poisson"),
        n_labels=None,
        score_needs_y=True,
    ),
    "user-StudentT-svi": Case(
        lambda: UserStudentT(2, df=4.0, **QUIET), _blobs, fit_options={"engine": "svi", "num_steps": 30, "lr": 0.05}
    ),
    "PFGMMGibbs": Case(lambda: PFGMMGibbs(2, num_samples=10, warmup_steps=5, seed=0), _labelled_blobs),
}
#: two binary features do not identify two Bernoulli components (a 2 x 2 table has 3 degrees of freedom, the
#: mixture 5 parameters: a flat ridge of optima, on which a Laplace approximation is meaningless)
IDENTIFYING_FEATURES = {"bernoulli": 3}
# every registered family, as the components of a Mixture and the emissions of an HMM
for _name in FAMILY_DATA:
    CASES[f"Mixture-{_name}"] = Case(
        lambda name=_name: Mixture(2, family=name, max_iter=20, **QUIET),
        lambda name=_name: (make_family_rows(name, 40, n_features=IDENTIFYING_FEATURES.get(name, 2))[0], None),
    )
    CASES[f"HMM-{_name}"] = Case(
        lambda name=_name: HMM(2, emission=name, max_iter=10, **QUIET),
        lambda name=_name: (make_family_sequences(name)[0], None),
        sequences=True,
    )

PREDICTIONS = ("predict", "predict_proba", "score", "score_samples")
ITEMS = ("fit_attributes", *PREDICTIONS, "save_load", "to_arviz")

#: (case, contract item) -> why the class does not offer it. The one place a check is left out:
#: ``test_not_offered_is_really_absent`` checks each entry, the other tests run over the rest.
NOT_OFFERED: dict[tuple[str, str], str] = {
    ("MoE-gaussian", "predict_proba"): "Gaussian experts are a regression: predict gives E[y | x]",
    ("MoE-gaussian", "score_samples"): "the MoE models y given X; score_samples(X) takes no y (score(X, y) does)",
    ("MoE-logistic", "score_samples"): "the MoE models y given X; score_samples(X) takes no y (score(X, y) does)",
    ("MoE-poisson", "predict_proba"): "Poisson experts are a regression of counts: predict gives E[y | x]",
    ("MoE-poisson", "score_samples"): "the MoE models y given X; score_samples(X) takes no y (score(X, y) does)",
    ("PFGMMGibbs", "fit_attributes"): "a Gibbs sampler, not a MixtureModel: its fit keeps draws_, no n_iter_/history_",
    ("PFGMMGibbs", "score"): "not a MixtureModel: score_samples only",
    ("PFGMMGibbs", "save_load"): "not a MixtureModel: no save/load",
    ("PFGMMGibbs", "sample_weight"): "a Gibbs sampler: its fit takes no sample_weight",
    ("PFGMMGibbs", "sample"): "a Gibbs sampler, not a MixtureModel: its draws are of the posterior (draws_)",
    ("user-StudentT-svi", "sample_weight"): "fitted by SVI: sample_weight is taken by engine='em' only",
}

#: test id -> the ppmix bug that makes it fail (strict xfails: fixing the bug turns them into failures to remove)
KNOWN_BUGS: dict[str, str] = {}

#: every test id built from the tables, to check that KNOWN_BUGS names real ones
_ALL_IDS: set[str] = set()


def offered(case_id: str, item: str) -> bool:
    return (case_id, item) not in NOT_OFFERED


def cases(items: tuple[str, ...] = ("",), variants: tuple[str, ...] = ("",), only: Callable[[Case], bool] = None):
    """``pytest.param(case_id, item, variant)`` for every offered combination, ids ``case-item-variant``."""
    params = []
    for case_id, case in CASES.items():
        if only is not None and not only(case):
            continue
        for item in items:
            if item and not offered(case_id, item):
                continue
            for variant in variants:
                test_id = "-".join(part for part in (case_id, item, variant) if part)
                _ALL_IDS.add(test_id)
                marks = [pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[test_id])] if test_id in KNOWN_BUGS else []
                params.append(pytest.param(case_id, item, variant, id=test_id, marks=marks))
    return params


# ---------------------------------------------------------------------------------------- helpers
@pytest.fixture(scope="module")
def fitted():
    """``fitted(case_id) -> (model, what fit returned, X, y)``, each case fitted once per module."""
    cache: dict[str, tuple] = {}

    def get(case_id: str) -> tuple:
        if case_id not in cache:
            case = CASES[case_id]
            x, y = case.data()
            model = case.make()
            returned = model.fit(x, **case.fit_options) if y is None else model.fit(x, y, **case.fit_options)
            cache[case_id] = (model, returned, x, y)
        return cache[case_id]

    return get


def fit(case: Case, model: Any, x: Any, y: Any, **options: Any) -> Any:
    """``model.fit`` on the case's data, with its fit options and ``options``."""
    options = {**case.fit_options, **options}
    return model.fit(x, **options) if y is None else model.fit(x, y, **options)


def call(case: Case, model: Any, method: str, x: Any, y: Any) -> Any:
    if method == "score" and case.score_needs_y:
        return model.score(x, y)
    return getattr(model, method)(x)


def as_tensors(case: Case, x: Any, y: Any) -> tuple[Any, Any]:
    if case.sequences:
        return [torch.as_tensor(s) for s in x], y
    return torch.as_tensor(x), None if y is None else torch.as_tensor(y)


def numpy(value: Any) -> np.ndarray:
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def check_rows(case: Case, method: str, out: Any, n_rows: int, array_type: type) -> None:
    """``out`` is one array of per-row results of ``method``, of type ``array_type``."""
    assert isinstance(out, array_type), f"{method} gave {type(out).__name__}, expected {array_type.__name__}"
    values = numpy(out)
    expected = (n_rows, case.n_columns) if method == "predict_proba" else (n_rows,)
    assert values.shape == expected, f"{method} has shape {values.shape}, expected {expected}"
    assert np.isfinite(values).all(), f"{method} gave non-finite values"
    if method == "predict_proba":
        assert ((values >= -1e-12) & (values <= 1 + 1e-12)).all(), (values.min(), values.max())  # to rounding
        np.testing.assert_allclose(values.sum(-1), 1.0, rtol=0, atol=1e-10)
    if method == "predict" and case.n_labels is not None:
        assert set(np.unique(values).tolist()) <= set(range(case.n_labels)), np.unique(values)


def assert_identical(a: Any, b: Any) -> None:
    if isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b)
        for u, v in zip(a, b):
            np.testing.assert_array_equal(numpy(u), numpy(v))
    else:
        np.testing.assert_array_equal(numpy(a), numpy(b))


def bad_x(case: Case, x: Any, kind: str) -> Any:
    """``x`` with a NaN, as 1-D arrays, or with one feature too many."""
    seqs = [np.array(s, dtype=float) for s in x] if case.sequences else [np.array(x, dtype=float)]
    if kind == "nan":
        seqs[0][0, 0] = np.nan
    elif kind == "1d":
        seqs = [s[:, 0] for s in seqs]
    elif kind == "wrong-features":
        seqs = [np.hstack([s, s[:, :1]]) for s in seqs]
    return seqs if case.sequences else seqs[0]


# ------------------------------------------------------------------------------------------ tests
def test_every_public_model_class_has_a_contract_case():
    names = {n: getattr(ppmix, n) for n in ppmix.__all__} | {n: getattr(ppmix.models, n) for n in ppmix.models.__all__}
    models = {c for c in names.values() if isinstance(c, type) and issubclass(c, MixtureModel)}
    covered = {type(case.make()) for case in CASES.values()}
    user_written = any(t.__module__ == __name__ for t in covered)
    missing = sorted(c.__name__ for c in models if c not in covered and not (c is MixtureModel and user_written))
    assert not missing, f"model classes without a contract case: {missing}"


def test_known_bugs_name_real_test_ids():
    assert set(KNOWN_BUGS) <= _ALL_IDS, set(KNOWN_BUGS) - _ALL_IDS


@pytest.mark.parametrize("case_id, item, variant", cases())
def test_fit_returns_the_model(case_id, item, variant, fitted):
    model, returned, _, _ = fitted(case_id)
    assert returned is model


@pytest.mark.parametrize("case_id, item, variant", cases(("fit_attributes",)))
def test_fit_records_n_iter_converged_and_history(case_id, item, variant, fitted):
    model, _, x, _ = fitted(case_id)
    assert isinstance(model.n_iter_, int) and model.n_iter_ >= 1, model.n_iter_
    assert isinstance(model.converged_, bool)
    assert isinstance(model.history_, list) and len(model.history_) >= 1
    assert all(isinstance(v, float) and math.isfinite(v) for v in model.history_), model.history_
    n_features = x[0].shape[1] if CASES[case_id].sequences else x.shape[1]
    assert model.n_features_in_ == n_features


@pytest.mark.parametrize("case_id, method, input_type", cases(PREDICTIONS, ("numpy", "tensor")))
def test_predictions_have_the_documented_shapes_types_and_finite_values(case_id, method, input_type, fitted):
    case = CASES[case_id]
    model, _, x, y = fitted(case_id)
    if input_type == "tensor":
        x, y = as_tensors(case, x, y)
    array_type = torch.Tensor if input_type == "tensor" else np.ndarray
    out = call(case, model, method, x, y)
    if method == "score":
        assert isinstance(out, float) and math.isfinite(out), out
    elif case.sequences and method == "score_samples":  # one log-likelihood per sequence
        check_rows(case, method, out, len(x), array_type)
    elif case.sequences:  # one array per sequence
        assert isinstance(out, list) and len(out) == len(x), type(out)
        for o, s in zip(out, x):
            check_rows(case, method, o, len(s), array_type)
    else:
        check_rows(case, method, out, len(x), array_type)


@pytest.mark.parametrize("case_id, item, variant", cases((*PREDICTIONS, "save_load", "to_arviz")))
def test_using_the_model_before_fit_is_a_clear_error(case_id, item, variant, tmp_path):
    case = CASES[case_id]
    x, y = case.data()
    model = case.make()
    with pytest.raises(ValueError, match="fit"):  # NotFittedError is a ValueError
        if item == "save_load":
            model.save(tmp_path / "model")
        elif item == "to_arviz":
            model.to_arviz()
        else:
            call(case, model, item, x, y)


@pytest.mark.parametrize("case_id, item, variant", cases(("save_load",)))
def test_save_load_round_trip_gives_identical_predictions(case_id, item, variant, fitted, tmp_path):
    case = CASES[case_id]
    model, _, x, y = fitted(case_id)
    path = model.save(tmp_path / "model")
    for load in (type(model).load, MixtureModel.load):
        loaded = load(path)
        assert type(loaded) is type(model)
        assert loaded.get_params() == model.get_params()
        for method in PREDICTIONS:
            if offered(case_id, method):
                assert_identical(call(case, loaded, method, x, y), call(case, model, method, x, y))


@pytest.mark.parametrize("case_id, item, variant", cases(("to_arviz",)))
def test_to_arviz_has_a_posterior_group(case_id, item, variant, fitted):
    import arviz as az

    model, *_ = fitted(case_id)
    idata = model.to_arviz()
    assert isinstance(idata, az.InferenceData)
    assert "posterior" in idata.groups()
    assert len(idata.posterior.data_vars) >= 1
    for name, values in idata.posterior.data_vars.items():
        assert values.dims[:2] == ("chain", "draw"), name


def _draw(case: Case, model: Any, x: Any) -> Any:
    """``model.sample`` as the case's kind takes it: of ``X`` (a MoE draws ``y`` given it), of two sequences of four
    steps, or of three rows."""
    if isinstance(model, MixtureOfExperts):
        return model.sample(x)
    return model.sample(2, length=4) if case.sequences else model.sample(3)


@pytest.mark.parametrize("case_id, item, variant", cases(("sample",)))
def test_sample_draws_data_of_the_fitted_shape_that_the_model_scores(case_id, item, variant, fitted):
    case = CASES[case_id]
    model, _, x, y = fitted(case_id)
    draws = _draw(case, model, x)
    if isinstance(model, MixtureOfExperts):
        assert numpy(draws["y"]).shape[0] == len(x) and np.isfinite(numpy(draws["y"])).all()
        return
    n_features = x[0].shape[1] if case.sequences else x.shape[1]
    drawn = numpy(draws["x"])
    assert drawn.shape == ((2, 4, n_features) if case.sequences else (3, n_features))
    assert np.isfinite(drawn).all()
    if case.sequences:  # every drawn sequence lies in the support: a finite log-likelihood
        assert np.isfinite(model.score(list(drawn)) if y is None else model.score(list(drawn), list(draws["y"])))
    elif offered(case_id, "score_samples"):
        assert np.isfinite(numpy(model.score_samples(drawn))).all()


BAD_X = ("nan-fit", "1d-fit", "nan-predict", "1d-predict", "wrong-features-predict")


@pytest.mark.parametrize("case_id, item, bad", cases(variants=BAD_X))
def test_bad_x_is_an_error_naming_x(case_id, item, bad, fitted):
    case = CASES[case_id]
    kind, when = bad.rsplit("-", 1)
    if when == "fit":
        x, y = case.data()
        model = case.make()
        with pytest.raises((ValueError, TypeError), match=r"\bX\b"):
            model.fit(bad_x(case, x, kind), **case.fit_options) if y is None else model.fit(
                bad_x(case, x, kind), y, **case.fit_options
            )
        return
    model, _, x, y = fitted(case_id)
    for method in PREDICTIONS:
        if offered(case_id, method):
            with pytest.raises((ValueError, TypeError), match=r"\bX\b"):
                call(case, model, method, bad_x(case, x, kind), y)


@pytest.mark.parametrize("case_id, item, variant", cases(only=lambda case: case.data()[1] is not None))
def test_labels_of_the_wrong_length_are_an_error_naming_y(case_id, item, variant):
    case = CASES[case_id]
    x, y = case.data()
    short = [y[0][:-1], *y[1:]] if case.sequences else y[:-1]
    with pytest.raises((ValueError, TypeError), match=r"\by\b"):
        case.make().fit(x, short, **case.fit_options)


def _as_strings(case: Case, y: Any) -> Any:
    """The labels written as words (``"no"``/``"yes"``), in the case's layout."""
    words = np.array(["no", "yes"])
    return [words[np.asarray(v, dtype=int)] for v in y] if case.sequences else words[np.asarray(y, dtype=int)]


@pytest.mark.parametrize(
    "case_id, item, variant",
    cases(only=lambda case: case.data()[1] is not None and case.n_labels == 2 and case.sequences),
)
def test_string_labels_are_a_clear_error_naming_y(case_id, item, variant):
    """Words as per-step labels of sequences: an error naming ``y`` (not numpy's bare 'could not convert string to
    float'). The row-wise classifiers take any two labels (tests/test_estimator.py)."""
    case = CASES[case_id]
    x, y = case.data()
    with pytest.raises((ValueError, TypeError), match=r"\by\b.*(0/1|\{0, 1\}|numeric|number)") as error:
        case.make().fit(x, _as_strings(case, y), **case.fit_options)
    assert "could not convert" not in str(error.value)


@pytest.mark.parametrize("seed", ["abc", 1.5, True])
@pytest.mark.parametrize("case_id, item, variant", cases())
def test_a_seed_that_is_not_an_integer_is_an_error_naming_seed(case_id, item, variant, seed):
    case = CASES[case_id]
    x, y = case.data()
    model = case.make()
    model.seed = seed  # as set_params would
    with pytest.raises(TypeError, match=r"\bseed\b must be an integer or None"):
        model.fit(x, **case.fit_options) if y is None else model.fit(x, y, **case.fit_options)


@pytest.mark.parametrize("case_id, item", [(c, i) for (c, i) in NOT_OFFERED], ids=[f"{c}-{i}" for c, i in NOT_OFFERED])
def test_not_offered_is_really_absent(case_id, item, fitted):
    """Each NOT_OFFERED entry is true: the attribute is missing or the call is refused."""
    case = CASES[case_id]
    model, _, x, y = fitted(case_id)
    if item == "fit_attributes":
        assert not any(hasattr(model, a) for a in ("n_iter_", "converged_", "history_"))
    elif item == "save_load":
        assert not hasattr(model, "save") and not hasattr(type(model), "load")
    elif item == "sample_weight":
        with pytest.raises((ValueError, TypeError), match="sample_weight"):
            fit(case, case.make(), x, y, sample_weight=np.ones(len(x)))
    elif item == "to_arviz" or not hasattr(model, item):
        assert not hasattr(model, item)
    else:
        with pytest.raises((ValueError, TypeError, NotImplementedError)):
            call(case, model, item, x, y)


# ------------------------------------------------------------------------------------ sample weights
def _repeated(case: Case, x: Any, weight: np.ndarray) -> Any:
    """Every row (sequence) of ``x`` repeated ``weight`` times: what integer sample weights stand for."""
    if case.sequences:
        return [s for s, count in zip(x, weight) for _ in range(int(count))]
    return np.repeat(np.asarray(x), weight, axis=0)


def _score(case: Case, model: Any, x: Any, y: Any, **options: Any) -> float:
    return model.score(x, y, **options) if case.score_needs_y else model.score(x, **options)


def _integer_weights(n: int) -> np.ndarray:
    weight = np.random.default_rng(1).integers(0, 4, n)
    weight[:2] = (1, 3)  # rows (sequences) of both planted clusters keep a positive weight
    return weight


#: cases whose family measures its variance floor on the rows of positive weight, not weighted (the default of
#: ``DensityFamily.data_scale`` without ``weight``): the Gaussian-mixture family's
UNWEIGHTED_SCALE = {"Mixture-gmm", "HMM-gmm"}


def assert_weights_are_repeated_rows(case_id: str, x: Any, y: Any) -> None:
    """scikit-learn's semantics: weight 2 is the row twice, weight 0 drops it; EM from one start gives the same
    parameters, objective history, (weighted) score and variance floor (the recorded data scale's) to rounding."""
    case = CASES[case_id]
    weight = _integer_weights(len(x))
    repeated = _repeated(case, x, weight)
    y_repeated = None if y is None else _repeated(case, y, weight)
    start = fit(case, case.make().set_params(max_iter=1, init_params="random"), repeated, y_repeated)._get_globals()
    fits = []
    for data, labels, options in ((x, y, {"sample_weight": weight}), (repeated, y_repeated, {})):
        model = case.make().set_params(tol=0.0, max_iter=3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            fit(case, model, data, labels, max_iter=1, **options)
            model._set_globals(start)
            fits.append(fit(case, model, data, labels, warm_start=True, **options))
    weighted, plain = fits
    if "floor" in getattr(plain, "_data_scale", {}) and case_id not in UNWEIGHTED_SCALE:
        assert_close(weighted._data_scale["floor"], plain._data_scale["floor"], rtol=1e-10, atol=0.0, msg="floor")
    for site, value in plain._get_globals().items():
        assert_close(weighted._get_globals()[site], value, rtol=1e-10, atol=1e-12, msg=site)
    assert_close(weighted.history_, plain.history_, rtol=1e-10)
    assert_close(
        _score(case, weighted, x, y, sample_weight=weight), _score(case, plain, repeated, y_repeated), rtol=1e-10
    )
    if not case.sequences:
        kept = weight > 0
        subset = (np.asarray(x)[kept], None if y is None else np.asarray(y)[kept])
        assert_close(
            _score(case, weighted, x, y, sample_weight=kept.astype(float)), _score(case, plain, *subset), rtol=1e-10
        )


@pytest.mark.parametrize("case_id, item, variant", cases(("sample_weight",)))
def test_integer_sample_weights_equal_repeated_rows_from_the_same_start(case_id, item, variant):
    assert_weights_are_repeated_rows(case_id, *CASES[case_id].data())


@pytest.mark.parametrize("case_id", ["GMM-diag", "GMM-full", "HMM"])
def test_integer_sample_weights_equal_repeated_rows_where_the_variance_floor_binds(case_id):
    """As above, on data where the variance floor is reached (a feature constant in one cluster), so the fit
    depends on the floor: the weighted rows' (for integer weights, the repeated rows' robust spread), not the
    floor of the rows as given."""
    if CASES[case_id].sequences:
        x, _, states = make_sequences(6, (4, 10), n_features=2)
        x = [np.where((z == 0)[:, None] & (np.arange(2) == 1), 0.5, s) for s, z in zip(x, states)]
    else:
        x, z = make_blobs(40, n_features=2)
        x[z == 0, 1] = 0.5
    assert_weights_are_repeated_rows(case_id, x, None)


BAD_WEIGHTS = {
    "negative": (lambda n: np.r_[-1.0, np.ones(n - 1)], "finite and non-negative"),
    "nan": (lambda n: np.r_[np.nan, np.ones(n - 1)], "finite and non-negative"),
    "too-short": (lambda n: np.ones(n - 1), "one entry per"),
    "all-zero": (lambda n: np.zeros(n), "not be zero for every"),
    "too-few-positive": (lambda n: np.r_[1.0, np.zeros(n - 1)], "positive weight"),
    "2-d": (lambda n: np.ones((n, 1)), "one entry per"),
}


@pytest.mark.parametrize(
    "case_id, item, bad",
    [  # one positive sequence is enough for an HMM (its frames are the rows k-means needs)
        p
        for p in cases(("sample_weight",), tuple(BAD_WEIGHTS))
        if not (CASES[p.values[0]].sequences and p.values[2] == "too-few-positive")
    ],
)
def test_bad_sample_weight_is_an_error_naming_it(case_id, item, bad):
    case = CASES[case_id]
    x, y = case.data()
    make_weight, message = BAD_WEIGHTS[bad]
    with pytest.raises(ValueError, match=rf"sample_weight must .*{message}"):
        fit(case, case.make(), x, y, sample_weight=make_weight(len(x)))


# ------------------------------------------------------------------------------ NUTS's potential
#: the cases whose ``engine="mcmc"`` runs on the traced Pyro program, not on ppmix's potential
#: (``likelihood_potential`` gives None): checked, so that the table cannot go stale
TRACED_PROGRAM = {
    "HSMM": "no hooks of the program's likelihood",
    "HSMM-poisson-nonparametric": "no hooks of the program's likelihood",
    "PFGMM": "the relevance indicators are discrete global sites",
    "PFHMM": "the relevance indicators are discrete global sites",
    "SupervisedGMM": "the relevance indicators are discrete global sites",
    "SupervisedHMM": "the relevance indicators are discrete global sites",
    "user-StudentT-svi": "a program of the user's own",
    "PFGMMGibbs": "a Gibbs sampler, no engine='mcmc'",
}


def _regression_sequences(n_sequences: int = 4, length: int = 8) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Sequences of two alternating linear-regression states on one input (slopes 2 and -1)."""
    rng = np.random.default_rng(0)
    inputs = [rng.normal(size=(length, 1)) for _ in range(n_sequences)]
    seqs = [
        np.where(np.arange(length)[:, None] // 4 % 2, -u + 3, 2 * u) + 0.3 * rng.normal(size=u.shape) for u in inputs
    ]
    return seqs, inputs


#: further ways onto ppmix's potential: frozen parameters (no coordinates) and regression emissions (inputs)
#: ``id -> (model, X, fit options, prepare_data options)``
POTENTIAL_VARIANTS: dict[str, Callable[[], tuple[Any, Any, dict, dict]]] = {
    "GMM-frozen": lambda: (
        GMM(2, covariance_type="full", **QUIET),
        _blobs()[0],
        {"fixed": {"weights": torch.tensor([0.4, 0.6], dtype=torch.float64)}},
        {},
    ),
    "HMM-frozen": lambda: (
        HMM(2, **QUIET),
        _sequences()[0],
        {"fixed": {"transition": torch.tensor([[0.8, 0.2], [0.3, 0.7]], dtype=torch.float64)}},
        {},
    ),
    "HMM-linear_regression": lambda: (
        HMM(2, emission="linear_regression", **QUIET),
        _regression_sequences()[0],
        {"inputs": _regression_sequences()[1]},
        {"inputs": _regression_sequences()[1]},
    ),
}


def _on_potential(case_id: str, fitted: Any) -> tuple[Any, Any]:
    """A copy of the case's model fitted (its globals are then the potential's to set) and its prepared data."""
    if case_id in POTENTIAL_VARIANTS:
        model, x, fit_options, data_options = POTENTIAL_VARIANTS[case_id]()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.fit(x, max_iter=5, **fit_options)
        return model, model.prepare_data(x, **data_options)
    model, _, x, y = fitted(case_id)
    model = copy.deepcopy(model)
    return model, (model.prepare_data(x) if y is None else model.prepare_data(x, y))


@pytest.mark.parametrize("case_id", [*CASES, *POTENTIAL_VARIANTS])
def test_the_gradient_of_the_nuts_potential_is_its_finite_difference(case_id, fitted):
    """For every model NUTS runs on ppmix's own potential (:mod:`ppmix.engines.potential`): at two chains jittered
    about the fit, in float64, the gradient :class:`FlatPotential` returns equals the central finite difference of
    the potential it returns, in four random coordinates (a likelihood outside the autograd graph leaves only the
    priors' gradient: a MixtureOfExperts once did). The others get no potential (``TRACED_PROGRAM``)."""
    if case_id in TRACED_PROGRAM:
        if hasattr(CASES[case_id].make(), "bayesian"):
            model, data = _on_potential(case_id, fitted)
            with local_params(), model.bayesian():
                assert likelihood_potential(model, data) is None
        return
    model, data = _on_potential(case_id, fitted)
    assert model.dtype == torch.float64
    gen = torch.Generator().manual_seed(0)
    with local_params(), model.bayesian():
        potential = likelihood_potential(model, data)
        assert potential is not None
        flat = FlatPotential(potential)
        fit_point = flat.pack({k: v[None] for k, v in potential.unconstrained(model._get_globals()).items()})
        # a forbidden transition's coordinate is -inf: any finite value is as good (it is masked)
        z = fit_point.clamp(-5.0, 5.0) + 0.1 * torch.randn(2, fit_point.shape[1], generator=gen, dtype=torch.float64)
        value, grad = flat(z)
        assert torch.isfinite(value).all()
        step = 1e-5
        for i in torch.randperm(z.shape[1], generator=gen)[:4].tolist():
            shift = torch.zeros_like(z)
            shift[:, i] = step
            difference = (flat(z + shift)[0] - flat(z - shift)[0]) / (2 * step)
            torch.testing.assert_close(
                grad[:, i], difference, rtol=1e-5, atol=1e-5, msg=lambda m, i=i: f"coordinate {i}: {m}"
            )
