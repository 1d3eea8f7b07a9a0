"""Stand-ins for the controllers that own pods (ReplicaSet, Job, the Kubeflow training operator, and
any other), for the test API server of tests/kube/apiserver.py: no controller manager or operator can
run here. Each keeps what matters to gpusweep of the real one: a pod of its own that is deleted or
evicted is started again once it is gone (a new name, the same template, wherever the scheduler puts it), a
pod that
ended (Succeeded or Failed) is not, and a pod that gains its owner reference counts as its own (a
ReplicaSet adopting gpusweep's copy)."""

from __future__ import annotations

import copy
import uuid
from typing import Any

from tests.kube.apiserver import KubeApiServer, controller_uid


class Restarts:
    """Keeps `replicas` pods owned by `owner` ({"apiVersion", "kind", "name", "uid"}) made from `template`
    (a pod without a name or node); ``started`` lists every pod it made, in order."""

    def __init__(
        self,
        api: KubeApiServer,
        owner: dict[str, str],
        template: dict[str, Any],
        replicas: int = 1,
        namespace: str = "default",
        names: tuple[str, ...] = (),
    ) -> None:
        self.api, self.owner, self.template, self.replicas, self.namespace = api, owner, template, replicas, namespace
        # A StatefulSet's pods have fixed names (<set>-<ordinal>): one comes back only once its name is free.
        self.names = names
        self.started: list[str] = []
        self.seen = False  # its owner object was in the store once
        api.controllers.append(self)

    def owned(self, terminating: bool = False) -> list[dict[str, Any]]:
        """Its pods; with `terminating`, those being deleted too: it starts a new one only once the old is gone
        (a Job with podReplacementPolicy Failed, a StatefulSet), so two never run at once."""
        return [
            p
            for p in self.api.objects("pods", self.namespace)
            if controller_uid(p) == self.owner["uid"] and (terminating or not p["metadata"].get("deletionTimestamp"))
        ]

    def owner_deleted(self) -> bool:
        """Its owner object was in the store and is gone (or is being deleted): a deleted controller starts
        nothing more, and the garbage collector deletes its pods. An owner of a kind this server does not
        serve (a PyTorchJob), or one a test never created, keeps the stand-in running."""
        kind = self.api.kind_of(self.owner.get("apiVersion", ""), self.owner.get("kind", ""))
        if kind is None:
            return False
        found = next((o for o in self.api.objects(kind.plural, self.namespace if kind.namespaced else None)
                      if o["metadata"].get("uid") == self.owner["uid"]), None)
        self.seen = self.seen or found is not None
        return self.seen and (found is None or bool(found["metadata"].get("deletionTimestamp")))

    def tick(self) -> None:
        with self.api.lock:
            if self.owner_deleted():
                return
            if self.names:
                missing = [n for n in self.names if self.api.get("pods", n, self.namespace) is None]
            else:
                missing = [
                    f"{self.owner['name']}-{uuid.uuid4().hex[:5]}"
                    for _ in range(self.replicas - len(self.owned(terminating=True)))
                ]
            for name in missing:
                pod = copy.deepcopy(self.template)
                meta = pod.setdefault("metadata", {})
                meta.update(
                    name=name,
                    namespace=self.namespace,
                    ownerReferences=[{**self.owner, "controller": True, "blockOwnerDeletion": True}],
                )
                pod.setdefault("spec", {}).pop("nodeName", None)
                pod["status"] = {"phase": "Pending"}
                self.api.put("pods", pod)
                self.started.append(meta["name"])
                self.api.record("controller-started", f"{self.namespace}/{meta['name']} {self.owner['kind']}")
