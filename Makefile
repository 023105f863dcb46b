# The two commands of the README. Each creates .venv (Python >= 3.11) and installs the
# package into it when pyproject.toml changed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
CORES ?= 2
TEST_WORKERS ?= $(CORES)
# torch goes in first, so that dchag's range (torch>=2.10 in pyproject.toml) is already met and
# pip adds no other build: by default the CPU wheel of 2.13.0 (pip takes it from this machine's
# disk and CI's; a bare `pip install -e .` into an empty venv would take a CUDA build of several
# GB). A machine with its own torch: `pip install -e ".[test]"` into its environment instead.
TORCH ?= torch==2.13.0
# The rest goes in with uv: the same versions pip resolves, in half pip's time on CI's 2 cores
# (22 s instead of 45 s, measured from an empty cache: it downloads in parallel). uv reads no pip
# configuration: behind a site's package mirror, set UV_INDEX_URL (or UV_DEFAULT_INDEX) to it.
# --compile-bytecode covers site-packages; the editable install's own modules (src/) are compiled
# too: where PYTHONDONTWRITEBYTECODE is set (as on the machines the suite's times were measured on)
# every process would compile them again, and the test suite starts about 700.
# `make demo` installs dchag alone; `make test` adds the test extras (pytest, the docs' tools, the
# readers of optional formats): 27 s instead of 45 s from an empty cache, measured on 2 cores.
UV_INSTALL = $(BIN)/uv pip install -q --python $(BIN)/python --compile-bytecode

.PHONY: demo test test-quick lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "dchag needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip uv
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(UV_INSTALL) -e .
	$(BIN)/python -m compileall -q src
	touch $@

$(TEST_STAMP): $(STAMP)
	$(UV_INSTALL) -e ".[test]"
	touch $@

# The main job: the default demo pipeline (config/demo.yaml); results land in results/demo/.
demo: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/snakemake --cores $(CORES)

# The test suite, exactly as CI runs it (.ci/run): one pytest-xdist worker per core (TEST_WORKERS,
# CORES by default, CI's two; more workers than cores oversubscribe them: measured on CI's 2 cores,
# the same code one run after another, 5 workers 1130 s and 1.3x the tests' CPU seconds of 2
# workers' 898 s, see benchmarks/results/test_workers.md), the tests marked `minutes` first, longest first, then
# tests/integration/, then tests/unit/ (tests/conftest.py orders them). `make test-quick` runs
# tests/unit/ alone.
test: lint
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist load --maxschedchunk 1

# The Python linter and formatter (configured in pyproject.toml), as CI runs them before the tests.
lint: $(TEST_STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

test-quick: $(TEST_STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist load --maxschedchunk 1 tests/unit

clean:
	rm -rf results logs resources .snakemake
