"""Sphinx configuration of ppmix's documentation site.

Build it with ``make docs`` (``sphinx-build -W --keep-going -n -b html docs docs/_build/html``): warnings are
errors and every cross-reference must resolve (nitpicky) or be listed, with its reason, in
``docs/nitpick-ignore.txt``.

Two steps run before Sphinx reads the sources, both writing only git-ignored files:

- the API pages: one page per documented module (``docs/api/<module>.rst``), listing every name of that
  module's ``__all__`` in an ``autosummary`` table whose stubs (``docs/api/generated/``) autosummary writes, so
  a name added to ``__all__`` gets its page with no edit here;
- the tutorials: ``tutorials/*.ipynb`` copied to ``docs/tutorials/notebooks/`` (the notebooks stay where they
  are; MyST-NB renders their stored outputs and never executes them: ``nb_execution_mode = "off"``).

Intersphinx links to Python, NumPy, PyTorch, Pyro, scikit-learn and ArviZ need their inventories from the
network, so they are off by default (an offline build would warn on every unreachable inventory). Set
``PPMIX_DOCS_INTERSPHINX=1`` to turn them on where the network is reachable.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))

import ppmix  # noqa: E402

#: the modules with an API page, in the order of the API index
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

project = "ppmix"
author = "ppmix developers"
copyright = "2026, ppmix developers"
release = ppmix.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "numpydoc",
    "myst_nb",
    "sphinx_copybutton",
]

root_doc = "index"
exclude_patterns = ["_build", "**.ipynb_checkpoints", "nitpick-ignore.txt"]
templates_path = ["_templates"]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}

# ---------------------------------------------------------------------------------------------- autodoc
autosummary_generate = True
autosummary_imported_members = True
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_typehints = "none"  # numpydoc's Parameters sections carry the types
autodoc_member_order = "groupwise"
add_module_names = False

# ---------------------------------------------------------------------------------------------- numpydoc
numpydoc_show_class_members = False  # the class template lists the methods itself
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

# ---------------------------------------------------------------------------------------------- MyST-NB
nb_execution_mode = "off"  # render the stored outputs; never run a notebook while building
nb_output_stderr = "remove"  # stored warnings (a tqdm notice with the path of the machine that ran it) are noise
myst_enable_extensions = ["colon_fence", "dollarmath"]
myst_dmath_double_inline = True  # the notebooks write display math ($$ ... $$) inside paragraphs
myst_heading_anchors = 4

# ---------------------------------------------------------------------------------------------- nitpicky
nitpicky = True
nitpick_ignore: list[tuple[str, str]] = []
nitpick_ignore_regex: list[tuple[str, str]] = []


def _read_nitpick_ignore(path: Path) -> None:
    """Fill ``nitpick_ignore`` (``TYPE TARGET``) and ``nitpick_ignore_regex`` (``re: TYPE REGEX``) from ``path``.

    Every entry must follow a ``#`` comment line that says why it cannot resolve.
    """
    justified = False
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line:
            justified = False
            continue
        if line.startswith("#"):
            justified = True
            continue
        if not justified:
            raise ValueError(f"{path.name}:{number}: {line!r} needs a '#' comment line above it saying why")
        regex = line.startswith("re:")
        kind, target = line.removeprefix("re:").split(None, 1)
        (nitpick_ignore_regex if regex else nitpick_ignore).append((kind, target.strip()))


_read_nitpick_ignore(DOCS / "nitpick-ignore.txt")

# ---------------------------------------------------------------------------------------------- intersphinx
intersphinx_mapping: dict[str, tuple[str, None]] = {}
if os.environ.get("PPMIX_DOCS_INTERSPHINX") == "1":
    intersphinx_mapping = {
        "python": ("https://docs.python.org/3", None),
        "numpy": ("https://numpy.org/doc/stable", None),
        "torch": ("https://docs.pytorch.org/docs/stable", None),
        "pyro": ("https://docs.pyro.ai/en/stable", None),
        "sklearn": ("https://scikit-learn.org/stable", None),
        "arviz": ("https://python.arviz.org/en/stable", None),
    }

# ---------------------------------------------------------------------------------------------- HTML
html_theme = "pydata_sphinx_theme"
html_title = f"ppmix {release}"
html_static_path: list[str] = []
html_copy_source = False  # no _sources/ copies of the pages (the "Show Source" link goes with them)
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_sidebars = {page: [] for page in ("index", "getting_started", "benchmarks", "reproductions", "results")}
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True


# ---------------------------------------------------------------------------------------------- generated sources
@functools.cache
def _public_names() -> dict[int, str]:
    """``id(object) -> public dotted name`` for every name documented on an API page."""
    public = {}
    for module_name in API_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            public.setdefault(id(getattr(module, name)), f"{module_name}.{name}")
    return public


def _write_if_changed(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` unless it already holds it (so incremental builds stay incremental)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def _api_page(module_name: str) -> str:
    """The reST of a module's API page: its docstring, then an autosummary of every name in ``__all__``.

    A name that an earlier module of ``API_MODULES`` already documents (``ppmix.models.GMM`` is ``ppmix.GMM``)
    is listed and linked to that page, not documented twice.
    """
    module = importlib.import_module(module_name)
    public = _public_names()
    names = [name for name in module.__all__ if not name.startswith("__")]
    own = [name for name in names if public[id(getattr(module, name))] == f"{module_name}.{name}"]
    shared = [name for name in names if name not in own]
    title = f"``{module_name}``"
    lines = [title, "=" * len(title), "", f".. automodule:: {module_name}", "   :no-members:", ""]
    lines += ["Public names", "------------", ""]
    lines += [f".. currentmodule:: {module_name}", "", ".. autosummary::", "   :toctree: generated", ""]
    lines += [f"   {name}" for name in own]
    if shared:
        lines += ["", "Also here, documented with the top-level names:", "", ".. autosummary::", ""]
        lines += [f"   {name}" for name in shared]
    return "\n".join([*lines, ""])


def _write_api_pages() -> None:
    """Write the API pages, and remove the stubs of names that left ``__all__`` (autosummary keeps them)."""
    for module_name in API_MODULES:
        _write_if_changed(DOCS / "api" / f"{module_name}.rst", _api_page(module_name))
    documented = {f"{name}.rst" for name in _public_names().values()}
    for stub in (DOCS / "api" / "generated").glob("*.rst"):
        if stub.name not in documented:
            stub.unlink()


def _copy_tutorials() -> None:
    """Copy ``tutorials/*.ipynb`` into ``docs/tutorials/notebooks`` (only the changed ones; stale copies removed)."""
    target = DOCS / "tutorials" / "notebooks"
    target.mkdir(parents=True, exist_ok=True)
    sources = {path.name: path for path in sorted((ROOT / "tutorials").glob("*.ipynb"))}
    for stale in target.glob("*.ipynb"):
        if stale.name not in sources:
            stale.unlink()
    for name, source in sources.items():
        copy = target / name
        if not copy.exists() or copy.read_bytes() != source.read_bytes():
            shutil.copyfile(source, copy)


_write_api_pages()
_copy_tutorials()


# ---------------------------------------------------------------------------------------------- events
def _defining_module(obj: object) -> str | None:
    """The module a method, property or other callable member was written in (``None`` for plain values)."""
    target = getattr(obj, "fget", obj)
    target = getattr(target, "__func__", target)
    if not (callable(target) or isinstance(obj, property)):
        return None
    module = getattr(target, "__module__", None)
    return module if isinstance(module, str) else None


def _skip_foreign_member(app, what, name, obj, skip, options):  # noqa: ANN001, ANN202 - Sphinx's signature
    """Leave out members that a ppmix class inherits from another library (scikit-learn's, torch's, Python's):
    their docstrings are not ppmix's to document (and not numpydoc)."""
    module = _defining_module(obj)
    if module is not None and module.split(".")[0] != "ppmix":
        return True
    return None


def _import_dotted(target: str) -> object | None:
    """The object that ``target`` (``package.module.Name[.attr]``) names, or ``None``."""
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            obj = getattr(obj, part, None)
            if obj is None:
                return None
        return obj
    return None


def _candidates(target: str, node) -> list[str]:  # noqa: ANN001 - a docutils node
    """The dotted paths a Python reference may mean: as written; in the page's module and class; in the module
    whose docstring holds it (``docstring of ppmix.components.family.DensityFamily`` -> ``ppmix.components.family``
    and the classes on that path)."""
    paths = [target] if target.startswith("ppmix.") else []
    module, cls = node.get("py:module"), node.get("py:class")
    if module:
        paths += [f"{module}.{cls}.{target}"] if cls else []
        paths.append(f"{module}.{target}")
    source = str(node.source or "")
    if "docstring of " in source:
        documented = source.rsplit("docstring of ", 1)[1].split(":")[0].split(".")
        paths += [".".join([*documented[:cut], target]) for cut in range(len(documented), 0, -1)]
    return paths


def _resolve_by_identity(app, env, node, contnode):  # noqa: ANN001, ANN202 - Sphinx's signature
    """Resolve a reference to a public object by another path to its page: ``ppmix.engines.em.run_em`` (where it
    is defined) to ``ppmix.inference.run_em`` (where it is documented), ``PFGMM`` on the ``ppmix.models`` page to
    ``ppmix.PFGMM``, ``select_components`` in a docstring of ``ppmix.models.selection`` to its page; members of a
    public class too (``ppmix.models.gmm.GMM.fit``)."""
    if node.get("refdomain") != "py":
        return None
    public = _public_names()
    for path in _candidates(node.get("reftarget", ""), node):
        parts = path.split(".")
        for cut in range(len(parts), 1, -1):
            name = public.get(id(_import_dotted(".".join(parts[:cut]))))
            if name is None:
                continue
            new_target = ".".join([name, *parts[cut:]])
            domain = env.get_domain("py")
            found = domain.resolve_any_xref(env, node["refdoc"], app.builder, new_target, node, contnode)
            if found:
                return found[0][1]
            break
    return None


def _class_signature(app, what, name, obj, options, signature, return_annotation):  # noqa: ANN001, ANN202
    """A class's constructor signature, not its metaclass's: the models' metaclass is Pyro's ``PyroModule``
    metaclass, whose ``__call__(*args, **kwargs)`` autodoc would show instead of ``GMM(n_components=1, *, ...)``."""
    if what != "class" or signature != "(*args, **kwargs)":
        return None
    try:
        constructor = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    bare = [parameter.replace(annotation=inspect.Parameter.empty) for parameter in constructor.parameters.values()]
    return str(constructor.replace(parameters=bare, return_annotation=inspect.Signature.empty)), None


def setup(app):  # noqa: ANN001, ANN201 - Sphinx's signature
    app.connect("autodoc-skip-member", _skip_foreign_member)
    app.connect("missing-reference", _resolve_by_identity)
    app.connect("autodoc-process-signature", _class_signature)
    return {"parallel_read_safe": True}
