"""Temporary re-export of gpusweep.db for campaigns/engine.py while issue 24's parts are built in
parallel (the engine moves into a package meanwhile). The coordinator deletes this module after
merging, once the engine imports gpusweep.db itself; nothing else may import it."""

from gpusweep.db.bulk import db_datetime, db_json, insert_rows, insert_sql, marks
from gpusweep.db.reads import (
    Loader,
    loader,
    prepared_cursor,
    read_date,
    read_datetime,
    read_json,
    select_instances,
    select_rows,
)

__all__ = ["Loader", "db_datetime", "db_json", "insert_rows", "insert_sql", "loader", "marks", "prepared_cursor",
           "read_date", "read_datetime", "read_json", "select_instances", "select_rows"]
