"""Sequence batches: every accepted layout gives the same padded batch; bad input is named."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from ppmix.models._sequences import as_sequence_batch
from tests.common import assert_close

RNG = np.random.default_rng(0)
SEQS = [RNG.normal(size=(n, 3)) for n in (4, 7, 1)]
LABELS = [np.array([0, 1, np.nan, 1]), np.array([1, 1, 0, 0, np.nan, 1, 0]), np.array([np.nan])]


def padded():
    """The reference batch: a padded step holds its sequence's last frame (valid for every family's density)."""
    x = np.zeros((3, 7, 3))
    y = np.full((3, 7), np.nan)
    for b, (s, lab) in enumerate(zip(SEQS, LABELS)):
        x[b, : len(s)] = s
        x[b, len(s) :] = s[-1]
        y[b, : len(lab)] = lab
    return x, y


def frame():
    rows = [
        {"seq": f"s{b}", "a": s[t, 0], "b": s[t, 1], "c": s[t, 2], "label": lab[t]}
        for b, (s, lab) in enumerate(zip(SEQS, LABELS))
        for t in range(len(s))
    ]
    return pd.DataFrame(rows)


def assert_matches_reference(batch):
    x, y = padded()
    assert batch.lengths.tolist() == [4, 7, 1]
    assert_close(batch.x, x, rtol=0, atol=0)
    assert_close(batch.y, y, rtol=0, atol=0)
    assert batch.mask.sum() == 12
    assert_close(batch.frames, np.concatenate(SEQS), rtol=0, atol=0)
    for part, seq in zip(batch.unpad(batch.x), SEQS):
        assert_close(part, seq, rtol=0, atol=0)


def test_list_of_arrays():
    assert_matches_reference(as_sequence_batch(SEQS, LABELS))


def test_list_of_tensors():
    assert_matches_reference(as_sequence_batch([torch.as_tensor(s) for s in SEQS], LABELS))


def test_padded_with_lengths():
    x, y = padded()
    assert_matches_reference(as_sequence_batch(x, y, lengths=[4, 7, 1]))
    assert_matches_reference(as_sequence_batch(torch.as_tensor(x), torch.as_tensor(y), lengths=torch.tensor([4, 7, 1])))


def test_dataframe_with_sequence_column():
    batch = as_sequence_batch(frame(), "label", sequence_column="seq")
    assert_matches_reference(batch)
    assert batch.feature_names == ["a", "b", "c"]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"X": []}, "empty list"),
        ({"X": [np.zeros((3, 2)), np.zeros((0, 2))]}, r"X\[1\] is a sequence of length 0"),
        ({"X": [np.zeros((3, 2)), np.zeros((3, 3))]}, r"X\[1\] has 3 features but X\[0\] has 2"),
        ({"X": [np.array([[np.nan, 1.0]])]}, r"X\[0\] contains NaN"),
        ({"X": [np.zeros((2, 1))], "y": [np.array([0, 2])]}, "outside"),
        ({"X": [np.zeros((2, 1))], "y": [np.array([0])]}, "1 labels but sequence 0 has 2"),
        ({"X": np.zeros((2, 3, 1)), "lengths": [3, 0]}, "lengths must be integers"),
        ({"X": np.zeros((2, 3, 1)), "lengths": [3]}, "lengths has 1 entries"),
        ({"X": frame()}, "sequence-id column"),
        ({"X": [np.zeros((2, 2))], "n_features": 3}, "fitted with 3"),
    ],
    ids=[
        "empty",
        "zero-length",
        "features",
        "nan",
        "labels",
        "label-length",
        "lengths",
        "lengths-count",
        "df",
        "nfeat",
    ],
)
def test_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        as_sequence_batch(**kwargs)


def test_wrong_container_type():
    with pytest.raises(TypeError, match="list of"):
        as_sequence_batch(np.zeros((3, 2)))
