"""The project's hand-written SQL layer, shared by every app (below all of them).

The ORM is the default. Plain statements are kept where a bench (bench/README.md) shows the ORM
misses a target, and then they follow three rules, checked by tests/foundation/test_sql_names.py
and tests/foundation/test_sql_statements.py:

- they live in their app's ``queries.py``;
- table and column names come from the models' ``_meta`` (``names.Table``), never typed in the text;
- INSERT column lists are every concrete field of the model (``bulk.insert_rows``), the ones a
  caller does not give filled from the field's default, so a new defaulted field needs no SQL change.

``bulk``: multi-row inserts (COPY on PostgreSQL) and database forms of values; ``reads``: rows and
instances read without compiling a query, and the prepared cursor for per-step statements;
``names``: quoted table and column names.
"""
