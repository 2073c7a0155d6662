"""The documentation site: every public name has a complete docstring, and the site builds with no warning and no
broken internal link.

Two checks:

- every name in the ``__all__`` of a documented module (``docs/conf.py``'s ``API_MODULES``) has a numpydoc
  docstring with a summary line, a ``Parameters`` section when it takes parameters (a class: its constructor),
  and an ``Examples`` section; the test names each object that lacks one;
- ``sphinx-build -W --keep-going -n -b html`` (what ``make docs`` runs) succeeds into a temporary folder, and
  every relative link of the built HTML leads to a file that exists and, with a ``#fragment``, to an element with
  that id. The build never executes a notebook (``nb_execution_mode = "off"``); it takes about a minute on two
  busy cores, most of it rendering the API pages.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import subprocess
import sys
import warnings
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from numpydoc.docscrape import NumpyDocString

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
API_MODULES = (
    "ppmix",
    "ppmix.models",
    "ppmix.components",
    "ppmix.inference",
    "ppmix.distributed",
    "ppmix.datasets",
    "ppmix.metrics",
    "ppmix.viz",
)


def test_api_modules_match_conf() -> None:
    """The modules checked here are the ones the site documents."""
    conf = (DOCS / "conf.py").read_text()
    for name in API_MODULES:
        assert f'"{name}",' in conf, f"{name} is checked here but has no API page in docs/conf.py"


# ------------------------------------------------------------------------------------------- docstrings
def _public_objects() -> list[tuple[str, object]]:
    objects = []
    for module_name in API_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            if not name.startswith("__"):
                objects.append((f"{module_name}.{name}", getattr(module, name)))
    return objects


def _takes_parameters(obj: object) -> bool:
    """Whether a function, or a class's constructor, takes parameters (``self`` aside).

    A class whose ``__init__`` is Python's own (``object``, ``Exception``, ``Warning``) or a ``typing.Protocol``'s
    takes none that need documenting.
    """
    if inspect.isclass(obj):
        init = obj.__init__
        if getattr(init, "__module__", None) in (None, "builtins", "typing") or not callable(init):
            return False
        target = init
    else:
        target = obj
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return False
    return any(name not in ("self", "cls") for name in signature.parameters)


def _documents_fields(obj: object, doc: NumpyDocString) -> bool:
    """Whether ``obj`` is a dataclass whose ``Attributes`` section names every constructor field (a result that a
    function returns documents its fields as attributes, which is what they are to the reader)."""
    if not dataclasses.is_dataclass(obj):
        return False
    named = {name.strip() for entry in doc["Attributes"] for name in entry.name.split(",")}
    return {field.name for field in dataclasses.fields(obj) if field.init and not field.name.startswith("_")} <= named


def docstring_gaps(obj: object) -> list[str]:
    """What ``obj``'s numpydoc docstring lacks: ``summary``, ``Parameters``, ``Examples``.

    A dataclass may document its fields in ``Attributes`` instead of ``Parameters``, if it names all of them.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpydoc warns on unknown sections; this test judges only three
        doc = NumpyDocString(inspect.getdoc(obj) or "")
    gaps = [] if doc["Summary"] else ["summary"]
    if _takes_parameters(obj) and not doc["Parameters"] and not _documents_fields(obj, doc):
        gaps.append("Parameters")
    if not doc["Examples"]:
        gaps.append("Examples")
    return gaps


def test_docstring_gaps_finds_what_is_missing() -> None:
    def bare(x):  # noqa: ANN001, ANN202 - a planted gap
        return x

    def documented(x):  # noqa: ANN001, ANN202
        """Return x.

        Parameters
        ----------
        x : object
            Anything.

        Examples
        --------
        >>> documented(1)
        1
        """
        return x

    assert docstring_gaps(bare) == ["summary", "Parameters", "Examples"]
    assert docstring_gaps(documented) == []
    assert docstring_gaps(ValueError) == ["Examples"]  # Python's own constructor needs no Parameters
    assert "Examples" in docstring_gaps(type("Plain", (), {"__doc__": "Summary only."}))

    @dataclasses.dataclass
    class Result:
        """A result.

        Attributes
        ----------
        a, b : int
            Two numbers.
        """

        a: int
        b: int
        c: int = 0

    assert docstring_gaps(Result) == ["Parameters", "Examples"]  # c is not named
    Result.__doc__ = Result.__doc__.replace("a, b : int", "a, b, c : int")
    assert docstring_gaps(Result) == ["Examples"]


@pytest.mark.parametrize("name,obj", _public_objects(), ids=[name for name, _ in _public_objects()])
def test_public_name_docstring_is_complete(name: str, obj: object) -> None:
    gaps = docstring_gaps(obj)
    assert not gaps, f"{name}: its docstring lacks {', '.join(gaps)}"


# ------------------------------------------------------------------------------------------- the build
class _Links(HTMLParser):
    """The ids of a page and the ``href``/``src`` targets in it."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.targets: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for key, value in attrs:
            if key in ("id", "name") and value:
                self.ids.add(value)
            if value and ((key == "href" and tag in ("a", "link")) or (key == "src" and tag in ("img", "script"))):
                self.targets.append(value)


def broken_links(site: Path) -> list[str]:
    """``page -> target`` for every relative link of ``site`` whose file or ``#id`` does not exist."""
    pages = {}
    for page in site.rglob("*.html"):
        if "_static" in page.relative_to(site).parts:  # the theme's template fragments, not pages
            continue
        parser = _Links()
        parser.feed(page.read_text(encoding="utf-8"))
        pages[page.resolve()] = parser
    broken = []
    for page, parser in pages.items():
        for target in parser.targets:
            parts = urlsplit(target)
            if parts.scheme or parts.netloc or target.startswith(("mailto:", "javascript:", "data:")):
                continue
            path = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            if path.is_dir():
                path = path / "index.html"
            if not path.exists():
                broken.append(f"{page.relative_to(site.resolve())} -> {target} (no such file)")
            elif parts.fragment and path.suffix == ".html" and unquote(parts.fragment) not in pages[path].ids:
                broken.append(f"{page.relative_to(site.resolve())} -> {target} (no such id)")
    return broken


def test_broken_links_finds_a_missing_page_and_anchor(tmp_path: Path) -> None:
    (tmp_path / "a.html").write_text('<p id="here"></p><a href="b.html#nowhere"></a><a href="a.html#here"></a>')
    (tmp_path / "b.html").write_text('<a href="c.html"></a><a href="https://example.org/x"></a><a href="#top"></a>')
    assert sorted(broken_links(tmp_path)) == [
        "a.html -> b.html#nowhere (no such id)",
        "b.html -> #top (no such id)",
        "b.html -> c.html (no such file)",
    ]


@pytest.fixture(scope="session")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path]:
    """``make docs``'s build, into a temporary folder: ``(the finished process, the HTML folder)``."""
    out = tmp_path_factory.mktemp("site")
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html"]
    command += ["-d", str(out / "doctrees"), str(DOCS), str(out / "html")]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    return done, out / "html"


def test_site_builds_without_warnings_and_links_resolve(built_site: tuple[subprocess.CompletedProcess, Path]) -> None:
    """One test (not two) so that pytest-xdist never runs two builds into the same generated stubs."""
    done, html = built_site
    assert done.returncode == 0, f"sphinx-build failed:\n{done.stderr[-6000:]}"
    assert "WARNING" not in done.stderr, done.stderr[-6000:]
    for page in ("index.html", "getting_started.html", "api/index.html", "tutorials/index.html", "benchmarks.html"):
        assert (html / page).exists(), page
    assert not broken_links(html), "\n".join(broken_links(html)[:50])
    notebooks = sorted(path.stem for path in (ROOT / "tutorials").glob("*.ipynb"))
    assert notebooks and all((html / "tutorials" / "notebooks" / f"{name}.html").exists() for name in notebooks)
