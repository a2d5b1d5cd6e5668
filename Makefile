# Two entry points a fresh machine needs (see README): `make backtest` and `make test`; `make docs` builds docs/.
# Both use .venv, created on first use; each installs what it needs and reinstalls when pyproject.toml changes.
#
# - `make backtest` installs the package with its `cpu` extra only: the main job needs no torch, no dev tools.
# - `make test` (and lint, typecheck) add the `dev`, `export`, `chronos`, `tirex` and `timesfm` extras. The export
#   extra needs torch (so do chronos, tirex and timesfm, the families' upstream packages), and on Linux PyPI's
#   torch wheel is the CUDA build (cuda-toolkit, cuDNN, NCCL: several GB), so torch's CPU build is installed first
#   from PyTorch's CPU index with a `+cpu` pin; pip then keeps it for `torch>=2.4`. Elsewhere (macOS) PyPI's
#   wheel is the CPU build and there is no `+cpu` variant. Override TORCH_INDEX= to use only the configured
#   indexes, or TORCH_SPEC to pick another build.
# - `make check-install` resolves the main job's install against PyPI (pip --dry-run --report) and fails on
#   any CUDA package: the evidence that a fresh clone installs none.
# - `make check-export-installs` runs each exporter install docs/export.md documents ("Installing an exporter") in a
#   fresh venv holding only what it installs, imports what the family's exporter imports and exports a tiny
#   random-weight model (scripts/check_export_installs.py; needs PyPI; no .venv).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0
ifeq ($(shell uname -s),Linux)
TORCH_SPEC ?= torch==$(TORCH_VERSION)+cpu
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
else
TORCH_SPEC ?= torch==$(TORCH_VERSION)
TORCH_INDEX ?=
endif

# The upstream packages whose own pins conflict with this environment, and the modules their model code imports
# that pin conflicting versions too: installed without their pins, after the `moirai2` and `toto` extras (what they
# import that pip can resolve). uni2ts 2.0.0 (Moirai 2) pins torch<2.5 and numpy~=1.26; toto-ts 0.2.0 torch==2.7.0,
# numpy==1.26.4, transformers==4.52.1, ...; gluonts 0.16.2 (the first on numpy 2, for both) numpy<2.2 and pandas<3;
# jaxtyping 0.2.29 typeguard 2.13.3 (its import hook only); rotary-embedding-torch (Toto) only torch and einops.
# Checked with pip --dry-run: none of them changes torch, numpy, pandas or transformers.
UPSTREAM_NO_DEPS ?= uni2ts==2.0.0 toto-ts==0.2.0 gluonts==0.16.2 jaxtyping==0.2.29 rotary-embedding-torch==0.8.6

.PHONY: install live-demo backtest test test-unit lint lint-imports typecheck docs check check-install check-export-installs bench-backtest bench-serve bench-gpu clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# What the main job needs: the package, its core dependencies and ONNX Runtime (CPU).
$(BIN)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[cpu]"
	touch $@

# What the tests and tools need: the dev and export extras, with torch's CPU build first (see above).
$(BIN)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[cpu,dev,export,chronos,tirex,timesfm,moirai2,toto]"
	$(BIN)/python -m pip install --quiet --no-deps $(UPSTREAM_NO_DEPS)
	touch $@ $(BIN)/.installed-run

# The main job's environment alone (.venv with the package and ONNX Runtime): then `source .venv/bin/activate`,
# or call .venv/bin/distributed-onnx.
install: $(BIN)/.installed-run

# The live loop on the bundled data: backtest, serve in the background, replay requests, score; stops the server
# it started whatever happens (scripts/live_demo.sh).
live-demo: $(BIN)/.installed-run
	scripts/live_demo.sh

backtest: $(BIN)/.installed-run
	$(BIN)/distributed-onnx backtest --output runs/reference --n-windows 913 --stride 1

test: $(BIN)/.installed
	$(BIN)/python -m pytest -q

# The fast tier: pure logic, no Ray, no ONNX Runtime session, no server (tests/conftest.py fails one that starts any).
test-unit: $(BIN)/.installed
	$(BIN)/python -m pytest -q -m "not integration and not gpu"

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The layers and who may import Ray and onnxruntime: import-linter's contracts in pyproject.toml.
lint-imports: $(BIN)/.installed
	$(BIN)/lint-imports --no-logo

typecheck: $(BIN)/.installed
	$(BIN)/mypy

# The documentation site (mkdocs.yml): strict, so any warning fails it, a broken link or anchor included.
docs: $(BIN)/.installed
	$(BIN)/mkdocs build

check: lint lint-imports typecheck docs test

check-install: $(BIN)/.installed-run
	$(BIN)/python scripts/check_install.py

# Each documented exporter install, as the page writes it, in its own fresh venv (stdlib script: any Python 3.11).
check-export-installs:
	$(PYTHON) scripts/check_export_installs.py

$(BIN)/.bench-installed: $(BIN)/.installed
	$(BIN)/python -m pip install --quiet -e ".[cpu,dev,export,chronos,tirex,timesfm,moirai2,toto,bench]"
	touch $@

bench-backtest: $(BIN)/.bench-installed
	$(BIN)/python benchmarks/backtest_bench.py

bench-serve: $(BIN)/.bench-installed
	$(BIN)/python benchmarks/serve_bench.py

# On a GPU machine, with onnxruntime-gpu importable by $(PYTHON) (not the CPU venv); see docs/gpu.md.
bench-gpu:
	$(PYTHON) scripts/gpu_check.py

clean:
	rm -rf $(VENV) runs site
