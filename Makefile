# Two commands: `make run` (set up, then the main experiment) and `make test` (set up, then the tests).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# the versions CI last tested, every package of the venv: `make setup` installs exactly these (pip's -c),
# while `pip install headway` keeps pyproject.toml's ranges; `make constraints` rewrites it
CONSTRAINTS := constraints.txt
export HEADWAY_DATA_DIR ?= $(abspath ../shared/data)
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION = 1

.PHONY: setup run test test-fast test-system lint clean constraints flower

setup: $(STAMP)

# --no-cache-dir: torch and its CUDA wheels are ~4 GB; no second copy in a pip cache, so the install needs only the venv's ~6.6 GB of disk.
$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-cache-dir --upgrade pip
	$(PY) -m pip install --quiet --no-cache-dir -c $(CONSTRAINTS) -e ".[test,fedpft,data,lint]"
	touch $(STAMP)

# After an upgrade has passed `make lint test test-system` in .venv: pin what is installed now
# (every package but headway itself and pip; setuptools too, which builds headway), so the next fresh machine installs the same. Not after `setup`:
# an upgrade outside the old pins is installed by hand (.venv/bin/pip install -U ...), then pinned here.
constraints:
	@test -x $(PY) || { echo "no $(PY): run make setup, upgrade what you test in $(VENV), then make constraints"; exit 1; }
	$(PY) -m pip freeze --all --exclude-editable --exclude pip > $(CONSTRAINTS).new
	{ echo "# The versions CI tested: make setup installs with pip's -c $(CONSTRAINTS); pip install headway keeps pyproject.toml's ranges."; \
	  echo "# Written by make constraints (pip freeze of .venv, headway left out): do not edit by hand."; \
	  cat $(CONSTRAINTS).new; } > $(CONSTRAINTS)
	rm $(CONSTRAINTS).new

# Switch .venv's Flower: FLOWER=1.42 (HTTP Fleet, behind the Fleet proxy: needs nginx) or 1.39 (gRPC Fleet, the
# default constraints.txt installs). Only Flower and the pins that differ move (constraints-flower-1.42.txt).
FLOWER ?= 1.39
flower: setup
	@test "$(FLOWER)" = 1.39 || test -f constraints-flower-$(FLOWER).txt || { echo "FLOWER=$(FLOWER): tested are 1.39 and 1.42"; exit 2; }
	$(PY) -m pip install --quiet --no-cache-dir -c $(if $(filter 1.39,$(FLOWER)),$(CONSTRAINTS),constraints-flower-$(FLOWER).txt) \
		"flwr[simulation,dp]==$(FLOWER).0" cryptography uv
	$(PY) -m pip check

# The main job: FedLog on FedLog's Table 1 MNIST setup (50 clients, 100 rounds).
# results/main is this target's own folder: each `make run` replaces the last one's results.
run: setup
	$(VENV)/bin/headway run benchmarks/configs/mnist-table1.toml --set algorithm=fedlog --out results/main --overwrite

# Everything but the slow system tests: unit, Flower simulation and loopback deployment tests (7–13 minutes on 2 cores, by the machine).
test: setup
	$(PY) -m pytest -q -m "not system" --durations=15

# Faults survived by real processes: a SuperNode killed mid-round and restarted, a hung ClientApp,
# a SuperLink restarted on its database, an unknown body, SIGTERM, node-local refusals; FedProf on a
# second data set; the byte probe and FedPFT's chain over the Fleet API; with the loopback deployment tests of `test`
# again, for CI runs this on the other Flower (15–25 minutes on 2 cores; CI runs it after `test`, on Flower 1.42).
test-system: setup
	$(PY) -m pytest -q -m "system or deployment"

# Unit tests only (no Flower engine, no processes, nothing marked slow): about five minutes.
test-fast: setup
	$(PY) -m pytest -q -m "not integration and not deployment and not system and not slow"

# Lint, format and types over the whole tree (CI runs it before the tests).
# mypy reads the code as Python imports it, headway.core and the rest: from a tree of links laid out as
# the wheel installs it (build/mypy/headway), rebuilt each time (pyproject.toml's [tool.mypy]).
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	rm -rf build/mypy && mkdir -p build/mypy/headway
	for f in headway/*.py; do ln -s "$(CURDIR)/$$f" build/mypy/headway/; done
	for p in core client server strategies simulation; do ln -s "$(CURDIR)/$$p" build/mypy/headway/$$p; done
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) results .pytest_cache
