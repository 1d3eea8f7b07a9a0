"""Node lists from files: CSV and JSON, with an optional mapping for foreign layouts.

The whole file is read and checked before anything is written, then applied as one snapshot
in one transaction: a bad row stops the import with an error naming its line, and nothing is
imported. The file is the whole cluster: nodes of that cluster missing from it are marked
gone (unless `partial`).

CSV: one row per node. Columns are node fields (`name` required; `pool`, `gpu_model`,
`gpu_count`, `cpu_milli`, `memory_mib`, `service_state`, `scheduler_state`, `product_line`,
`os_family`, `agent_endpoint`), component versions, named after the component (`driver`,
`cuda`, `kernel`, ...; any other as `component:<name>`), and node facts (`gpu_architecture`,
`platform`, `container_toolkit_mode`; any other as `fact:<name>`). An unknown column is an error
(a typo must not silently drop data).

JSON: `{"nodes": [{"name": ..., "gpu_model": ..., "components": {"driver": ...}, "facts": {...}}, ...]}`
(or the bare list).

Mapping (JSON, `--mapping`): renames columns, fills defaults and per-GPU-model values, e.g.
inventory/mappings/alibaba-openb-2023.json:
`{"columns": {"sn": "name", "gpu": "gpu_count", "model": "gpu_model"},
  "defaults": {"components": {"kernel": "..."}},
  "models": {"T4": {"gpu_model": "Tesla T4", "pool": "t4", "components": {"driver": "550.163.01"}}}}`

Versions: a driver version that is not an NVIDIA driver version (e.g. `570.86.x`) is an error
in a file (files are typed by people; a typo there must not become a flagged unknown). Other
components in unknown formats are stored raw and flagged.

Limits: every value must fit its column (lengths and integer ranges from the Node model, checked
by inventory.services for every source), a CSV field is at most 128 KiB (csv's own limit), JSON
at most 32 levels deep, and no value holds a NUL character. A value beyond them is an error
naming its line, like any other bad row, never a traceback.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils.text import slugify

from gpusweep.parsers import JSONInputError, load_json
from inventory.choices import ChangeSource, ClusterKind
from inventory.models import Cluster
from inventory.services import InventoryError, ObservedNode, Snapshot, SyncResult, apply_snapshot, parse_component
from inventory.versions import DRIVER, KNOWN_COMPONENTS, KNOWN_FACTS

INT_FIELDS = ("gpu_count", "cpu_milli", "memory_mib")
TEXT_FIELDS = ("pool", "gpu_model", "service_state", "scheduler_state", "product_line", "os_family", "agent_endpoint")
NODE_COLUMNS = frozenset({"name", *INT_FIELDS, *TEXT_FIELDS})
MAPPINGS_DIR = Path(__file__).resolve().parent / "mappings"

Progress = Callable[[int], None]


@dataclass
class Mapping:
    columns: dict[str, str] = field(default_factory=dict)
    ignore: frozenset[str] = frozenset()
    defaults: dict[str, Any] = field(default_factory=dict)
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path | str | None) -> Mapping:
        if path is None:
            return cls()
        candidate = Path(path)
        if not candidate.exists() and (MAPPINGS_DIR / f"{path}.json").exists():
            candidate = MAPPINGS_DIR / f"{path}.json"  # shipped mappings by name: --mapping alibaba-openb-2023
        try:
            data = load_json(candidate.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, JSONInputError) as exc:
            raise InventoryError(f"mapping {path}: {exc}") from None
        if not isinstance(data, dict):
            raise InventoryError(f"mapping {path}: expected a JSON object")
        unknown = set(data) - {"columns", "ignore", "defaults", "models", "labels", "description"}
        if unknown:
            raise InventoryError(f"mapping {path}: unknown keys {sorted(unknown)}")
        shapes = {"columns": dict, "ignore": list, "defaults": dict, "models": dict, "labels": dict}
        wrong = sorted(key for key, kind in shapes.items() if not isinstance(data.get(key, kind()), kind))
        if wrong or not all(isinstance(v, dict) for v in data.get("models", {}).values()):
            raise InventoryError(f"mapping {path}: {', '.join(wrong) or 'models'} has the wrong shape "
                                 "(columns, defaults, labels and each model are objects; ignore is a list)")
        return cls(
            columns=dict(data.get("columns", {})),
            ignore=frozenset(data.get("ignore", [])),
            defaults=dict(data.get("defaults", {})),
            models=dict(data.get("models", {})),
            labels=dict(data.get("labels", {})),
        )

    def apply(self, record: dict[str, Any]) -> dict[str, Any]:
        """Defaults, then the record's GPU model's values, then the record's own values."""
        out: dict[str, Any] = {k: v for k, v in self.defaults.items() if k != "components"}
        components = dict(self.defaults.get("components", {}))
        model_key = record.get("gpu_model")
        per_model = self.models.get(str(model_key), {}) if model_key is not None else {}
        out.update({k: v for k, v in per_model.items() if k != "components"})
        components.update(per_model.get("components", {}))
        if model_key is not None and "gpu_model" in per_model:
            record = {**record, "gpu_model": per_model["gpu_model"]}
        out.update({k: v for k, v in record.items() if k != "components" and v not in ("", None)})
        components.update(record.get("components", {}))
        out["components"] = components
        return out


def _int(value: Any, column: str, where: str) -> int:
    if isinstance(value, bool):
        raise InventoryError(f"{where}: {column} {value!r} is not a whole number")
    if isinstance(value, int):
        number = value
    else:
        try:
            number = int(str(value).strip())
        except ValueError:
            raise InventoryError(f"{where}: {column} {value!r} is not a whole number") from None
    if number < 0:
        raise InventoryError(f"{where}: {column} {number} is negative")
    return number


def to_observed(record: dict[str, Any], where: str, mapping: Mapping) -> ObservedNode:
    merged = mapping.apply(record)
    name = str(merged.get("name", "")).strip()
    if not name:
        raise InventoryError(f"{where}: no node name")
    node = ObservedNode(name=name, origin=f"{where} (node {name!r})")
    for column in INT_FIELDS:
        if merged.get(column) not in (None, ""):
            setattr(node, column, _int(merged[column], column, node.origin))
    for column in TEXT_FIELDS:
        if merged.get(column) not in (None, ""):
            setattr(node, column, str(merged[column]).strip())
    own_labels = merged.get("labels") or {}
    if not isinstance(own_labels, dict):
        raise InventoryError(f"{node.origin}: labels must be an object of name: value")
    labels = {**mapping.labels, **own_labels}
    if labels:
        node.labels = {str(k): str(v) for k, v in labels.items()}
    facts = merged.get("facts") or {}
    if not isinstance(facts, dict):
        raise InventoryError(f"{node.origin}: facts must be an object of name: value")
    if facts := {str(k): str(v).strip() for k, v in facts.items() if v not in (None, "")}:
        node.facts = facts
    components = merged.get("components") or {}
    if not isinstance(components, dict):
        raise InventoryError(f"{node.origin}: components must be an object of name: version")
    for component, raw in components.items():
        if raw in (None, ""):
            continue
        name_, version = parse_component(str(component), str(raw), node.origin)
        if name_ == DRIVER and version.flagged:
            raise InventoryError(
                f"{node.origin}: driver version {raw!r} is not an NVIDIA driver version (like 570.86.15)"
            )
        node.components[name_] = version.raw
    return node


def _csv_rows(reader: Any, source: str) -> Iterator[list[str]]:
    """The reader's rows; a field over csv's limit (128 KiB) is an error naming its line."""
    while True:
        try:
            yield next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise InventoryError(f"{source} line {reader.line_num}: {exc}") from None


def _csv_records(text: str, source: str, mapping: Mapping) -> Iterator[tuple[str, dict[str, Any]]]:
    reader = csv.reader(io.StringIO(text, newline=""))
    rows = _csv_rows(reader, source)
    header = next(rows, None)
    if header is None:
        raise InventoryError(f"{source}: the file is empty")
    columns = [mapping.columns.get(c.strip(), c.strip()) for c in header]
    if "name" not in columns:
        wanted = [k for k, v in mapping.columns.items() if v == "name"]
        hint = f" (the mapping reads it from {wanted[0]!r})" if wanted else ""
        raise InventoryError(f"{source}: missing column 'name'{hint}; columns are {header}")
    seen: set[str] = set()
    for index, column in enumerate(columns):
        if column in seen:
            raise InventoryError(f"{source}: column {header[index]!r} appears twice")
        seen.add(column)
        if column in mapping.ignore or column in NODE_COLUMNS or column in KNOWN_COMPONENTS or column in KNOWN_FACTS:
            continue
        if not column.startswith(("component:", "fact:")):
            raise InventoryError(
                f"{source}: unknown column {header[index]!r} (node fields: {sorted(NODE_COLUMNS)}; "
                f"components: {sorted(KNOWN_COMPONENTS)} or component:<name>; facts: {sorted(KNOWN_FACTS)} "
                "or fact:<name>)"
            )
    for row in rows:
        where = f"{source} line {reader.line_num}"
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(columns):
            raise InventoryError(f"{where}: {len(row)} values for {len(columns)} columns")
        record: dict[str, Any] = {"components": {}, "facts": {}}
        for column, cell in zip(columns, row, strict=True):
            if column in mapping.ignore:
                continue
            if column in KNOWN_COMPONENTS or column.startswith("component:"):
                record["components"][column.removeprefix("component:")] = cell.strip()
            elif column in KNOWN_FACTS or column.startswith("fact:"):
                record["facts"][column.removeprefix("fact:")] = cell.strip()
            else:
                record[column] = cell.strip()
        yield where, record


def _json_records(text: str, source: str, mapping: Mapping) -> Iterator[tuple[str, dict[str, Any]]]:
    try:
        data = load_json(text)
    except JSONInputError as exc:
        raise InventoryError(f"{source}: not valid JSON ({exc})") from None
    nodes = data.get("nodes") if isinstance(data, dict) else data
    if not isinstance(nodes, list):
        raise InventoryError(f"{source}: expected {{\"nodes\": [...]}} or a list of nodes")
    for index, item in enumerate(nodes):
        where = f"{source} nodes[{index}]"
        if not isinstance(item, dict):
            raise InventoryError(f"{where}: expected an object")
        record: dict[str, Any] = {
            mapping.columns.get(str(k), str(k)): v for k, v in item.items() if k not in mapping.ignore
        }
        unknown = set(record) - NODE_COLUMNS - {"components", "labels", "facts"}
        if unknown:
            raise InventoryError(f"{where}: unknown keys {sorted(unknown)}")
        yield where, record


def read_nodes(path: Path, mapping: Mapping | None = None, progress: Progress | None = None) -> list[ObservedNode]:
    """Parse and check the whole file; raise InventoryError naming the line of the first bad row."""
    mapping = mapping or Mapping()
    source = path.name
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise InventoryError(f"{path}: {exc.strerror}") from None
    limit = settings.GPUSWEEP_IMPORT_MAX_BYTES
    if size > limit:
        raise InventoryError(
            f"{source} is {size / 1024 / 1024:.1f} MiB, over the import limit of {limit / 1024 / 1024:.0f} MiB "
            "(GPUSWEEP_IMPORT_MAX_MB); split the file or raise the limit"
        )
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InventoryError(f"{source}: not UTF-8 text (byte {exc.start})") from None
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise InventoryError(f"{source} line {line}: a NUL character (a binary file?)")
    is_json = path.suffix.lower() == ".json" or text.lstrip()[:1] in ("{", "[")
    records = _json_records(text, source, mapping) if is_json else _csv_records(text, source, mapping)
    nodes: list[ObservedNode] = []
    for where, record in records:
        nodes.append(to_observed(record, where, mapping))
        if progress is not None:
            progress(1)
    return nodes


def import_file(
    path: Path,
    cluster_name: str | None = None,
    mapping: Mapping | None = None,
    *,
    partial: bool = False,
    user_id: int | None = None,
    progress: Progress | None = None,
) -> tuple[Cluster, SyncResult]:
    """Import `path` into the (static) cluster `cluster_name`, created if missing. One transaction."""
    nodes = read_nodes(path, mapping, progress)
    name = cluster_name or slugify(path.stem) or "static"
    with transaction.atomic():
        cluster, _created = Cluster.objects.get_or_create(
            name=name, defaults={"kind": ClusterKind.STATIC, "description": f"imported from {path.name}"}
        )
        snapshot = Snapshot(nodes=nodes, workloads=None, complete=not partial, replace_components=True)
        result = apply_snapshot(cluster, snapshot, ChangeSource.FILE, user_id=user_id)
    return cluster, result
