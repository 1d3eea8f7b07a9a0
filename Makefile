# Two commands for users: `make run` and `make test` (on the embedded SQLite default, or on what
# DATABASE_URL and CELERY_BROKER_URL name); `make test-postgres` runs every test that touches the
# database or the broker again on the local PostgreSQL + Redis. All create .venv when missing.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8000
STAMP := $(VENV)/.installed
# pytest-xdist workers (0: one process) for the tests that share no outside resource; those that
# do (conftest.py's GROUPS: Slurm, CRIU, the browser) run after them, its LANES side by side
# (scripts/pytest-phases.sh). `auto` is one and a half per core: those tests wait on subprocesses,
# servers and sockets more than they compute (2 cores: 3 workers took the phase from 353 s to 200 s).
PYTEST_WORKERS ?= auto
POSTGRES_URL ?= postgres://root@127.0.0.1:5432/test
REDIS_URL ?= redis://127.0.0.1:6379/0

# The test OpenID provider (npm's oidc-provider) the single sign-on tests start: tests/oidc/.
OIDC_PROVIDER := tests/oidc/node_modules/.package-lock.json

.PHONY: run test test-postgres lint typecheck pytest venv oidc-provider migrate demo clean

$(STAMP): requirements.txt requirements.lock agent/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt -c requirements.lock
	$(BIN)/python -m pip install --quiet -e agent -c requirements.lock
	touch $(STAMP)

venv: $(STAMP)

$(OIDC_PROVIDER): tests/oidc/package.json tests/oidc/package-lock.json
	npm ci --prefix tests/oidc --no-audit --no-fund --loglevel=error
	touch $@

oidc-provider: $(OIDC_PROVIDER)

migrate: venv
	$(BIN)/python manage.py migrate --noinput

run: migrate
	$(BIN)/python manage.py ensure_demo_admin
	$(BIN)/python manage.py serve --port $(PORT) $(if $(filter 0,$(DEMO)),,--demo)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/lint-imports

typecheck: venv
	$(BIN)/mypy

pytest: venv $(OIDC_PROVIDER)
	bash scripts/pytest-phases.sh $(BIN) $(PYTEST_WORKERS) $(PYTEST_ARGS)

test: lint typecheck pytest

# Every test that touches the database or the broker, again on PostgreSQL + Redis (the others read
# neither and ran in `make test`: conftest.touches_database).
test-postgres: venv
	DATABASE_URL=$(POSTGRES_URL) CELERY_BROKER_URL=$(REDIS_URL) $(MAKE) pytest PYTEST_ARGS="--database-tests-only $(PYTEST_ARGS)"

clean:
	rm -rf $(VENV) var .mypy_cache .ruff_cache .pytest_cache .import_linter_cache tests/oidc/node_modules
