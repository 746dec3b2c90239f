# Two commands do everything: `make run` and `make test`. Each sets itself up (virtual
# environment, dependencies, migrations) idempotently, with nothing but Python 3.11+.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml clients/python/pyproject.toml | cksum | cut -d' ' -f1)
PYTEST_ARGS ?=
# Test processes (pytest-xdist). A test module stays in one process (its module fixtures start
# once), and modules keep their collection order: browser tests last (tests/conftest.py).
# Three on two cores: many tests wait (on a subprocess starting, a provider's timeout, a
# browser), and a third process fills those waits.
TEST_WORKERS ?= 3

.PHONY: run cluster test lint chaos bench clean

$(STAMP): pyproject.toml clients/python/pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]' -e './clients/python[langgraph,openai-agents]'  # the agent client and its tests
	@rm -f $(VENV)/.installed-*
	@touch $@

run: $(STAMP)
	$(PY) manage.py run_embedded

# The distributed mode on this machine (production settings; PostgreSQL and Redis must be running).
cluster: $(STAMP)
	$(PY) manage.py run_cluster

test: $(STAMP)
	$(PY) manage.py makemigrations --check --dry-run > /dev/null
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) scripts/check_imports.py

chaos: $(STAMP)
	$(PY) manage.py chaos --trials 20

clean:
	rm -rf var artifacts staticfiles
