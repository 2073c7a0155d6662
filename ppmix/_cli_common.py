"""Pieces shared by the ``ppmix`` command's modules (:mod:`ppmix.cli`, :mod:`ppmix._cli_fit`,
:mod:`ppmix._cli_reproduce`): the user-error type and the CSV reader."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

__all__ = ["UserError", "read_csv"]


class UserError(Exception):
    """A mistake in the command line or its input files: reported as one ``ppmix: error:`` line, exit code 2."""


def read_csv(path: Path, text_columns: Sequence[str] = (), named: Mapping[str, str | None] | None = None):
    """The CSV file at ``path`` as a DataFrame with at least one row, or a :class:`UserError`.

    ``named`` maps command-line options to the columns they name (``{"--target": "y"}``): a
    missing one is reported first, naming the option. Every column must be numeric except
    those in ``text_columns`` (e.g. a label column whose classes are strings).
    """
    import pandas as pd

    if path.is_dir():
        raise UserError(f"data file {path} is a directory, not a CSV file")
    if not path.is_file():
        raise UserError(f"data file {path} not found")
    try:
        frame = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise UserError(f"data file {path} is empty; it needs a header row and data rows") from None
    except (pd.errors.ParserError, UnicodeDecodeError, OSError) as err:
        raise UserError(f"data file {path} is not a readable CSV file: {err}") from None
    if frame.empty:
        raise UserError(f"data file {path} has a header but no data rows")
    for option, column in (named or {}).items():
        if column is not None and column not in frame.columns:
            columns = ", ".join(map(str, frame.columns))
            raise UserError(f"{option}: no column {column!r} in data file {path} (columns: {columns})")
    non_numeric = [
        str(c) for c in frame.columns if str(c) not in text_columns and not pd.api.types.is_numeric_dtype(frame[c])
    ]
    if non_numeric:
        raise UserError(f"data file {path} has non-numeric columns {non_numeric}; drop them first")
    return frame
