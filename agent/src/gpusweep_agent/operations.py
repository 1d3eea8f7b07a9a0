"""Operations: every mutating call's record, persisted in the state folder.

One JSON file per operation id under ``<state>/operations/``. Creating one is atomic and
exclusive, so a repeated id (a retry, a second caller, a request after an agent restart) gets the
first operation back and nothing runs twice. Long work runs in a background thread and updates the
record as it goes; the caller polls ``GET /v1/operations/<id>``.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .util import read_json, utcnow, write_json_atomic

log = logging.getLogger(__name__)

OPERATION_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
FINISHED = ("succeeded", "failed")


class OperationError(Exception):
    """An operation finished badly; `result` goes into the record next to the message."""

    def __init__(self, message: str, result: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.result = result or {}


class OperationDeferred(Exception):
    """The operation stays running: the next agent process finishes it (a reboot)."""


class OperationConflict(Exception):
    """An operation id was reused for a different request."""


Runner = Callable[[dict[str, Any]], dict[str, Any]]


class OperationStore:
    def __init__(self, state_dir: Path) -> None:
        self.folder = state_dir / "operations"
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def _path(self, op_id: str) -> Path:
        return self.folder / f"{op_id}.json"

    def get(self, op_id: str) -> dict[str, Any] | None:
        if not OPERATION_ID_RE.match(op_id):
            return None
        record: dict[str, Any] | None = read_json(self._path(op_id))
        return record

    def public(self, record: dict[str, Any]) -> dict[str, Any]:
        keys = ("id", "kind", "state", "result", "error", "created_at", "started_at", "finished_at")
        return {k: record.get(k) for k in keys}

    def all(self) -> list[dict[str, Any]]:
        records = [read_json(p) for p in sorted(self.folder.glob("*.json"))]
        return [r for r in records if r]

    def update(self, op_id: str, **fields: Any) -> dict[str, Any]:
        with self._lock:
            record = read_json(self._path(op_id)) or {}
            record.update(fields)
            write_json_atomic(self._path(op_id), record)
            return record

    def create(self, op_id: str, kind: str, params: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Return (record, created). An existing id with other parameters raises OperationConflict."""
        if not OPERATION_ID_RE.match(op_id):
            raise ValueError("operation_id must be 1-128 characters of letters, digits and ._:-")
        with self._lock:
            existing = read_json(self._path(op_id))
            if existing is not None:
                if existing.get("kind") != kind or existing.get("params") != params:
                    raise OperationConflict(
                        f"operation {op_id} already exists as {existing.get('kind')} with other parameters"
                    )
                return existing, False
            record = {
                "id": op_id, "kind": kind, "params": params, "state": "pending", "result": None,
                "error": None, "created_at": utcnow(), "started_at": None, "finished_at": None,
            }
            write_json_atomic(self._path(op_id), record)
            return record, True

    def run(self, op_id: str, runner: Runner, background: bool = True) -> None:
        def target() -> None:
            record = self.update(op_id, state="running", started_at=utcnow())
            try:
                result = runner(record)
            except OperationDeferred:
                return
            except OperationError as exc:
                self.update(op_id, state="failed", error=str(exc), result=exc.result, finished_at=utcnow())
            except Exception as exc:
                log.exception("operation %s failed", op_id)
                self.update(op_id, state="failed", error=f"{type(exc).__name__}: {exc}", finished_at=utcnow())
            else:
                self.update(op_id, state="succeeded", result=result, finished_at=utcnow())

        if background:
            threading.Thread(target=target, name=f"op-{op_id}", daemon=True).start()
        else:
            target()
