"""Every ```python block of README.md runs.

The rule: each block is one test and runs on its own, in a fresh namespace, so every block
must be self-contained and copy-pasteable (it imports what it uses and makes its own data at
its top). A block runs as a script would: ``__name__ == "__main__"``, so code under an
``if __name__ == "__main__":`` guard (needed around process pools, which start their workers
by spawn) runs too. It runs with the working directory set to a fresh temporary directory, so
files it writes (``gmm.save("my_gmm")``, shards) land there; Pyro's parameter store is
cleared and its seed fixed before each block (``tests/conftest.py``). A block fails the test
if it raises; warnings are allowed. Blocks fenced as anything but ``python`` (``bash`` for
shell commands) are not run. The blocks keep their data small and their engines short
(``num_steps=50`` for SVI, ``num_samples=5, warmup_steps=5`` for NUTS), so the whole file
runs in about a minute on two cores.
"""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$", re.MULTILINE)


def readme_blocks(text: str) -> list[tuple[str, str, int]]:
    """``(section, code, line)`` of every ```python block, in order; ``section`` is the nearest heading above."""
    headings = [(m.start(), m.group(2)) for m in _HEADING.finditer(text)]
    blocks = []
    for match in _FENCE.finditer(text):
        if match.group(1).strip().lower() not in ("python", "py"):
            continue
        # a heading-like line inside an earlier code block (e.g. "# comment") must not count as a heading
        section = "preamble"
        for start, title in headings:
            if start > match.start():
                break
            if not _inside_fence(text, start):
                section = title
        line = text.count("\n", 0, match.start(2)) + 1
        blocks.append((section, match.group(2), line))
    return blocks


def _inside_fence(text: str, position: int) -> bool:
    return any(m.start() < position < m.end() for m in _FENCE.finditer(text))


BLOCKS = readme_blocks(README.read_text(encoding="utf-8"))


def _block_id(section: str, line: int) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", section.lower()).strip("-")
    return f"{slug}-L{line}"


def test_readme_has_python_blocks():
    sections = {section for section, _, _ in BLOCKS}
    assert len(BLOCKS) >= 8, BLOCKS
    assert {"Gaussian mixtures", "Hidden Markov models", "Regularized Weighting"} <= sections


def test_block_extraction_skips_shell_blocks_and_names_sections():
    text = "# T\n## A\n```bash\nmake test\n```\n## B\n```python\n# not a heading\nx = 1\n```\n```python\ny = 2\n```\n"
    blocks = readme_blocks(text)
    assert [(section, code) for section, code, _ in blocks] == [("B", "# not a heading\nx = 1\n"), ("B", "y = 2\n")]
    assert [line for _, _, line in blocks] == [8, 12]


@pytest.mark.parametrize(("section", "code", "line"), BLOCKS, ids=[_block_id(s, n) for s, _, n in BLOCKS])
def test_readme_block_runs(section, code, line, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__main__"}  # as when the block is saved and run as a script
    # the sentinel is set only if every statement of the block ran (no exception, no early exit)
    source = code + "\n__readme_block_done__ = True\n"
    compiled = compile(source, f"README.md (block at line {line}, section {section!r})", "exec")
    try:
        exec(compiled, namespace)  # noqa: S102 - running the README's own examples is the point of this test
    finally:
        plt.close("all")
    assert namespace.get("__readme_block_done__") is True
