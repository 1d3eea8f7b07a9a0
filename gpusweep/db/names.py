"""Table and column names for hand-written SQL, taken from the models' ``_meta`` and quoted.

    n, nc = Table(Node, "n"), Table(NodeComponent, "nc")
    f"SELECT {nc.version} FROM {nc} JOIN {n} ON {n.id} = {nc.node_id} WHERE {n.name} = %s"

A ``Table``'s attributes are its fields' columns (by field name or attname: ``node`` and
``node_id`` are one column), qualified by the alias (or the table when it has none); ``Columns``
gives them bare, for an UPDATE's SET list and an INSERT's column list. A name that is no
concrete field raises at once, so a renamed field fails where its SQL is built, not when it runs.
Both engines quote identifiers alike ("name"), so the names are built once, at import or on
first use.
"""

from __future__ import annotations

from typing import Any

from django.db import connection, models


def quote(name: str) -> str:
    return str(connection.ops.quote_name(name))


def column(model: type[models.Model], name: str) -> str:
    """The column of `model`'s concrete field `name` (field name or attname), unquoted."""
    field = model._meta.get_field(name)
    if not isinstance(field, models.Field) or not field.column:
        raise ValueError(f"{model.__name__}.{name} is not a concrete column")
    return str(field.column)


class Columns:
    """`model`'s table (str()) and its columns unqualified (attributes), quoted."""

    def __init__(self, model: type[models.Model]) -> None:
        self._model = model
        self._table = quote(model._meta.db_table)

    def __str__(self) -> str:
        return self._table

    def __getattr__(self, name: str) -> str:
        if name.startswith("_"):
            raise AttributeError(name)
        value = quote(column(self._model, name))
        setattr(self, name, value)  # kept: a statement built per call looks its names up again
        return value

    def list(self, names: tuple[str, ...] | list[str]) -> str:
        """`a, b, c`: the columns of the fields `names`, comma-separated."""
        return ", ".join(quote(column(self._model, name)) for name in names)


class Table(Columns):
    """`model`'s table as FROM and JOIN name it (str(): the table and its alias) and its columns
    qualified by the alias, or by the table without one (attributes)."""

    def __init__(self, model: type[models.Model], alias: str = "") -> None:
        super().__init__(model)
        self._alias = alias
        self._prefix = f"{alias}." if alias else f"{self._table}."

    def __str__(self) -> str:
        return f"{self._table} {self._alias}" if self._alias else self._table

    def __getattr__(self, name: str) -> str:
        if name.startswith("_"):
            raise AttributeError(name)
        value = self._prefix + quote(column(self._model, name))
        setattr(self, name, value)
        return value


class Derived:
    """A relation the SQL makes itself (a CTE, a VALUES list, a subquery) whose columns are named
    after model fields: ``Derived("m", component=(NodeComponent, "component"))`` has ``m.component``,
    and its header (`m("component")`) for ``WITH`` lists the same names."""

    def __init__(self, alias: str, **fields: tuple[type[models.Model], str]) -> None:
        self._alias = alias
        self._columns = {name: quote(column(model, field)) for name, (model, field) in fields.items()}

    def __str__(self) -> str:
        return self._alias

    def __getattr__(self, name: str) -> str:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return f"{self._alias}.{self._columns[name]}"
        except KeyError:
            raise AttributeError(name) from None

    def bare(self, name: str) -> str:
        """The column `name` unqualified (a SELECT's `AS` names it)."""
        return self._columns[name]

    def header(self) -> str:
        """`alias(a, b, c)`: the relation with its columns, for WITH and `AS v(...)`."""
        return f"{self._alias}({', '.join(self._columns.values())})"

    def values(self, count: int, cast: tuple[str, ...] = ()) -> str:
        """`(%s, %s), (%s, %s)`: `count` rows of placeholders, each `%s::cast` where a cast is given."""
        row = ", ".join(f"%s::{c}" if c else "%s" for c in (cast or ("",) * len(self._columns)))
        return ", ".join([f"({row})"] * count)


def pairs(left: Any, right: Any, names: tuple[str, ...]) -> str:
    """`l.a = r.a AND l.b = r.b`: equality of the columns `names` of two relations."""
    return " AND ".join(f"{getattr(left, name)} = {getattr(right, name)}" for name in names)
