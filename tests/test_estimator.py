"""ppmix's estimators are scikit-learn estimators: scikit-learn's own checks, and what a user does with them.

``EXPECTED_FAILED_CHECKS`` is the one place a scikit-learn check is left out, each with the reason it
does not apply; ``parametrize_with_checks`` marks those strict xfails, so a check that starts passing
fails here until its entry is removed.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import sklearn
from sklearn.base import clone, is_classifier, is_regressor
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils import get_tags
from sklearn.utils.estimator_checks import parametrize_with_checks

from ppmix import GMM, HMM, PFGMM, PFHMM, MixtureModel, MixtureOfExperts, SupervisedGMM, SupervisedHMM
from ppmix.inference import PRESTO, RegularizedWeighting
from ppmix.models.baselines import (
    PCGMM,
    ClassSpecificGMM,
    PredictionOnlyGMM,
    RandomForestBaseline,
    SparseKMeansClassifier,
    TwoStep,
)
from tests.common import make_expert_data, make_labelled_blobs

QUIET = {"seed": 0, "progress": False}

#: one instance of every public estimator, as scikit-learn's checks take them
ESTIMATORS = [
    GMM(2, **QUIET),
    GMM(2, covariance_type="full", **QUIET),
    HMM(2, **QUIET),
    PFGMM(2, **QUIET),
    SupervisedGMM(2, **QUIET),
    PFHMM(2, **QUIET),
    SupervisedHMM(2, **QUIET),
    MixtureOfExperts(2, **QUIET),
    MixtureOfExperts(2, expert="logistic", **QUIET),
    MixtureOfExperts(2, expert="softmax", **QUIET),
    TwoStep(GMM(2, **QUIET)),
    ClassSpecificGMM(2, seed=0),
    PCGMM(2, num_steps=50, n_init=1, seed=0),
    PredictionOnlyGMM(2, num_steps=50, n_init=1, seed=0),
    RandomForestBaseline(n_estimators=20, random_state=0),
    SparseKMeansClassifier(2, seed=0),
    PRESTO(2, **QUIET),
    PRESTO(2, "linear", **QUIET),
    PRESTO(2, "softmax", **QUIET),
    RegularizedWeighting(2, **QUIET),
]

_TORCH_MODULE = {
    "check_no_attributes_set_in_init": "a torch.nn.Module (Pyro models are PyroModules) sets `training` in __init__",
}
_TORCH_DTYPE = {
    "check_parameters_default_constructible": "the `dtype` parameter's default is a torch.dtype (torch.float64), "
    "which scikit-learn's list of default types does not know; clone and set_params handle it",
}
_SEQUENCES = {
    name: "an HMM's X is a list of sequences (or a padded array with lengths); a plain 2-D array is refused"
    for name in (
        "check_fit_score_takes_y",
        "check_estimators_overwrite_params",
        "check_dont_overwrite_parameters",
        "check_estimators_fit_returns_self",
        "check_readonly_memmap_input",
        "check_n_features_in_after_fitting",
        "check_positive_only_tag_during_fit",
        "check_estimators_dtypes",
        "check_complex_data",
        "check_dtype_object",
        "check_estimators_empty_data_messages",
        "check_pipeline_consistency",
        "check_estimators_nan_inf",
        "check_estimator_sparse_tag",
        "check_estimator_sparse_array",
        "check_estimator_sparse_matrix",
        "check_estimators_pickle",
        "check_f_contiguous_array_estimator",
        "check_methods_sample_order_invariance",
        "check_methods_subset_invariance",
        "check_fit2d_1sample",
        "check_fit2d_1feature",
        "check_dict_unchanged",
        "check_fit_idempotent",
        "check_fit_check_is_fitted",
        "check_n_features_in",
        "check_fit1d",
        "check_fit2d_predict1d",
        "check_classifiers_one_label",
        "check_classifiers_one_label_sample_weights",
        "check_classifiers_classes",
        "check_classifiers_train",
        "check_classifiers_regression_target",
        "check_supervised_y_2d",
        "check_non_transformer_estimators_n_iter",
        "check_classifier_not_supporting_multiclass",
        "check_requires_y_none",
        "check_supervised_y_no_nan",
        "check_classifier_data_not_an_array",
        "check_classifiers_multilabel_output_format_predict",
        "check_classifiers_multilabel_output_format_predict_proba",
        "check_sample_weights_pandas_series",
        "check_sample_weights_not_an_array",
        "check_sample_weights_list",
        "check_all_zero_sample_weights_error",
        "check_sample_weights_shape",
        "check_sample_weights_not_overwritten",
        "check_sample_weight_equivalence_on_dense_data",
    )
}
_WEIGHTED_START = {
    "check_sample_weight_equivalence_on_dense_data": "weights equal repeated rows from the same start "
    "(tests/models/test_contract.py, to 1e-10); from the default start the weighted k-means start draws a weighted "
    "resample, whose random numbers are not those of the repeated rows, so the components may come out permuted",
}


_RW_WEIGHTED_START = {
    "check_sample_weight_equivalence_on_dense_data": "weights equal repeated rows from the same start "
    "(tests/inference/test_rw.py, to 1e-12); from the default start every restart initialises the learner on a "
    "weighted resample, whose random numbers are not those of the repeated rows, so the models may come out permuted",
}


_N_COMPONENTS_ALIAS = {
    name: "scikit-learn's check sets `n_components = 1` directly; a MixtureOfExperts' parameter is n_experts "
    "(>= 2) and its n_components a read-only alias"
    for name in (
        "check_dont_overwrite_parameters",
        "check_methods_sample_order_invariance",
        "check_methods_subset_invariance",
        "check_fit2d_1sample",
        "check_fit2d_1feature",
        "check_fit1d",
        "check_fit2d_predict1d",
    )
}
_MOE_ROWS = {
    name: "a MixtureOfExperts refuses data with no more rows than free parameters (10-20 rows here, 12-20 parameters)"
    for name in (
        "check_n_features_in_after_fitting",
        "check_estimators_dtypes",
        "check_estimators_nan_inf",
        "check_regressors_no_decision_function",
        "check_classifiers_one_label_sample_weights",
    )
}
_MOE_ROWS["check_sample_weight_equivalence_on_dense_data"] = (
    "a MixtureOfExperts refuses data with no more rows than free parameters (15 rows of 30 features here, 95 "
    "parameters); weights equal repeated rows in tests/models/test_contract.py and tests/models/test_moe.py"
)
_SOFTMAX_MOE_ROWS = {
    name: "softmax experts over the check's 3 classes have 2 rows of coefficients each: the check's 20-56 rows are "
    "no more than the free parameters (20-77), which a MixtureOfExperts refuses"
    for name in ("check_dtype_object", "check_f_contiguous_array_estimator", "check_dict_unchanged")
}
_INNER_N_ITER = {
    "check_non_transformer_estimators_n_iter": "max_iter is passed on to the inner models (LogisticRegression, "
    "GMMs); their n_iter_ are theirs",
}


def expected_failed_checks(estimator) -> dict[str, str]:
    """Check name -> why it does not apply to ``estimator``."""
    failures: dict[str, str] = {}
    if isinstance(estimator, MixtureModel):
        failures.update(_TORCH_MODULE)
        failures.update(_TORCH_DTYPE)
    if isinstance(estimator, GMM):
        failures.update(_WEIGHTED_START)
    if isinstance(estimator, PFGMM) and estimator.switch_prior == "auto":
        failures["check_sample_weight_equivalence_on_dense_data"] = (
            "switch_prior='auto' cross-validates with a row's copies in one fold (grouped folds), which folds drawn "
            "over repeated rows are not, and the weighted k-means start draws a weighted resample; weights equal "
            "repeated rows from the same start (tests/models/test_contract.py, to 1e-10) and the weighted "
            "cross-validation is the grouped one of the repeated rows (tests/models/test_pf_switch_selection.py)"
        )
    if isinstance(estimator, HMM):
        failures.update(_SEQUENCES)
        if not isinstance(estimator, PFHMM):  # the pf-HMMs have no partial_fit
            failures["check_estimators_partial_fit_n_features"] = _SEQUENCES["check_fit1d"]
    if isinstance(estimator, MixtureOfExperts):
        failures.update(_N_COMPONENTS_ALIAS)
        failures.update(_MOE_ROWS)
    if isinstance(estimator, MixtureOfExperts) and estimator.expert != "gaussian":
        del failures["check_estimators_dtypes"]  # its data set is large enough for two classifying experts
    if isinstance(estimator, MixtureOfExperts) and estimator.expert == "softmax":
        failures.update(_SOFTMAX_MOE_ROWS)
    if isinstance(estimator, RegularizedWeighting):
        failures.update(_RW_WEIGHTED_START)
    if isinstance(estimator, (TwoStep, ClassSpecificGMM)):
        failures.update(_INNER_N_ITER)
    return failures


@parametrize_with_checks(ESTIMATORS, expected_failed_checks=expected_failed_checks)
def test_scikit_learn_estimator_checks(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence warnings on scikit-learn's tiny data sets
        check(estimator)


# ------------------------------------------------------------------ what a scikit-learn user does
def _blobs(n: int = 120, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.normal(-4.0, 1.0, (n // 2, 2)), rng.normal(4.0, 1.0, (n - n // 2, 2))])


def test_get_params_set_params_and_clone():
    gmm = GMM(2, **QUIET)
    assert gmm.get_params(deep=True)["n_components"] == 2 and gmm.get_params(deep=False)["seed"] == 0
    assert gmm.set_params(n_components=3) is gmm and gmm.n_components == 3
    twin = clone(gmm)
    assert twin is not gmm and twin.get_params() == gmm.get_params() and not hasattr(twin, "engine_")
    with pytest.raises(ValueError, match="Invalid parameter 'n_component'"):
        gmm.set_params(n_component=3)
    # a subclass that forwards **kwargs lists its parent's parameters, less those it fixes
    params = SupervisedGMM(2, tol=1e-3).get_params()
    assert params["tol"] == 1e-3 and "switch_prior" not in params
    assert clone(SupervisedGMM(2, tol=1e-3)).tol == 1e-3


def test_estimator_kinds_follow_the_model():
    assert get_tags(GMM(2)).estimator_type == "density_estimator"
    assert is_classifier(PFGMM(2)) and is_classifier(PRESTO(2)) and is_regressor(PRESTO(2, "linear"))
    assert is_classifier(PRESTO(2, "softmax"))
    assert is_regressor(MixtureOfExperts(2)) and is_classifier(MixtureOfExperts(2, expert="logistic"))
    assert not hasattr(MixtureOfExperts(2), "predict_proba") and hasattr(
        MixtureOfExperts(2, expert="logistic"), "predict_proba"
    )
    assert not hasattr(PFHMM(2), "partial_fit") and hasattr(HMM(2), "partial_fit")


@pytest.mark.parametrize("expert", ["gaussian", "poisson", "logistic", "softmax"])
def test_score_and_tags_follow_the_target_coding(expert):
    """The coding of ``y`` the model holds (:class:`~ppmix.models._target.TargetCoding`) gives scikit-learn's face:
    a regressor scores R² of ``predict``, a classifier its accuracy on the labels it records (any labels), and the
    tags say which (a binary classifier is not multi-class)."""
    from sklearn.metrics import accuracy_score, r2_score

    x, y = make_expert_data(120, 1, "logistic" if expert == "softmax" else expert, seed=1)
    if expert in ("logistic", "softmax"):
        y = np.array(["no", "yes"])[y.astype(int)]
    moe = MixtureOfExperts(2, expert=expert, n_init=1, split_merge=0, polish=False, **QUIET).fit(x, y)
    tags = get_tags(moe)
    if expert in ("gaussian", "poisson"):
        assert tags.estimator_type == "regressor" and tags.target_tags.required
        assert moe.score(x, y) == pytest.approx(r2_score(y, np.asarray(moe.predict(x))), rel=1e-12)
    else:
        assert tags.estimator_type == "classifier" and tags.classifier_tags.multi_class == (expert == "softmax")
        assert list(moe.classes_) == ["no", "yes"]
        assert moe.score(x, y) == pytest.approx(accuracy_score(y, moe.predict(x)), rel=1e-12)


def test_binary_label_models_score_accuracy_and_are_not_multiclass():
    """The pf models and the label baselines hold the binary coding: ``score`` is the accuracy, the tags a binary
    classifier's; ``TargetCoding`` refuses a kind it does not know, naming the kinds."""
    from sklearn.metrics import accuracy_score

    from ppmix.models._target import TargetCoding

    x, y = make_labelled_blobs(80, 3, seed=2)
    labels = np.array(["a", "b"])[y.astype(int)]
    for model in (PFGMM(2, switch_prior=0.3, n_restarts=1, **QUIET), RandomForestBaseline(20, random_state=0)):
        model.fit(x, labels)
        tags = get_tags(model)
        assert tags.estimator_type == "classifier" and not tags.classifier_tags.multi_class
        assert model.score(x, labels) == pytest.approx(accuracy_score(labels, model.predict(x)), rel=1e-12)
    with pytest.raises(ValueError, match="kind must be one of"):
        TargetCoding("ordinal")


def test_pipeline_and_fit_predict():
    x = _blobs()
    pipe = make_pipeline(StandardScaler(), GMM(2, **QUIET)).fit(x)
    labels = pipe.predict(x)
    assert set(labels[:60]) != set(labels[60:]) and len(set(labels[:60])) == 1
    direct = GMM(2, **QUIET).fit_predict(StandardScaler().fit_transform(x))
    np.testing.assert_array_equal(direct, labels)


def test_grid_search_over_n_components_picks_the_planted_number():
    search = GridSearchCV(GMM(1, **QUIET), {"n_components": [1, 2, 3]}, cv=3).fit(_blobs(240))
    assert search.best_params_["n_components"] >= 2  # held-out log-likelihood prefers a mixture to one Gaussian
    assert (
        isinstance(search.best_estimator_, GMM)
        and search.best_estimator_.n_components == search.best_params_["n_components"]
    )


def test_pf_models_in_cross_validation_and_grid_search():
    x, y = make_labelled_blobs(120, n_features=4)
    scores = cross_val_score(PFGMM(2, switch_prior=0.5, max_iter=30, **QUIET), x, y, scoring="roc_auc", cv=3, n_jobs=2)
    assert scores.shape == (3,) and scores.min() > 0.8
    search = GridSearchCV(PFGMM(2, max_iter=30, **QUIET), {"switch_prior": [0.1, 0.5]}, scoring="roc_auc", cv=3)
    assert search.fit(x, y).best_score_ > 0.8


@pytest.mark.parametrize(
    "labels",
    [np.array(["ham", "spam"]), np.array([-1, 1]), np.array([False, True]), np.array([3.0, 7.0])],
    ids=["strings", "plus-minus-one", "booleans", "numbers"],
)
def test_binary_classifiers_take_any_two_labels(labels, tmp_path):
    x, codes = make_labelled_blobs(80, n_features=3)
    y = labels[codes.astype(int)]
    reference = PFGMM(2, switch_prior=0.5, max_iter=30, **QUIET).fit(x, codes)
    model = PFGMM(2, switch_prior=0.5, max_iter=30, **QUIET).fit(x, y)
    np.testing.assert_array_equal(model.classes_, labels)
    np.testing.assert_array_equal(model.predict(x), labels[reference.predict(x)])
    np.testing.assert_allclose(model.predict_proba(x), reference.predict_proba(x))
    assert model.score(x, y) == reference.score(x, codes) > 0.8  # accuracy, the classifier's score
    loaded = PFGMM.load(model.save(tmp_path / "pf"))
    np.testing.assert_array_equal(loaded.classes_, labels)
    np.testing.assert_array_equal(loaded.predict(x), model.predict(x))


def test_missing_labels_and_a_third_class():
    x, codes = make_labelled_blobs(80, n_features=3)
    y = np.where(codes == 1, "spam", "ham").astype(object)
    y[::4] = None  # missing labels: the rows count for the features only
    model = PFGMM(2, switch_prior=0.5, max_iter=30, **QUIET).fit(x, y)
    assert model.classes_.tolist() == ["ham", "spam"]
    y[1] = "eggs"
    with pytest.raises(ValueError, match="Only binary classification is supported.*found 3"):
        PFGMM(2, **QUIET).fit(x, y)
    assert set(model.predict(x)) == {"ham", "spam"}


def test_mixture_of_experts_scores_as_its_kind():
    x, y = make_expert_data(200, expert="gaussian")
    moe = MixtureOfExperts(2, n_init=3, **QUIET).fit(x, y)
    assert moe.score(x, y) == pytest.approx(1 - ((y - moe.predict(x)) ** 2).sum() / ((y - y.mean()) ** 2).sum())
    x, y = make_expert_data(200, expert="logistic")
    labels = np.where(y == 1, "yes", "no")
    clf = MixtureOfExperts(2, expert="logistic", n_init=3, **QUIET).fit(x, labels)
    assert clf.classes_.tolist() == ["no", "yes"] and set(clf.predict(x)) <= {"no", "yes"}
    assert clf.score(x, labels) == pytest.approx(np.mean(clf.predict(x) == labels))


@pytest.mark.parametrize("routing", [False, True], ids=["fit-params", "metadata-routing"])
def test_grid_search_passes_sample_weight_to_every_fit(routing):
    """GridSearchCV(GMM).fit(X, sample_weight=w) fits every split and the refit with the weights: the refit equals
    a weighted fit on all rows, and differs from the unweighted one (the cluster on the right counts 3 times)."""
    x = _blobs(240)
    weight = np.where(x[:, 0] > 0, 3.0, 1.0)
    with sklearn.config_context(enable_metadata_routing=routing):
        model = GMM(2, **QUIET)
        if routing:
            model = model.set_fit_request(sample_weight=True).set_score_request(sample_weight=True)
        search = GridSearchCV(model, {"covariance_type": ["diag"]}, cv=3).fit(x, sample_weight=weight)
    direct = GMM(2, covariance_type="diag", **QUIET).fit(x, sample_weight=weight)
    plain = GMM(2, covariance_type="diag", **QUIET).fit(x)
    np.testing.assert_allclose(search.best_estimator_.means_.numpy(), direct.means_.numpy(), rtol=1e-10)
    np.testing.assert_allclose(sorted(search.best_estimator_.weights_.tolist()), [0.25, 0.75], atol=0.01)
    np.testing.assert_allclose(sorted(plain.weights_.tolist()), [0.5, 0.5], atol=0.01)
