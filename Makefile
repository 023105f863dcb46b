# The two commands of the README. Each creates .venv (Python >= 3.11) and installs the
# package into it when pyproject.toml changed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CORES ?= 2

.PHONY: demo test test-quick clean

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "dchag needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $@

# The main job: the default demo pipeline (config/demo.yaml); results land in results/demo/.
demo: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/snakemake --cores $(CORES)

# The test suite, exactly as CI runs it (.ci/run): three pytest-xdist workers on CI's two cores
# (the Slurm test mostly waits on job states, so a third worker keeps both cores busy), the
# end-to-end tests first (tests/conftest.py orders them; they share no state).
# `make test-quick` leaves the end-to-end (integration) tests out.
test: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -n 3 --dist load --maxschedchunk 1

test-quick: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -n 2 --dist load --maxschedchunk 1 -m "not integration"

clean:
	rm -rf results logs resources .snakemake
