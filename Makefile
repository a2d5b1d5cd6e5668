# Two entry points a fresh machine needs (see README): `make backtest` and `make test`.
# Each creates .venv on first use; later runs reuse it until pyproject.toml changes.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned to the CPU build that this project's machines carry on disk; an unpinned torch
# would pull a multi-GB CUDA build.
TORCH_CPU ?= torch==2.13.0

.PHONY: backtest test lint typecheck check bench-backtest bench-serve bench-gpu clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_CPU)"
	$(BIN)/python -m pip install --quiet -e ".[cpu,dev,export]"
	touch $@

backtest: $(BIN)/.installed
	$(BIN)/distributed-onnx backtest --output runs/reference --n-windows 913 --stride 1

test: $(BIN)/.installed
	$(BIN)/python -m pytest -q

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(BIN)/.installed
	$(BIN)/mypy

check: lint typecheck test

$(BIN)/.bench-installed: $(BIN)/.installed
	$(BIN)/python -m pip install --quiet -e ".[cpu,dev,export,bench]"
	touch $@

bench-backtest: $(BIN)/.bench-installed
	$(BIN)/python benchmarks/backtest_bench.py

bench-serve: $(BIN)/.bench-installed
	$(BIN)/python benchmarks/serve_bench.py

# On a GPU machine, with onnxruntime-gpu importable by $(PYTHON) (not the CPU venv); see ../shared/gpu/README.md.
bench-gpu:
	$(PYTHON) scripts/gpu_check.py

clean:
	rm -rf $(VENV) runs
