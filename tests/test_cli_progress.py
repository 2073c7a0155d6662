"""The progress executor behind ``ppmix dmoe``'s progress lines, and the reproduce report formatter."""

from __future__ import annotations

import os
from pathlib import Path

from ppmix._cli_reproduce import ProgressExecutor, format_report
from ppmix.parallel import _process_pool, run_tasks


def _die_once(item: tuple[str, int]) -> int:
    """Kill the worker the first time (a marker file remembers), then return the value squared."""
    marker, value = item
    if value == 2 and not Path(marker).exists():
        Path(marker).write_text("died")
        os._exit(1)
    return value * value


def test_tasks_tick_and_a_dead_worker_is_replaced(tmp_path):
    ticks = []
    executor = ProgressExecutor(_process_pool(2), lambda: ticks.append(1), renew=lambda: _process_pool(2))
    try:
        items = [(str(tmp_path / "marker"), v) for v in range(4)]
        results = run_tasks(_die_once, items, executor=executor, retries=1)
    finally:
        executor.shutdown()
    assert [r.value for r in results] == [0, 1, 4, 9]
    assert len(ticks) == 4 and (tmp_path / "marker").exists()


def test_an_executor_not_ours_passes_errors_on_and_is_not_shut_down():
    from ppmix.parallel import _InlineExecutor

    ticks = []
    executor = ProgressExecutor(_InlineExecutor(), lambda: ticks.append(1))
    assert [r.value for r in run_tasks(abs, [-1, -2], executor=executor)] == [1, 2] and len(ticks) == 2
    executor.shutdown()  # a no-op on an executor the caller owns


def test_format_report_of_an_unknown_shape_falls_back_to_its_scalars_and_tables():
    text = format_report("pf-hmm", {"seconds": 1.5, "rows": [{"a": 1, "b": None}], "files": ["x.json"]})
    assert text.splitlines() == ["seconds: 1.500", "rows:", "a  b", "-  -", "1  -", "", "written: x.json"]
