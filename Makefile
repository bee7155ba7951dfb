# calibkit: `make setup`, `make test`, `make bench`.
# TORCH can be overridden on machines that bring their own build: make setup TORCH=torch
PY     ?= python3
TORCH  ?= torch==2.13.0
VENV   := .venv
BIN    := $(VENV)/bin
FMNIST := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz

.PHONY: setup data test bench clean

setup: $(VENV)/.installed data

# torch first: any later package that depends on torch then finds it installed
# instead of pulling a different (CUDA) build.
$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test,csm,data]"
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

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/calibkit bench --preset default --out runs/default

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
