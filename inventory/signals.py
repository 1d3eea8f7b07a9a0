"""Signals other apps hook into.

`node_versions_changed` is sent after the transaction that changed them commits, with
`node_ids`: only nodes whose component versions (or the fields exposures match on: GPU model,
product line, OS, facts) changed, so exposure recomputation stays incremental.
"""

from django.dispatch import Signal

node_versions_changed = Signal()

# Sent after commit when a node's package set, running kernel or livepatch state changed
# (inventory.packages), with `node_ids` and `reference` (what changed them).
node_packages_changed = Signal()

# Sent inside the transaction that moved a node to another cluster (inventory.services.move_node),
# with `node_ids` and `cluster_id`: a receiver keeping a copy of the node's cluster writes it in the
# same transaction, so no reader sees the node in one cluster and its copies in another.
node_moved = Signal()
