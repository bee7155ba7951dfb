# calibkit: `make setup`, `make lint`, `make test`, `make bench`, `make docs`, `make dist`, `make wheel-check`.
# TORCH can be overridden on machines that bring their own build: make setup TORCH=torch
PY     ?= python3
TORCH  ?= torch==2.13.0
VENV   := .venv
BIN    := $(VENV)/bin
FMNIST := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz

.PHONY: setup data lint test bench docs dist wheel-check clean

setup: $(VENV)/.installed data

# torch first: any later package that depends on torch then finds it installed
# instead of pulling a different (CUDA) build.
$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test,csm,data,pretrained]"
	touch $@

# The Debian package dataset-fashion-mnist puts the four idx files under /usr/share/datasets.
data:
	@if [ -f "$(FMNIST)" ]; then :; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist; \
	elif command -v apt-get >/dev/null 2>&1 && command -v sudo >/dev/null 2>&1; then \
		sudo apt-get update -qq && sudo apt-get install -y -qq dataset-fashion-mnist; \
	else \
		echo "Fashion-MNIST not found at $(FMNIST): install the Debian package dataset-fashion-mnist or pass --data-dir to calibkit"; \
	fi

# ruff (rules and exceptions in pyproject.toml) on everything written in Python; mypy on the whole
# calibkit package (settings in pyproject.toml, docs/design.md).
lint: $(VENV)/.installed
	$(BIN)/ruff check calibkit tests tools benchmarks examples
	$(BIN)/mypy calibkit

# One test process per core (pytest-xdist); each file stays in one process, so a module's
# fixtures are built once. TEST_WORKERS=0 runs everything in this process. One torch thread per
# process unless OMP_NUM_THREADS says otherwise: as many processes as cores, each with as many
# threads as cores, took 1.4 times as long here (docs/performance.md, "CI and the test suite").
# calibkit's bytecode is compiled first: where PYTHONDONTWRITEBYTECODE is set, each command-line
# call a test makes would compile the package again (about 1 s of CPU each).
TEST_WORKERS ?= auto
test: setup
	$(BIN)/python -m compileall -q calibkit tests
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# One single-threaded process per core share the runs (WORKERS=1: one process).
WORKERS ?= $(shell nproc 2>/dev/null || echo 1)
bench: setup
	$(BIN)/calibkit bench --preset default --out runs/default --workers $(WORKERS)

# The API reference from the docstrings: build/docs/index.html. Any Sphinx warning fails the build.
$(VENV)/.docs: $(VENV)/.installed
	$(BIN)/pip install -q -e ".[docs]"
	touch $@

docs: $(VENV)/.docs
	rm -rf docs/api/_generated build/docs
	$(BIN)/python -m sphinx -W --keep-going -q -b html docs/api build/docs
	@echo "API reference: build/docs/index.html"

# sdist and wheel into dist/
dist: $(VENV)/.installed
	rm -rf dist
	$(BIN)/python -m build --outdir dist .

# Build the wheel, install it into a fresh venv outside the repository and run it from an empty
# folder (what a user of `pip install calibkit` gets): the `calibkit` entry point, a smoke bench of
# CE, LS and CSM with its report (a built-in preset, training, the OOD set and the CSM generated set
# shipped as package data, the report), and one `calibkit train --config fmnist` epoch (the shipped
# configs). Not the whole 15-method grid: `make test` runs that from the checkout.
wheel-check: $(VENV)/.installed data
	PY="$(PY)" TORCH="$(TORCH)" BUILD_PY="$(BIN)/python" bash .ci/wheel-check

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache build dist docs/api/_generated
