# Every target runs from a clean checkout: the venv is created on demand and reinstalled
# only when pyproject.toml changes. Postgres and Redis are found or started by the test
# harness itself (tests/conftest.py -> ops/services.py), so make needs nothing else.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.runfleet-installed

.PHONY: test lint demo clean

test: lint
	$(BIN)/pytest -q

# The main job: a live fleet of three workers survives one of them being SIGKILLed.
# Services: RUNFLEET_DATABASE_URL / RUNFLEET_REDIS_URL if set, else Docker, else throwaway
# local servers (ops/services.py resolves them, as for the tests).
demo: $(STAMP)
	$(BIN)/python -m ops.demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml Makefile | $(BIN)/python
	$(BIN)/python -m pip install -e '.[dev,bench]'
	touch $@

clean:
	rm -rf .pytest_cache .mypy_cache .ruff_cache .hypothesis .services *.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +
