# The two quick-start commands (README): `make demo` runs the main job, `make test` the whole
# suite. Each creates the virtual environment when it is missing and installs the project
# (the CPU build of torch from this machine's disk first, so pip never pulls a CUDA build).

VENV ?= .venv
PYTHON := $(VENV)/bin/python
PIP := $(PYTHON) -m pip -q
# Where a PostgreSQL for the ledger tests lives (a database the tests may create others from).
CAMPAIGN_TEST_POSTGRES ?= postgresql://postgres@127.0.0.1:5432/test

.PHONY: demo test test-fast lint clean

$(PYTHON):
	python3 -m venv $(VENV)
	$(PIP) install --upgrade pip "setuptools>=77" wheel

$(VENV)/.installed: pyproject.toml | $(PYTHON)
	$(PIP) install torch==2.13.0
	$(PIP) install -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.installed
	$(PIP) install -e ".[test]"
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/campaign demo

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check .
	@# no formatter runs, so no formatter markers: they would only pretend one did
	@! grep -rn --include='*.py' '# fmt: \(skip\|off\|on\)' campaign tests benchmarks scripts

# The environment's bin first on PATH, as an activated venv has it (tests run the installed
# console script).
RUN_TESTS = PATH="$(abspath $(VENV))/bin:$$PATH" CAMPAIGN_REQUIRE_ALL=1 \
	CAMPAIGN_TEST_POSTGRES=$(CAMPAIGN_TEST_POSTGRES) $(PYTHON) -m pytest

# The whole suite: what .ci/run calls.
test: $(VENV)/.installed-test lint
	scripts/test-services
	$(RUN_TESTS) --durations=25

# The inner loop, under 3 minutes: every test that needs neither a real engine (SLURM, Ray,
# PgBouncer) nor a browser and is not one of the slow end-to-end ones, with nothing installed
# or started but the local PostgreSQL. FAST="not engine and not browser" keeps the slow ones;
# ARGS narrows to a package (ARGS=tests/ledger).
FAST ?= not engine and not browser and not slow
test-fast: $(VENV)/.installed-test
	scripts/test-services --postgres-only
	$(RUN_TESTS) -m "$(FAST)" --durations=10 $(ARGS)

clean:
	rm -rf $(VENV) campaign-demo campaign-artifacts
