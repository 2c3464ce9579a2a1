# Every target runs from a clean checkout: the venv is created on demand and reinstalled
# only when pyproject.toml changes. Postgres and Redis are found or started by the test
# harness itself (tests/conftest.py -> ops/servers/resolve.py; last, from the `embedded`
# extra's wheels), so make needs nothing but Python 3.11+ and the package index.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.runfleet-installed

.PHONY: test test-fast lint docs demo clean browser ha mutate bench

# The suite in two passes, both always run and both must pass: every test not marked
# `serial` on $(WORKERS) pytest-xdist workers (each with its own throwaway servers; whole
# files per worker, so module fixtures are built once), then the `serial` ones alone: their
# bounds in seconds need the machine to themselves (tests/support/tiers.py lists them).
# WORKERS=2 by default: measured on the two-core machine, the first pass takes 20 min on
# two workers (about 27 min in one process) with no test starved; four workers beside
# other load starved the takeover and chaos tests. WORKERS=0 runs it in one process.
WORKERS ?= 2
PARALLEL := -n $(WORKERS) --dist loadfile
test: lint docs browser ha
	@status=0; \
	$(BIN)/pytest -q $(PARALLEL) -m "not serial" || status=$$?; \
	$(BIN)/pytest -q -m serial || status=$$?; \
	exit $$status

# For iteration, not a substitute for `make test`: the suite less its chaos, partition,
# failover and benchmark tiers and the serial tests, on the same workers; no lint or docs.
test-fast: $(STAMP)
	$(BIN)/pytest -q $(PARALLEL) -m "not (chaos or partition or ha or bench or serial)"

# The docs site (mkdocs.yml, docs/): --strict fails on a broken link, a missing page or
# an API reference that does not resolve; no network (no fonts, no CDN). Into build/site.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The dashboard's browser test drives Debian's Chromium headless. As root with apt, install
# it when missing (`apt-get update` only if the first try fails); otherwise, or if that
# fails, only say so: the test then skips naming the command. Never fails `make test`.
BROWSER_PKGS := chromium chromium-driver
browser:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y $(BROWSER_PKGS) || { apt-get update && apt-get install -y $(BROWSER_PKGS); } \
	  || echo "browser: could not install $(BROWSER_PKGS); the browser test will skip"; \
	else echo "browser: no chromium; the browser test will skip (apt-get install -y $(BROWSER_PKGS))"; fi

# The failover suite (tests/ha) runs a throwaway Patroni cluster (tests/servers/patroni.py)
# on etcd, both Debian packages. As root with apt, install them when missing, as for the browser; otherwise
# only say so: the suite then skips naming the command. Never fails `make test`.
HA_PKGS := patroni etcd-server
ha:
	@if command -v patroni >/dev/null 2>&1 && command -v etcd >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y --no-install-recommends $(HA_PKGS) \
	  || { apt-get update && apt-get install -y --no-install-recommends $(HA_PKGS); } \
	  || echo "ha: could not install $(HA_PKGS); the failover suite will skip"; \
	else echo "ha: no patroni/etcd; the failover suite will skip (apt-get install -y $(HA_PKGS))"; fi

# The main job: a live fleet of three workers survives one of them being SIGKILLed.
# Services: RUNFLEET_DATABASE_URL / RUNFLEET_REDIS_URL if set, else Docker, else throwaway
# local servers (ops/servers/resolve.py resolves them, as for the tests).
demo: $(STAMP)
	$(BIN)/python -m runfleet.ops.demo

# The benchmarks beside runfleet's peers (bench/: rq, Celery, DBOS), from this checkout's
# root and never from the wheel: `make bench ARGS="fleet --plan bench/plans/tiny.toml"`;
# without ARGS, the commands. Not part of `make test` (its smoke runs are, tier `bench`).
bench: $(STAMP)
	$(BIN)/python -m bench $(or $(ARGS),--help)

# Mutation testing of ONE module against the tests tests/mutation/targets.toml maps it to
# (`make mutate MODULE=worker/lease.py`; `make mutate` lists the targets; ARGS=--retest
# re-runs only the last run's survivors; ARGS='--only Class.method' only that function's
# mutants). One mutant at a time, minutes per module; results stay in build/mutate/. Not
# part of `make test`.
MODULE ?=
ARGS ?=
mutate: $(STAMP)
	$(BIN)/python -m tests.mutation.mutate $(if $(MODULE),$(MODULE) $(ARGS),--list)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml Makefile | $(BIN)/python
	$(BIN)/python -m pip install -e '.[dev,bench,dashboard,embedded]'
	touch $@

clean:
	rm -rf .pytest_cache .mypy_cache .ruff_cache .hypothesis .services *.egg-info build/mutate build/site dist
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +
