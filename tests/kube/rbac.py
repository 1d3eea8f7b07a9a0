"""Authentication and authorization for the test API server, as a real one decides them.

Tokens name users: the server's own token is an administrator (group ``system:masters``, allowed
everything); ``KubeApiServer.service_account_token`` issues one bound to a ServiceAccount in the store
(``system:serviceaccount:<namespace>:<name>``, with the groups ``system:serviceaccounts``,
``system:serviceaccounts:<namespace>`` and ``system:authenticated``), refused with 401 once the account is
gone. Requests are then checked by the RBAC authorizer's rules (plugin/pkg/auth/authorizer/rbac):
the ClusterRoles, Roles, ClusterRoleBindings and RoleBindings in the store, which tests load from the
shipped YAML (``load_manifests``), so what gpusweep may do here is what deploy/kubernetes grants. A
denied request gets the real 403 Status (its message from the apiserver's ``forbiddenMessage``).
Discovery paths (``/api``, ``/apis``) are allowed to every authenticated user (the default
``system:discovery`` binding).

The OwnerReferencesPermissionEnforcement admission plugin (off by default upstream, on in OpenShift)
runs too: changing an object's ``ownerReferences`` needs ``delete`` on it, and a new reference with
``blockOwnerDeletion: true`` needs ``update`` on the owner's ``finalizers`` subresource.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tests.kube.machinery import ApiError

if TYPE_CHECKING:
    from tests.kube.apiserver import KubeApiServer

ADMIN_GROUP = "system:masters"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
# What the apiserver's RequestInfoFactory calls each method on a resource path.
METHOD_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete", "GET": "get"}


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...] = ()
    # the ServiceAccount (namespace, name) the token is bound to
    service_account: tuple[str, str] | None = None


ADMIN = User("kubernetes-admin", (ADMIN_GROUP, "system:authenticated"))


def service_account_user(namespace: str, name: str) -> User:
    return User(f"system:serviceaccount:{namespace}:{name}",
                ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"),
                (namespace, name))


@dataclass(frozen=True)
class Request:
    """The authorizer's attributes of one resource request."""

    verb: str
    group: str
    resource: str
    subresource: str = ""
    name: str = ""
    namespace: str = ""


def verb_of(method: str, name: str, watch: bool) -> str:
    if method == "GET":
        return ("watch" if watch else "get") if name else ("watch" if watch else "list")
    if method == "DELETE" and not name:
        return "deletecollection"
    return METHOD_VERBS.get(method, method.lower())


def _rule_allows(rule: dict[str, Any], request: Request) -> bool:
    verbs, groups = rule.get("verbs") or [], rule.get("apiGroups") or []
    if "*" not in verbs and request.verb not in verbs:
        return False
    if "*" not in groups and request.group not in groups:
        return False
    combined = f"{request.resource}/{request.subresource}" if request.subresource else request.resource
    resources = rule.get("resources") or []
    if not any(r in ("*", combined) or (request.subresource and r == f"*/{request.subresource}")
               for r in resources):
        return False
    names = rule.get("resourceNames") or []
    return not names or request.name in names


def _subject_matches(subject: dict[str, Any], user: User) -> bool:
    kind = subject.get("kind")
    if kind == "User":
        return bool(subject.get("name") == user.name)
    if kind == "Group":
        return subject.get("name") in user.groups
    if kind == "ServiceAccount":
        return user.service_account == (subject.get("namespace"), subject.get("name"))
    return False


def allowed(api: KubeApiServer, user: User, request: Request) -> bool:
    if ADMIN_GROUP in user.groups:
        return True
    bindings = [(b, "") for b in api.objects("clusterrolebindings")]
    if request.namespace:
        bindings += [(b, request.namespace) for b in api.objects("rolebindings", request.namespace)]
    for binding, namespace in bindings:
        if not any(_subject_matches(s, user) for s in binding.get("subjects") or []):
            continue
        ref = binding.get("roleRef") or {}
        role = api.get("clusterroles", ref.get("name", "")) if ref.get("kind") == "ClusterRole" else \
            api.get("roles", ref.get("name", ""), namespace)
        if role and any(_rule_allows(rule, request) for rule in role.get("rules") or []):
            return True
    return False


def denial(user: User, request: Request) -> str:
    """The authorizer's reason, worded as the apiserver's forbiddenMessage."""
    resource = f"{request.resource}/{request.subresource}" if request.subresource else request.resource
    scope = f'in the namespace "{request.namespace}"' if request.namespace else "at the cluster scope"
    return f'User "{user.name}" cannot {request.verb} resource "{resource}" in API group "{request.group}" {scope}'


def forbidden(request: Request, reason: str) -> ApiError:
    """The 403 Status of apimachinery's NewForbidden for the request's resource."""
    qualified = f"{request.resource}.{request.group}" if request.group else request.resource
    subject = f'{qualified} "{request.name}"' if request.name else qualified
    return ApiError(403, "Forbidden", f"{subject} is forbidden: {reason}",
                    {"name": request.name, "group": request.group, "kind": request.resource}
                    if request.name else {"group": request.group, "kind": request.resource})


def authorize(api: KubeApiServer, user: User, request: Request) -> None:
    if not allowed(api, user, request):
        api.record("forbidden", f"{user.name} {request.verb} {request.resource}"
                                + (f"/{request.subresource}" if request.subresource else ""))
        raise forbidden(request, denial(user, request))


def _references(obj: dict[str, Any] | None) -> list[dict[str, Any]]:
    return list(((obj or {}).get("metadata") or {}).get("ownerReferences") or [])


def admit_owner_references(api: KubeApiServer, user: User, request: Request, new: dict[str, Any],
                           old: dict[str, Any] | None) -> None:
    """OwnerReferencesPermissionEnforcement (plugin/pkg/admission/gc) on a create or update."""
    if _references(new) == _references(old):
        return
    if old is not None:
        deleting = Request("delete", request.group, request.resource, "", request.name, request.namespace)
        if not allowed(api, user, deleting):
            raise forbidden(request, "cannot set an ownerRef on a resource you can't delete: "
                                     + denial(user, deleting))
    before = {(r.get("uid"), bool(r.get("blockOwnerDeletion"))) for r in _references(old)}
    for ref in _references(new):
        if not ref.get("blockOwnerDeletion") or (ref.get("uid"), True) in before:
            continue
        owner = api.kind_of(str(ref.get("apiVersion", "")), str(ref.get("kind", "")))
        if owner is None:  # a kind this server does not serve: no REST mapping, as the plugin says
            raise forbidden(request, f"cannot set blockOwnerDeletion in this case because cannot find RESTMapping "
                                     f"for APIVersion {ref.get('apiVersion')} Kind {ref.get('kind')}")
        finalizers = Request("update", owner.group, owner.plural, "finalizers", str(ref.get("name", "")),
                             request.namespace if owner.namespaced else "")
        if not allowed(api, user, finalizers):
            raise forbidden(request, "cannot set blockOwnerDeletion if an ownerReference refers to a resource you "
                                     f"can't set finalizers on: {denial(user, finalizers)}, {ref}")


def manifests(*paths: Path) -> list[dict[str, Any]]:
    """The RBAC objects (and ServiceAccounts) of the YAML files or folders (``*.yaml``, not recursive)."""
    files = [f for p in paths for f in (sorted(p.glob("*.yaml")) if p.is_dir() else [p])]
    return [doc for f in files for doc in yaml.safe_load_all(f.read_text()) if doc and doc.get("kind") in RBAC_KINDS]


def load_manifests(api: KubeApiServer, *paths: Path) -> list[dict[str, Any]]:
    """Put the RBAC objects of `paths` into the server's store, as ``kubectl apply`` would; returns them."""
    plurals = {"ServiceAccount": "serviceaccounts", "ClusterRole": "clusterroles",
               "ClusterRoleBinding": "clusterrolebindings", "Role": "roles", "RoleBinding": "rolebindings"}
    return [api.put(plurals[doc["kind"]], doc) for doc in manifests(*paths)]
