"""Batches of variable-length sequences, as every sequence model in ppmix receives them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ppmix._validation import InvalidDataError, check_matrix, resolve_device

__all__ = ["SequenceBatch", "as_sequence_batch"]


@dataclass
class SequenceBatch:
    """``B`` sequences padded to a common length ``T``.

    Attributes
    ----------
    x : Tensor (B, T, D)
        Observations; a padded step holds its sequence's last observation (a value every family's
        density accepts, so the masked steps of a Pyro program stay finite, and their gradients zero).
    lengths : LongTensor (B,)
        Number of valid steps of each sequence (all >= 1).
    y : Tensor (B, T), optional
        Per-step labels; NaN where a label is missing (and at padded steps).
    feature_names : list of str, optional
    inputs : Tensor (B, T, P), optional
        Per-step inputs (covariates) of an input-driven chain; a padded step repeats its sequence's last.
    """

    x: torch.Tensor
    lengths: torch.Tensor
    y: torch.Tensor | None = None
    feature_names: list[str] | None = None
    inputs: torch.Tensor | None = None

    @property
    def n_sequences(self) -> int:
        return int(self.x.shape[0])

    @property
    def max_length(self) -> int:
        return int(self.x.shape[1])

    @property
    def n_features(self) -> int:
        return int(self.x.shape[2])

    @property
    def mask(self) -> torch.Tensor:
        """``(B, T)`` boolean: True at valid steps."""
        steps = torch.arange(self.max_length, device=self.lengths.device)
        return steps[None, :] < self.lengths[:, None]

    @property
    def frames(self) -> torch.Tensor:
        """All valid steps stacked, ``(sum(lengths), D)``, sequence by sequence in time order."""
        return self.x[self.mask]

    def unpad(self, values: torch.Tensor) -> list[torch.Tensor]:
        """Split a ``(B, T, ...)`` tensor into a list of its valid ``(length_b, ...)`` parts."""
        return [values[b, : int(n)] for b, n in enumerate(self.lengths.tolist())]


def _float_labels(values: Any, name: str = "y") -> np.ndarray:
    """Labels as float64 (None -> NaN); non-numeric labels are refused (as PFGMM refuses them)."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu()
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must hold numeric labels 0/1 (NaN for missing)") from None


def _check_labels(labels: Any, lengths: list[int], name: str = "y") -> list[np.ndarray]:
    if len(labels) != len(lengths):
        raise ValueError(f"{name} has {len(labels)} sequences but X has {len(lengths)}")
    out = []
    for b, (lab, n) in enumerate(zip(labels, lengths)):
        arr = _float_labels(lab, f"{name}[{b}]").reshape(-1)
        if arr.shape[0] != n:
            raise ValueError(f"{name}[{b}] has {arr.shape[0]} labels but sequence {b} has {n} steps")
        observed = arr[~np.isnan(arr)]
        if not np.isin(observed, (0.0, 1.0)).all():
            raise ValueError(f"{name}[{b}] has labels outside {{0, 1}} (use NaN for a missing label)")
        out.append(arr)
    return out


def _check_sequence_ids(frame: Any, column: str) -> None:
    """Every row of ``frame`` must name its sequence: a missing id (NaN, None, NaT) is refused, naming the row."""
    missing = frame[column].isna().to_numpy()
    if missing.any():
        first = int(np.argmax(missing))
        raise InvalidDataError(
            f"sequence_column {column!r} has {int(missing.sum())} missing sequence id(s) (NaN or None), the first "
            f"in row {first} (index {frame.index[first]!r}); every row needs the id of its sequence"
        )


def as_sequence_batch(
    X: Any,
    y: Any = None,
    *,
    lengths: Any = None,
    sequence_column: str | None = None,
    dtype: torch.dtype = torch.float64,
    device: Any = None,
    n_features: int | None = None,
    feature_names: list[str] | None = None,
    allow_missing: bool = False,
    code_frame: Any = None,
) -> SequenceBatch:
    """Validate sequences given in any of the supported forms and pad them into a batch (``allow_missing``: NaN
    entries kept, as :func:`~ppmix._validation.check_matrix` keeps them, a step with every value missing too).

    Parameters
    ----------
    X : list of 2-D arrays/tensors, a padded ``(B, T, D)`` array with ``lengths``, or a
        pandas DataFrame with a ``sequence_column`` (rows in time order within a sequence).
    y : per-step binary labels in the same layout (list of 1-D arrays, ``(B, T)`` array,
        or the name of a DataFrame column); NaN marks a missing label.
    lengths : valid lengths when ``X`` is padded.
    n_features : expected number of features (at prediction time).
    feature_names : column names seen in fit (at prediction time): DataFrame columns in
        another order are reordered to match, other names are refused.
    code_frame : what each DataFrame sequence becomes before it is read as numbers (as in
        :func:`~ppmix._validation.check_matrix`).

    Raises
    ------
    ValueError
        A missing id in ``sequence_column`` (an :class:`~ppmix._validation.InvalidDataError`), an
        empty list, a zero-length sequence, mismatched feature counts, NaN/inf in ``X``,
        labels outside {0, 1}, or lengths that do not fit the padded array.

    Examples
    --------
    >>> import numpy as np
    >>> batch = as_sequence_batch([np.zeros((3, 2)), np.ones((5, 2))])
    >>> tuple(batch.x.shape), batch.lengths.tolist()
    ((2, 5, 2), [3, 5])
    """
    names = None
    if hasattr(X, "columns") and hasattr(X, "groupby"):  # pandas DataFrame
        if sequence_column is None or sequence_column not in X.columns:
            raise ValueError(f"a DataFrame X needs its sequence-id column; sequence_column={sequence_column!r}")
        _check_sequence_ids(X, sequence_column)
        label_column = y if isinstance(y, str) else None
        features = [c for c in X.columns if c not in (sequence_column, label_column)]
        names = [str(c) for c in features]
        groups = [g for _, g in X.groupby(sequence_column, sort=False)]
        X = [g[features] for g in groups]
        y = [_float_labels(g[label_column].to_numpy(), f"y={label_column!r}") for g in groups] if label_column else y
    if lengths is not None:
        padded = X.detach().cpu().numpy() if isinstance(X, torch.Tensor) else np.asarray(X)
        if padded.ndim != 3:
            raise ValueError(f"a padded X must be 3-D (n_sequences, max_length, n_features); got {padded.ndim}-D")
        lens = np.asarray(lengths.cpu() if isinstance(lengths, torch.Tensor) else lengths).reshape(-1)
        if lens.shape[0] != padded.shape[0]:
            raise ValueError(f"lengths has {lens.shape[0]} entries but X has {padded.shape[0]} sequences")
        if (lens < 1).any() or (lens > padded.shape[1]).any() or (lens != np.round(lens)).any():
            raise ValueError(f"lengths must be integers in 1..{padded.shape[1]} (no zero-length sequence)")
        X = [padded[b, : int(n)] for b, n in enumerate(lens)]
        if y is not None and not isinstance(y, (list, tuple)):
            y_arr = _float_labels(y)
            y = [y_arr[b, : int(n)] for b, n in enumerate(lens)]
    if not isinstance(X, (list, tuple)):
        raise TypeError("X must be a list of (length, n_features) arrays, a padded array with lengths, or a DataFrame")
    if len(X) == 0:
        raise ValueError("X is an empty list of sequences")
    seqs = []
    for b, seq in enumerate(X):
        if hasattr(seq, "__len__") and len(seq) == 0:
            raise ValueError(f"X[{b}] is a sequence of length 0")
        tensor, seq_names = check_matrix(
            seq,
            f"X[{b}]",
            dtype=dtype,
            device=device,
            n_features=n_features,
            feature_names=feature_names,
            allow_missing=allow_missing,
            allow_empty_rows=allow_missing,
            code_frame=code_frame,
        )
        if seqs and tensor.shape[1] != seqs[0].shape[1]:
            raise ValueError(f"X[{b}] has {tensor.shape[1]} features but X[0] has {seqs[0].shape[1]}")
        names = names or seq_names
        seqs.append(tensor)
    lens_list = [int(s.shape[0]) for s in seqs]
    target = resolve_device(device) if device is not None else seqs[0].device
    x = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True).to(target)
    for b, n in enumerate(lens_list):
        x[b, n:] = x[b, n - 1]
    batch_y = None
    if y is not None:
        labels = _check_labels(y, lens_list)
        padded_y = np.full((len(seqs), max(lens_list)), np.nan)
        for b, lab in enumerate(labels):
            padded_y[b, : lab.shape[0]] = lab
        batch_y = torch.as_tensor(padded_y, dtype=dtype, device=target)
    lengths_t = torch.as_tensor(lens_list, dtype=torch.long, device=target)
    return SequenceBatch(x=x, lengths=lengths_t, y=batch_y, feature_names=names)
