"""Execute the tutorials in place and store them with their outputs: ``make tutorials``.

The notebooks are stored executed, so a reader browsing the repository sees their printed
results and figures. Each stored notebook records a digest of its cells' sources
(``metadata["ppmix"]["source_sha256"]``); ``tests/test_tutorials.py`` checks it, so a notebook
edited without re-running this script fails the tests instead of showing stale outputs.

Usage: ``python -m tests.tutorial_outputs [NOTEBOOK ...]`` (default: every tutorial).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

TUTORIALS = Path(__file__).resolve().parents[1] / "tutorials"
KERNEL_NAME = "python3"


def source_digest(nb: object) -> str:
    """SHA-256 of the cell types and sources of a notebook, in order (what its outputs were computed from)."""
    text = json.dumps([[cell["cell_type"], cell["source"]] for cell in nb["cells"]])  # type: ignore[index]
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def write_kernelspec(root: Path) -> Path:
    """A ``python3`` kernelspec under ``root/jupyter`` that runs this interpreter; returns ``root/jupyter`` (put it
    first on ``JUPYTER_PATH`` so no other ``python3`` kernel takes the run to another Python)."""
    spec_dir = root / "jupyter" / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python 3 ({sys.prefix})",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    return root / "jupyter"


def execute_in_place(path: Path) -> None:
    """Run ``path`` top to bottom and save it with its outputs and its source digest."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name=KERNEL_NAME, resources={"metadata": {"path": str(TUTORIALS)}}).execute()
    nb.metadata["ppmix"] = {"source_sha256": source_digest(nb)}
    nbformat.write(nb, path)


def main(argv: list[str]) -> int:
    paths = [Path(p) for p in argv] or sorted(TUTORIALS.glob("*.ipynb"))
    with tempfile.TemporaryDirectory() as root:
        os.environ["JUPYTER_PATH"] = os.pathsep.join(
            filter(None, [str(write_kernelspec(Path(root))), os.environ.get("JUPYTER_PATH")])
        )
        os.environ.pop("MPLBACKEND", None)  # the kernel's inline backend: figures are stored as PNG outputs
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # small problems, as the test runs them: one thread
            os.environ[var] = "1"
        for path in paths:
            print(f"executing {path.name}", flush=True)  # a development script's progress, not library output
            execute_in_place(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
