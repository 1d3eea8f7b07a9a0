"""What the test API server shares with a real one, written from the Kubernetes API conventions:
label and field selectors, the three patch types (JSON merge, strategic merge for the fields the
clients here patch, JSON patch), Status errors and server-side printing (Table)."""

from __future__ import annotations

import copy
import datetime as dt
import json
import re
from typing import Any

# Lists a strategic merge patch merges element by element, by this key (the Go types' patchMergeKey).
# Node taints and pod tolerations are atomic lists in the OpenAPI schema: a patch replaces them whole.
MERGE_KEYS = {
    ("metadata", "ownerReferences"): "uid",
    ("spec", "containers"): "name",
    ("spec", "initContainers"): "name",
    ("status", "conditions"): "type",
}


class ApiError(Exception):
    """An answer other than success, as the API server words it (a metav1.Status)."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.details, self.headers = code, reason, details or {}, headers or {}

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                "message": str(self), "reason": self.reason, "code": self.code}
        if self.details:
            body["details"] = self.details
        return body


def not_found(kind: str, name: str, group: str = "") -> ApiError:
    what = f"{kind}.{group}" if group else kind
    return ApiError(404, "NotFound", f'{what} "{name}" not found', {"name": name, "group": group, "kind": kind})


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def age(timestamp: str | None) -> str:
    """Age as kubectl prints it (apimachinery's HumanDuration, to the precision a test reads)."""
    if not timestamp:
        return "<unknown>"
    seconds = int((dt.datetime.now(dt.UTC) - dt.datetime.fromisoformat(timestamp.replace("Z", "+00:00")))
                  .total_seconds())
    if seconds < 120:
        return f"{max(seconds, 0)}s"
    if seconds < 3600 * 3:
        return f"{seconds // 60}m"
    if seconds < 86400 * 2:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


# -- selectors ---------------------------------------------------------------------------
_SET_RE = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_selector(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    if current.strip():
        parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def label_matcher(selector: str) -> Any:
    """A predicate over a labels dict for a label selector string (=, ==, !=, in, notin, key, !key)."""
    terms: list[tuple[str, str, set[str]]] = []
    for term in _split_selector(selector or ""):
        if match := _SET_RE.match(term):
            terms.append((match.group(2), match.group(1), {v.strip() for v in match.group(3).split(",")}))
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            terms.append(("notin", key, {value}))
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            terms.append(("in", key, {value}))
        elif term.startswith("!"):
            terms.append(("absent", term[1:].strip(), set()))
        else:
            terms.append(("present", term, set()))

    def test(labels: dict[str, str] | None) -> bool:
        labels = labels or {}
        for op, key, values in terms:
            if (op == "in" and labels.get(key) not in values) or (op == "notin" and labels.get(key) in values) \
                    or (op == "absent" and key in labels) or (op == "present" and key not in labels):
                return False
        return True

    return test


def matches_label_selector(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A metav1.LabelSelector (matchLabels, matchExpressions) against labels; an empty one matches all."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], set(expr.get("values") or [])
        present = key in labels
        if (op == "In" and labels.get(key) not in values) or (op == "NotIn" and present and labels[key] in values) \
                or (op == "Exists" and not present) or (op == "DoesNotExist" and present):
            return False
    return True


def field_value(obj: dict[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def field_matcher(selector: str) -> Any:
    terms = []
    for term in _split_selector(selector or ""):
        key, value = (s.strip() for s in re.split(r"!=|==|=", term, maxsplit=1))
        terms.append((key, value, "!=" in term))
    return lambda obj: all((field_value(obj, key) == value) != negate for key, value, negate in terms)


# -- patches -----------------------------------------------------------------------------
def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any, path: tuple[str, ...] = ()) -> Any:
    """Strategic merge patch for the fields clients here send: maps merge, null deletes, lists with
    a merge key merge by it (with ``$patch: delete``), other lists are replaced; ``$setElementOrder``
    and ``$retainKeys`` directives are accepted."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key in ("$retainKeys", "$patch"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            result[field] = [v for v in result.get(field) or [] if v not in value]
            continue
        if value is None:
            result.pop(key, None)
            continue
        merge_key = MERGE_KEYS.get((*path[-1:], key)) if path else None
        if isinstance(value, list) and merge_key:
            result[key] = _merge_list(result.get(key) or [], value, merge_key, (*path, key))
        elif isinstance(value, dict):
            result[key] = strategic_merge_patch(result.get(key), value, (*path, key))
        else:
            result[key] = copy.deepcopy(value)
    return result


def _merge_list(current: list[Any], patch: list[Any], merge_key: str, path: tuple[str, ...]) -> list[Any]:
    merged = [copy.deepcopy(item) for item in current]
    for item in patch:
        if not isinstance(item, dict):
            continue
        index = next((i for i, old in enumerate(merged) if old.get(merge_key) == item.get(merge_key)), None)
        if item.get("$patch") == "delete":
            if index is not None:
                merged.pop(index)
        elif index is None:
            merged.append({k: v for k, v in item.items() if not k.startswith("$")})
        else:
            merged[index] = strategic_merge_patch(merged[index], item, path)
    return merged


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def json_patch(target: Any, operations: list[dict[str, Any]]) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, test, copy, move)."""
    doc = copy.deepcopy(target)
    for op in operations:
        kind, parts = op.get("op"), _pointer(op.get("path", ""))
        if kind in ("copy", "move"):
            source = _pointer(op["from"])
            value = _get(doc, source)
            if kind == "move":
                doc = _remove(doc, source)
            doc = _add(doc, parts, copy.deepcopy(value))
        elif kind == "add":
            doc = _add(doc, parts, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            doc = _remove(doc, parts)
        elif kind == "replace":
            _get(doc, parts)  # must exist
            doc = _add(_remove(doc, parts), parts, copy.deepcopy(op.get("value")))
        elif kind == "test":
            if _get(doc, parts) != op.get("value"):
                raise ApiError(422, "Invalid", f"the test operation failed at {op.get('path')}")
        else:
            raise ApiError(400, "BadRequest", f"unknown JSON patch operation {kind!r}")
    return doc


def _get(doc: Any, parts: list[str]) -> Any:
    for part in parts:
        try:
            doc = doc[int(part)] if isinstance(doc, list) else doc[part]
        except (KeyError, IndexError, ValueError, TypeError):
            raise ApiError(422, "Invalid", f"path /{'/'.join(parts)} does not exist") from None
    return doc


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent = _get(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, list):
        parent.insert(len(parent) if last == "-" else int(last), value)
    elif isinstance(parent, dict):
        parent[last] = value
    else:
        raise ApiError(422, "Invalid", f"cannot add at /{'/'.join(parts)}")
    return doc


def _remove(doc: Any, parts: list[str]) -> Any:
    parent = _get(doc, parts[:-1])
    try:
        if isinstance(parent, list):
            parent.pop(int(parts[-1]))
        else:
            del parent[parts[-1]]
    except (KeyError, IndexError, ValueError, TypeError):
        raise ApiError(422, "Invalid", f"path /{'/'.join(parts)} does not exist") from None
    return doc


def apply_patch(obj: dict[str, Any], content_type: str, body: bytes) -> dict[str, Any]:
    try:
        patch = json.loads(body or b"null")
    except ValueError as exc:
        raise ApiError(400, "BadRequest", f"the patch is not JSON: {exc}") from None
    kind = content_type.split(";")[0].strip()
    if kind == "application/json-patch+json":
        if not isinstance(patch, list):
            raise ApiError(400, "BadRequest", "a JSON patch is a list of operations")
        return json_patch(obj, patch)
    if kind == "application/merge-patch+json":
        return merge_patch(obj, patch)
    if kind == "application/strategic-merge-patch+json":
        return strategic_merge_patch(obj, patch)
    raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - accepted "
                   f"media types include: application/json-patch+json, application/merge-patch+json, "
                   f"application/strategic-merge-patch+json (got {kind!r})")


# -- server-side printing ----------------------------------------------------------------
def _node_cells(node: dict[str, Any]) -> list[Any]:
    status = node.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
    text = {"True": "Ready", "False": "NotReady"}.get(ready.get("status", ""), "Unknown")
    if (node.get("spec") or {}).get("unschedulable"):
        text += ",SchedulingDisabled"
    labels = (node.get("metadata") or {}).get("labels") or {}
    roles = ",".join(sorted(k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/"))) \
        or "<none>"
    info = status.get("nodeInfo") or {}
    internal = next((a["address"] for a in status.get("addresses") or [] if a.get("type") == "InternalIP"), "<none>")
    return [node["metadata"]["name"], text, roles, age(node["metadata"].get("creationTimestamp")),
            info.get("kubeletVersion", ""), internal, "<none>", info.get("osImage", ""),
            info.get("kernelVersion", ""), info.get("containerRuntimeVersion", "")]


def _pod_cells(pod: dict[str, Any]) -> list[Any]:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    restarts = sum(int(s.get("restartCount") or 0) for s in statuses)
    reason = status.get("reason") or status.get("phase") or "Pending"
    for container in statuses:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason"):
            reason = waiting["reason"]
    if pod["metadata"].get("deletionTimestamp"):
        reason = "Terminating"
    return [pod["metadata"]["name"], f"{ready}/{len(spec.get('containers') or [])}", reason, restarts,
            age(pod["metadata"].get("creationTimestamp")), status.get("podIP") or "<none>",
            spec.get("nodeName") or "<none>", "<none>", "<none>"]


_MODES = {"ReadWriteOnce": "RWO", "ReadOnlyMany": "ROX", "ReadWriteMany": "RWX", "ReadWriteOncePod": "RWOP"}


def _volume_cells(volume: dict[str, Any]) -> list[Any]:
    spec, status = volume.get("spec") or {}, volume.get("status") or {}
    ref = spec.get("claimRef") or {}
    return [volume["metadata"]["name"], (spec.get("capacity") or {}).get("storage", ""),
            ",".join(_MODES.get(m, m) for m in spec.get("accessModes") or []),
            spec.get("persistentVolumeReclaimPolicy", "Retain"), status.get("phase", "Available"),
            f"{ref['namespace']}/{ref['name']}" if ref.get("name") else "", spec.get("storageClassName", ""),
            spec.get("volumeAttributesClassName") or "<unset>", status.get("reason", ""),
            age(volume["metadata"].get("creationTimestamp")), spec.get("volumeMode", "Filesystem")]


def _class_cells(storage_class: dict[str, Any]) -> list[Any]:
    return [storage_class["metadata"]["name"], storage_class.get("provisioner", ""),
            storage_class.get("reclaimPolicy", "Delete"), storage_class.get("volumeBindingMode", "Immediate"),
            bool(storage_class.get("allowVolumeExpansion", False)),
            age(storage_class["metadata"].get("creationTimestamp"))]


_COLUMNS = {
    "persistentvolumes": (["Name", "Capacity", "Access Modes", "Reclaim Policy", "Status", "Claim", "StorageClass",
                           "VolumeAttributesClass", "Reason", "Age", "VolumeMode"], [0] * 10 + [1], _volume_cells),
    "storageclasses": (["Name", "Provisioner", "ReclaimPolicy", "VolumeBindingMode", "AllowVolumeExpansion", "Age"],
                       [0] * 6, _class_cells),
    "nodes": (["Name", "Status", "Roles", "Age", "Version", "Internal-IP", "External-IP", "OS-Image",
               "Kernel-Version", "Container-Runtime"], [0, 0, 0, 0, 0, 1, 1, 1, 1, 1], _node_cells),
    "pods": (["Name", "Ready", "Status", "Restarts", "Age", "IP", "Node", "Nominated Node", "Readiness Gates"],
             [0, 0, 0, 0, 0, 1, 1, 1, 1], _pod_cells),
}


def table(plural: str, items: list[dict[str, Any]], list_meta: dict[str, Any]) -> dict[str, Any]:
    names, priorities, cells = _COLUMNS.get(plural, (["Name", "Age"], [0, 0], lambda o: [
        o["metadata"]["name"], age(o["metadata"].get("creationTimestamp"))]))
    columns = [{"name": name, "type": "integer" if name == "Restarts" else "string",
                "format": "name" if name == "Name" else "", "description": name, "priority": priority}
               for name, priority in zip(names, priorities, strict=True)]
    rows = [{"cells": cells(item), "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                                              "metadata": item["metadata"]}} for item in items]
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta, "columnDefinitions": columns,
            "rows": rows}
