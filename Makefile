# Two entry points on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test install bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -c constraints.txt torch==2.13.0
	$(BIN)/pip install -c constraints.txt -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/ppmix demo --out out/demo

test: $(STAMP)
	$(BIN)/ruff check ppmix tests benchmarks
	$(BIN)/python -m pytest -n 2 -q

bench: $(STAMP)
	$(BIN)/pip install -c constraints.txt -e ".[bench]"
	$(BIN)/python benchmarks/bench_gmm.py
	$(BIN)/python benchmarks/bench_hmm.py
	$(BIN)/python benchmarks/bench_partition.py
	$(BIN)/python benchmarks/bench_pf_gmm.py
	$(BIN)/python benchmarks/bench_moe.py

clean:
	rm -rf $(VENV) out
