# Two commands for users: `make run` and `make test`. Both create .venv when missing.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8000
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck pytest venv migrate demo clean

$(STAMP): requirements.txt requirements.lock agent/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt -c requirements.lock
	$(BIN)/python -m pip install --quiet -e agent -c requirements.lock
	touch $(STAMP)

venv: $(STAMP)

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

pytest: venv
	$(BIN)/pytest $(PYTEST_ARGS)

test: lint typecheck pytest

clean:
	rm -rf $(VENV) var .mypy_cache .ruff_cache .pytest_cache .import_linter_cache
