"""JSON reports (summaries, reproduction results) that any JSON parser reads: no NaN or infinity."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

__all__ = ["strict_json", "write_json"]


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite_or_none(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(item) for item in value]
    return value


def strict_json(report: Any, *, indent: int | None = 2, default: Callable[[Any], Any] | None = None) -> str:
    """``report`` as standard JSON: a NaN or infinite float becomes ``null`` (JSON has no such numbers, and
    Python's ``json`` would write the non-standard ``NaN``); other values as ``json.dumps`` writes them
    (``default`` converts what it cannot).

    Examples
    --------
    >>> strict_json({"mean_log_likelihood": float("nan"), "n": [1, 2.5, float("inf")]}, indent=None)
    '{"mean_log_likelihood": null, "n": [1, 2.5, null]}'
    """
    return json.dumps(_finite_or_none(report), indent=indent, allow_nan=False, default=default)


def write_json(path: str | Path, report: Any) -> Path:
    """Write ``report`` to ``path`` as :func:`strict_json`; returns the path."""
    path = Path(path)
    path.write_text(strict_json(report) + "\n")
    return path
