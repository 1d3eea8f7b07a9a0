"""Every hand-written statement runs on the engine the suite runs on (CI runs SQLite and PostgreSQL).

Each app's queries.py yields its statements with parameters of the right shape (`examples()`);
each is executed in a transaction rolled back at once, so a name the schema lacks, a type the
engine refuses or a placeholder too many fails here rather than in production. The test also
checks the examples are complete: every public function of the module is called and every SQL
constant is part of a statement run (`ONLY` names those one engine never runs; `PREPARED` those
that also run through gpusweep.db's prepared cursor, which binds on the server on PostgreSQL).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from django.apps import apps
from django.db import connection, transaction

from gpusweep.db.reads import prepared_cursor
from tests.foundation.test_sql_names import SQL
from tests.helpers import REPO

pytestmark = pytest.mark.django_db


def query_modules() -> list[str]:
    found = []
    for config in apps.get_app_configs():
        root = Path(config.path)
        if REPO in root.parents:
            found += sorted(".".join(path.relative_to(REPO).with_suffix("").parts) for path in root.rglob("queries.py"))
    return found


def test_it_knows_the_apps_statements():
    assert {"advisories.queries", "inventory.queries"} <= set(query_modules())


def _public(module: ModuleType) -> dict[str, Any]:
    skip = module.ONLY.get(connection.vendor, frozenset()) if hasattr(module, "ONLY") else frozenset()
    others = set().union(*getattr(module, "ONLY", {}).values()) - skip
    return {name: value for name, value in vars(module).items()
            if not name.startswith("_") and name != "examples" and name not in others
            and ((_function(value) and value.__module__ == module.__name__)
                 or (name.isupper() and isinstance(value, str | tuple) and SQL.search(" ".join(value)
                                                                                       if isinstance(value, tuple)
                                                                                       else value)))}


def _function(value: Any) -> bool:
    return callable(value) and not inspect.isclass(value) and hasattr(value, "__module__")


def _counting(function: Callable[..., Any], calls: dict[str, list[Any]], name: str) -> Callable[..., Any]:
    @functools.wraps(function)
    def counted(*args: Any, **kwargs: Any) -> Any:
        result = function(*args, **kwargs)
        calls[name].append(result)
        return result

    return counted


def _run(sql: str, params: list[Any], prepared: bool) -> None:
    with transaction.atomic():
        with prepared_cursor() if prepared else connection.cursor() as cursor:
            cursor.execute(sql, params)
        transaction.set_rollback(True)


@pytest.mark.parametrize("name", query_modules())
def test_every_statement_runs(name: str, monkeypatch: pytest.MonkeyPatch):
    module = importlib.import_module(name)
    public = _public(module)
    calls: dict[str, list[Any]] = {n: [] for n, value in public.items() if _function(value)}
    for function in calls:
        monkeypatch.setattr(module, function, _counting(public[function], calls, function))
    prepared_names = getattr(module, "PREPARED", frozenset())
    statements = list(module.examples())
    assert statements, f"{name}.examples() yields nothing"
    prepared_texts = {text for n in prepared_names & calls.keys() for text in calls[n]}
    prepared_texts |= {public[n] for n in prepared_names if n in public and isinstance(public[n], str)}
    for sql, params in statements:
        try:
            _run(sql, params, prepared=False)
            if connection.vendor == "postgresql" and sql in prepared_texts:
                _run(sql, params, prepared=True)
        except Exception as exc:
            raise AssertionError(f"{name}: {exc}\n{sql}\nparams {params}") from exc
    assert not [n for n, made in calls.items() if not made], "functions examples() never calls"
    texts = " ".join(sql for sql, _params in statements)
    constants = [(n, part) for n, value in public.items() if not _function(value)
                 for part in (value if isinstance(value, tuple) else (value,))]
    assert not [n for n, part in constants if part not in texts], "constants no statement of examples() holds"
