"""Hand-written SQL names no table or column itself: they come from the models' _meta.

Every string literal of the project's apps (f-strings with their holes left out; docstrings,
tests and migrations aside) that reads as SQL is checked against the table and column names of
every installed model, so a renamed or added field can never leave a statement behind. SQL also
lives only in an app's queries.py or in gpusweep/db.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.apps import apps

from tests.helpers import REPO

# SQL outside a queries.py that touches no model's table: the health check's liveness probe, and the
# answer cache's generation table and triggers (its own table, named by its own constants).
PLACES = ("gpusweep/db/", "gpusweep/health.py", "gpusweep/datagen.py")

# A string is SQL when it has a statement's keyword (upper case, as this project writes them) or
# a placeholder compared with something.
SQL = re.compile(r"\b(SELECT|INSERT INTO|UPDATE|DELETE FROM|FROM|WHERE|JOIN|VALUES|RETURNING|SET LOCAL|COPY|"
                 r"ORDER BY|GROUP BY|IS NULL|IS NOT NULL|NOT EXISTS)\b|(=|<>|<|>|\bIN \(|,)\s*%s")
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _app_files() -> Iterator[Path]:
    for config in apps.get_app_configs():
        root = Path(config.path)
        if REPO not in root.parents or "site-packages" in root.parts:
            continue  # (also when the venv is inside the checkout)  # Django's and third-party apps
        for path in sorted(root.rglob("*.py")):
            if "migrations" not in path.parts:  # a migration is frozen to the schema of its day
                yield path


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def literals(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every string literal but docstrings; an f-string's holes become `{}`."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    inner: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            inner.update(id(part) for part in ast.walk(node) if part is not node)
            text = "".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values)
            yield node.lineno, text
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip | inner:
            yield node.lineno, node.value


def model_names() -> set[str]:
    names = set()
    for model in apps.get_models(include_auto_created=True):
        names.add(model._meta.db_table)
        names.update(field.column for field in model._meta.concrete_fields)
    return names


def typed_names(text: str, names: set[str]) -> set[str]:
    """The model names written in SQL `text` (quoted or not; string values and comments aside)."""
    text = re.sub(r"'[^']*'", "''", text)
    text = re.sub(r"--[^\n]*", "", text)
    return {word for word in WORD.findall(text) if word in names}


def _relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def sql_literals() -> Iterator[tuple[str, int, str]]:
    for path in _app_files():
        for line, text in literals(path.read_text()):
            if SQL.search(text):
                yield _relative(path), line, text


def test_it_finds_the_statements_it_checks():
    found = {(path, text.split()[0]) for path, _line, text in sql_literals() if text.split()}
    assert ("inventory/queries.py", "UPDATE") in found
    assert any(path == "advisories/queries.py" for path, _word in found)
    assert typed_names('SELECT n."name", x FROM inventory_node n -- state', {"name", "inventory_node", "state"}) \
        == {"name", "inventory_node"}
    assert typed_names("kind = 'name'", {"kind", "name"}) == {"kind"}


@pytest.mark.django_db(databases=[])
def test_no_table_or_column_name_is_typed_in_sql():
    names = model_names()
    offenders = [f"{path}:{line}: {sorted(typed)}" for path, line, text in sql_literals()
                 if (typed := typed_names(text, names))]
    assert not offenders, "names typed in SQL (take them from _meta, gpusweep.db.names):\n" + "\n".join(offenders)


def test_sql_lives_in_queries_modules():
    elsewhere = sorted({f"{path}:{line}" for path, line, _text in sql_literals()
                        if not path.endswith("/queries.py") and not path.startswith(PLACES)})
    assert not elsewhere, "SQL outside an app's queries.py:\n" + "\n".join(elsewhere)
