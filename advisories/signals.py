"""Recompute exposures for exactly the nodes whose versions changed.

inventory sends node_versions_changed after its transaction commits. The recompute is
set-based and takes milliseconds for a handful of nodes, so it runs right here rather than
through a queue; a large sync still costs one statement per step, not one per node.

``advisories_matched`` is sent (after commit) with ``advisory_ids`` once new or changed bulletins
have been matched against the fleet: the webhooks app tells subscribers which of them hit it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.dispatch import Signal, receiver

from advisories import services
from advisories.exposure import recompute
from advisories.osmatch import recompute_os
from inventory.signals import node_moved, node_packages_changed, node_versions_changed

advisories_matched = Signal()


def announce_matched(advisory_ids: Iterable[int]) -> None:
    ids = sorted(set(advisory_ids))
    transaction.on_commit(lambda: advisories_matched.send(sender=None, advisory_ids=ids))


@receiver(node_versions_changed, dispatch_uid="advisories.recompute_changed_nodes")
def recompute_changed_nodes(sender: Any, node_ids: Iterable[int] = (), reference: str = "", **kwargs: Any) -> None:
    ids = sorted(set(node_ids))
    if ids:
        recompute(node_ids=ids, remediated_by=reference)


@receiver(node_packages_changed, dispatch_uid="advisories.rematch_node_packages")
def rematch_node_packages(sender: Any, node_ids: Iterable[int] = (), reference: str = "", **kwargs: Any) -> None:
    ids = sorted(set(node_ids))
    if ids:
        recompute_os(node_ids=ids, remediated_by=reference)


@receiver(node_moved, dispatch_uid="advisories.move_exposures")
def move_exposures(sender: Any, node_ids: Iterable[int] = (), cluster_id: int = 0, **kwargs: Any) -> None:
    """Inside the move's transaction: the exposures' copy of their node's cluster (Exposure.cluster)."""
    services.move_exposures(sorted(set(node_ids)), cluster_id)
