"""Every ```python block of README.md and of the user guide's pages (docs/guide/*.md) runs.

The rule: each block is one test and runs on its own, in a fresh namespace, so every block
must be self-contained and copy-pasteable (it imports what it uses and makes its own data at
its top); blocks of one page share no state. A block runs as a script would: ``__name__ ==
"__main__"``, so code under an ``if __name__ == "__main__":`` guard (needed around process pools,
which start their workers by spawn) runs too. It runs with the working directory set to a fresh
temporary directory, so files it writes (``gmm.save("my_gmm")``, shards) land there; Pyro's
parameter store is cleared and its seed fixed before each block (``tests/conftest.py``). A block
fails the test if it raises; warnings are allowed. Blocks fenced as anything but ``python`` (``bash``
for shell commands, ``toml``, MyST directives such as ``{toctree}``) are not run: a Python example that
must not run would be fenced ``text`` with its reason beside it (none is, today). The blocks keep their
data small and their engines short (``num_steps=50`` for SVI, ``num_samples=5, warmup_steps=5`` for
NUTS), so all of them run in well under a minute on two cores.

Beside the blocks, the pages are checked for drift: the README stays a front page (at most 250
lines), every guide page is in the guide's toctree and
linked from the README, every relative link of the README and the guide leads to a file of the
repository, and the component families page has a row for every built-in family naming each of its
``priors=`` keys.
"""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from ppmix.components.registry import FAMILIES, family_from

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "guide"
#: the site's own pages with examples (docs/index.md, docs/getting_started.md) run too
PAGES = [README, ROOT / "docs" / "index.md", ROOT / "docs" / "getting_started.md", *sorted(GUIDE.glob("*.md"))]
#: guide pages with no Python block: the table of contents, and the layout / benchmark tables
PAGES_WITHOUT_BLOCKS = {"index.md", "architecture.md"}

_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$", re.MULTILINE)
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def python_blocks(text: str) -> list[tuple[str, str, int]]:
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


def _page_name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


BLOCKS = [(_page_name(page), *block) for page in PAGES for block in python_blocks(page.read_text(encoding="utf-8"))]


def _block_id(page: str, section: str, line: int) -> str:
    return f"{_slug(Path(page).stem)}-{_slug(section)}-L{line}"


def test_every_page_has_python_blocks():
    pages = {page for page, _, _, _ in BLOCKS}
    expected = {_page_name(page) for page in PAGES if page.name not in PAGES_WITHOUT_BLOCKS}
    assert expected <= pages, sorted(expected - pages)
    sections = {section for page, section, _, _ in BLOCKS if page.startswith("docs/guide/")}
    assert {"Fitting and decoding", "Transition patterns", "Regularized Weighting"} <= sections, sections


def test_block_extraction_skips_shell_blocks_and_names_sections():
    text = "# T\n## A\n```bash\nmake test\n```\n## B\n```python\n# not a heading\nx = 1\n```\n```python\ny = 2\n```\n"
    blocks = python_blocks(text)
    assert [(section, code) for section, code, _ in blocks] == [("B", "# not a heading\nx = 1\n"), ("B", "y = 2\n")]
    assert [line for _, _, line in blocks] == [8, 12]
    assert python_blocks("```{toctree}\nhmm\n```\n```text\nnot run\n```\n") == []


def test_guide_pages_are_in_the_toctree_and_linked_from_the_readme():
    pages = {page.stem for page in GUIDE.glob("*.md")} - {"index"}
    index = (GUIDE / "index.md").read_text(encoding="utf-8")
    toctree = re.search(r"```\{toctree\}\n(.*?)```", index, re.DOTALL)
    assert toctree is not None, "docs/guide/index.md has no toctree"
    listed = {line.strip() for line in toctree.group(1).splitlines() if line.strip() and not line.startswith(":")}
    assert listed == pages, (sorted(pages - listed), sorted(listed - pages))
    readme = README.read_text(encoding="utf-8")
    assert not [page for page in pages if f"(docs/guide/{page}.md)" not in readme], "README must link every guide page"


def test_readme_is_a_front_page():
    # the manual is the user guide; the README says what ppmix is and where to read on (issue 53)
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= 250, f"README.md has {lines} lines: move sections to a page of docs/guide/ and link it"


def test_relative_links_lead_to_files():
    broken = []
    for page in PAGES:
        for target in _LINK.findall(page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # web addresses and anchors within the page
            if not (page.parent / target.split("#")[0]).exists():
                broken.append(f"{_page_name(page)}: {target}")
    assert not broken, broken


def _built_in_families() -> list[str]:
    # families other tests register (and must remove) are not ppmix's
    return [name for name, where in FAMILIES.items() if isinstance(where, str) and where.startswith("ppmix.")]


def test_families_table_names_every_family_and_its_prior_keys():
    text = (GUIDE / "families.md").read_text(encoding="utf-8")
    for name in _built_in_families():
        rows = "\n".join(line for line in text.splitlines() if line.startswith(f'| `"{name}"`'))
        assert rows, f"docs/guide/families.md has no table row for the {name!r} family"
        variants = [family_from(name)]
        try:
            variants.append(family_from({"name": name, "covariance_type": "full"}))
        except (TypeError, ValueError):
            pass  # a family without covariance types
        keys = {key for family in variants for key in family.priors().keys()}
        missing = sorted(key for key in keys if f"`{key}`" not in rows)
        assert not missing, f"the {name!r} row of docs/guide/families.md does not name its priors= keys {missing}"


@pytest.mark.parametrize(("page", "section", "code", "line"), BLOCKS, ids=[_block_id(p, s, n) for p, s, _, n in BLOCKS])
def test_block_runs(page, section, code, line, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__main__"}  # as when the block is saved and run as a script
    # the sentinel is set only if every statement of the block ran (no exception, no early exit)
    source = code + "\n__readme_block_done__ = True\n"
    compiled = compile(source, f"{page} (block at line {line}, section {section!r})", "exec")
    families = dict(FAMILIES)  # a block may register a family (the guide's "counts"): not for the tests after it
    try:
        exec(compiled, namespace)  # noqa: S102 - running the documentation's own examples is the point of this test
    finally:
        plt.close("all")
        FAMILIES.clear()
        FAMILIES.update(families)
    assert namespace.get("__readme_block_done__") is True
