# The two quick-start commands (README): `make demo` runs the main job, `make test` the whole
# suite. Each creates the virtual environment when it is missing and installs the project
# (the CPU build of torch from this machine's disk first, so pip never pulls a CUDA build).

VENV ?= .venv
PYTHON := $(VENV)/bin/python
PIP := $(PYTHON) -m pip -q
# Where a PostgreSQL for the ledger tests lives (a database the tests may create others from).
CAMPAIGN_TEST_POSTGRES ?= postgresql://postgres@127.0.0.1:5432/test

.PHONY: demo test lint clean

$(PYTHON):
	python3 -m venv $(VENV)
	$(PIP) install --upgrade pip

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

# The environment's bin first on PATH, as an activated venv has it (tests run the installed
# console script).
test: $(VENV)/.installed-test lint
	scripts/test-services
	PATH="$(abspath $(VENV))/bin:$$PATH" CAMPAIGN_REQUIRE_ALL=1 \
		CAMPAIGN_TEST_POSTGRES=$(CAMPAIGN_TEST_POSTGRES) $(PYTHON) -m pytest --durations=25

clean:
	rm -rf $(VENV) campaign-demo campaign-artifacts
