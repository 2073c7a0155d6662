# Two entry points on a fresh machine: `make demo` and `make test`.
# Both install the development environment from the committed lock (requirements/dev.lock),
# so every machine gets exactly the versions the suite was last green on.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
LOCK   := requirements/dev.lock
# Where pip finds the CPU build of torch pinned in constraints.txt (this project's machines keep it there).
TORCH_WHEELS ?= /opt/wheels

.PHONY: demo test install bench tutorials docs lock test-latest check-install clean

$(STAMP): pyproject.toml constraints.txt $(LOCK)
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --require-hashes --no-deps -r $(LOCK)
	$(BIN)/pip install --no-deps --no-build-isolation -e .
	$(BIN)/pip check
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/ppmix demo --out out/demo

test: $(STAMP)
	$(BIN)/ruff check ppmix tests benchmarks
	$(BIN)/ruff format --check ppmix tests benchmarks
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -n 2 -q

# re-run every tutorial and store it with its outputs (tests/test_tutorials.py checks they are current)
tutorials: $(STAMP)
	$(BIN)/python -m tests.tutorial_outputs

# the documentation site, warnings as errors (docs/conf.py; tests/test_docs.py builds it too): docs/_build/html
docs: $(STAMP)
	$(BIN)/python -m sphinx -W --keep-going -n -b html docs docs/_build/html

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_gmm.py
	$(BIN)/python benchmarks/bench_gmm_start.py
	$(BIN)/python benchmarks/bench_hmm.py
	$(BIN)/python benchmarks/bench_families.py
	$(BIN)/python benchmarks/bench_partition.py
	$(BIN)/python benchmarks/bench_pf_gmm.py
	$(BIN)/python benchmarks/bench_moe.py
	$(BIN)/python benchmarks/bench_missing.py
	$(BIN)/python benchmarks/bench_bayes.py
	$(BIN)/python benchmarks/bench_defaults.py

# Re-resolve the lock to the newest releases (torch stays at constraints.txt's pin). Run it when
# `make test-latest` is green and you want the newer versions, or after changing pyproject.toml.
lock:
	$(PYTHON) -m venv .venv-tools
	.venv-tools/bin/pip install -q uv
	.venv-tools/bin/uv pip compile pyproject.toml --extra test --extra bench --extra docs -c constraints.txt \
		--python-version 3.11 --python-platform x86_64-manylinux_2_28 --generate-hashes --upgrade \
		--find-links $(TORCH_WHEELS) --no-emit-find-links --custom-compile-command "make lock" -o $(LOCK)

# The suite against the newest releases, no lock (torch pinned as above): drift seen by choice.
test-latest:
	rm -rf .venv-latest
	$(PYTHON) -m venv .venv-latest
	.venv-latest/bin/pip install -c constraints.txt torch==2.13.0
	.venv-latest/bin/pip install --upgrade -c constraints.txt -e ".[test,bench]"
	.venv-latest/bin/python -m pytest -n 2 -q -p no:cacheprovider

# A non-editable `pip install .` in a clean venv: the package, its data and the `ppmix` command.
check-install:
	rm -rf .venv-install build
	$(PYTHON) -m venv .venv-install
	.venv-install/bin/pip install -q --require-hashes --no-deps -r $(LOCK)
	.venv-install/bin/pip install -q --no-deps --no-build-isolation .
	rm -rf build
	cd /tmp && $(CURDIR)/.venv-install/bin/python -c "import ppmix; ppmix.GMM, ppmix.PFHMM; from ppmix.inference import PRESTO, RegularizedWeighting, ot_reduce; from ppmix.models import TwoStep; from ppmix.distributed import fit_distributed; print('ppmix', ppmix.__file__)"
	cd /tmp && $(CURDIR)/.venv-install/bin/ppmix --help > /dev/null
	rm -rf .venv-install

clean:
	rm -rf $(VENV) .venv-latest .venv-install .venv-tools out docs/_build docs/api/generated docs/api/ppmix*.rst docs/tutorials/notebooks
