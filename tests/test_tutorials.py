"""Execute every notebook in ``tutorials/`` and fail on any cell error.

Each tutorial checks its own claims with ``assert`` in its last cells, so a wrong
claim fails here the same way a crashing cell does.

The kernel is this interpreter: the test writes a temporary kernelspec named
``python3``. Its ``argv[0]`` is ``sys.executable``, and it sits in a directory put first
on ``JUPYTER_PATH``. So a ``python3`` kernelspec elsewhere (user-level, system-wide or
from another environment) cannot take the run to another Python. No
``ipykernel install`` step is needed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient

from tests.tutorial_outputs import KERNEL_NAME, source_digest, write_kernelspec

TUTORIALS = Path(__file__).resolve().parents[1] / "tutorials"
NOTEBOOKS = sorted(TUTORIALS.glob("*.ipynb"))


@pytest.fixture
def venv_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A ``python3`` kernelspec that runs ``sys.executable``, first on ``JUPYTER_PATH``."""
    previous = os.environ.get("JUPYTER_PATH")
    monkeypatch.setenv("JUPYTER_PATH", os.pathsep.join(filter(None, [str(write_kernelspec(tmp_path)), previous])))
    # the kernel inherits this process's environment
    monkeypatch.setenv("MPLBACKEND", "Agg")
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # small problems; no oversubscription under xdist
        monkeypatch.setenv(var, "1")
    resolved = KernelSpecManager().get_kernel_spec(KERNEL_NAME)
    assert resolved.argv[0] == sys.executable, f"kernelspec {KERNEL_NAME!r} resolves to {resolved.argv}"
    return KERNEL_NAME


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_saved_with_current_outputs(path: Path) -> None:
    """Valid nbformat v4, a python3 kernelspec, stored executed top to bottom without errors (readers browsing the
    repository see the outputs and figures), from the cells as they are now (``make tutorials`` re-runs it)."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.get("kernelspec", {}).get("name") == KERNEL_NAME
    recorded = nb.metadata.get("ppmix", {}).get("source_sha256")
    assert recorded == source_digest(nb), f"{path.name}: its outputs are not from its current cells; run make tutorials"
    counts = [c.execution_count for c in nb.cells if c.cell_type == "code"]
    assert counts == list(range(1, len(counts) + 1)), f"{path.name}: not executed top to bottom once: {counts}"
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, f"{path.name}: stored with errors"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path: Path, venv_kernel: str) -> None:
    nb = nbformat.read(path, as_version=4)
    # first, in memory only: prove the kernel is this environment's interpreter
    check = nbformat.v4.new_code_cell(f"import sys\nassert sys.prefix == {sys.prefix!r}, sys.prefix")
    nb.cells.insert(0, check)
    client = NotebookClient(
        nb,
        timeout=600,
        kernel_name=venv_kernel,
        resources={"metadata": {"path": str(TUTORIALS)}},
    )
    client.execute()  # raises CellExecutionError (with the cell's traceback) on any error
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
