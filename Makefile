# Cosigner: two commands on a fresh machine: `make serve` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PORT   ?= 8080
DEMO_TENANT ?= demo

.PHONY: serve test test-sqlite test-postgres lint typecheck openapi lock demo bench clean

# Every dependency at the version requirements.lock pins: the versions the Docker image
# ships (the Dockerfile installs with the same constraints file).
$(STAMP): pyproject.toml requirements.lock $(wildcard clients/python/pyproject.toml)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c requirements.lock -e '.[dev]'
	if [ -f clients/python/pyproject.toml ]; then $(BIN)/pip install --quiet -c requirements.lock -e 'clients/python[all]'; fi
	touch $(STAMP)

## serve: install, migrate ./var/cosigner.db, create the demo tenant's keys (printed once), serve on 127.0.0.1:$(PORT)
serve: $(STAMP)
	mkdir -p var
	$(BIN)/cosigner serve --host 127.0.0.1 --port $(PORT) --demo-tenant $(DEMO_TENANT)

## test: install, make sure PostgreSQL answers, run the suite on SQLite and on PostgreSQL
test: $(STAMP)
	scripts/ensure-postgres.sh
	scripts/ensure-test-deps.sh
	$(BIN)/ruff check .
	$(BIN)/pytest --db sqlite
	$(BIN)/pytest --db postgres

test-sqlite: $(STAMP)
	$(BIN)/pytest --db sqlite

test-postgres: $(STAMP)
	scripts/ensure-postgres.sh
	$(BIN)/pytest --db postgres

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

openapi: $(STAMP)
	$(BIN)/python scripts/gen_openapi.py > openapi.yaml

## lock: pin the installed dependency closure into requirements.lock (after changing a dependency)
lock:
	$(BIN)/python scripts/lock.py > requirements.lock

demo: $(STAMP)
	$(BIN)/cosigner demo

bench: $(STAMP)
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) var test-output .pytest_cache .mypy_cache .ruff_cache
