from __future__ import annotations

from gpusweep.choices import ChoiceSet
from inventory.versions import LIVEPATCH, OS_PACKAGES


class CampaignStatus(ChoiceSet):
    DRAFT = "draft"
    PLANNED = "planned"
    APPROVED = "approved"
    RUNNING = "running"
    WAITING = "waiting"  # running, but outside its window: no node is started until the next one opens
    PAUSED = "paused"
    HALTED = "halted"  # the error budget ran out; an operator resumes or aborts
    COMPLETED = "completed"
    ABORTED = "aborted"
    CHOICES = [
        (DRAFT, "Draft"),
        (PLANNED, "Planned"),
        (APPROVED, "Approved"),
        (RUNNING, "Running"),
        (WAITING, "Waiting for a window"),
        (PAUSED, "Paused"),
        (HALTED, "Halted (error budget spent)"),
        (COMPLETED, "Completed"),
        (ABORTED, "Aborted"),
    ]
    # A campaign holding its nodes: they may be in no other campaign meanwhile.
    ACTIVE = frozenset({RUNNING, WAITING, PAUSED, HALTED})
    EDITABLE = frozenset({DRAFT, PLANNED, APPROVED})
    TERMINAL = frozenset({COMPLETED, ABORTED})


class SweepState(ChoiceSet):
    PENDING = "pending"
    DRAINING = "draining"
    CHECKPOINTING = "checkpointing"
    MIGRATING = "migrating"
    PATCHING = "patching"
    REBOOTING = "rebooting"
    VERIFYING = "verifying"
    RETURNING = "returning"
    DONE = "done"
    FAILED = "failed"
    ROLLED_BACK = "rolled_back"
    SKIPPED = "skipped"
    CHOICES = [
        (PENDING, "Pending"),
        (DRAINING, "Draining"),
        (CHECKPOINTING, "Checkpointing"),
        (MIGRATING, "Migrating"),
        (PATCHING, "Patching"),
        (REBOOTING, "Rebooting"),
        (VERIFYING, "Verifying"),
        (RETURNING, "Returning to service"),
        (DONE, "Done"),
        (FAILED, "Failed"),
        (ROLLED_BACK, "Rolled back"),
        (SKIPPED, "Skipped"),
    ]
    # The happy path, in order; each step's successor is the next entry.
    STEPS = (PENDING, DRAINING, CHECKPOINTING, MIGRATING, PATCHING, REBOOTING, VERIFYING, RETURNING, DONE)
    WORKING = frozenset({DRAINING, CHECKPOINTING, MIGRATING, PATCHING, REBOOTING, VERIFYING, RETURNING})
    ACTIVE = frozenset({PENDING} | WORKING)
    # Before PATCHING nothing on the node changed: abort and failures put it back as it was.
    BEFORE_PATCH = frozenset({PENDING, DRAINING, CHECKPOINTING, MIGRATING})
    TERMINAL = frozenset({DONE, FAILED, ROLLED_BACK, SKIPPED})

    # A sweep whose target is in place (a livepatch, OS packages' update): applied on a node that keeps
    # its work, so never drained, checkpointed or rebooted; verified by the livepatch state it reports
    # and the package versions its agent read back.
    IN_PLACE_STEPS = (PENDING, PATCHING, VERIFYING, DONE)

    @classmethod
    def steps_of(cls, target: dict[str, str] | None) -> tuple[str, ...]:
        """The steps a sweep towards `target` goes through, in order."""
        return cls.IN_PLACE_STEPS if in_place(target) else cls.STEPS

    @classmethod
    def next(cls, state: str, target: dict[str, str] | None = None) -> str:
        steps = cls.steps_of(target)
        return steps[steps.index(state) + 1]


IN_PLACE = frozenset({LIVEPATCH, OS_PACKAGES})


def in_place(target: dict[str, str] | None) -> bool:
    """Whether a node's target is a kernel livepatch or an OS packages' update and nothing else (no
    drain, no reboot)."""
    return bool(target) and IN_PLACE.issuperset(target or ())


class MoveState(ChoiceSet):
    PLANNED = "planned"
    CHECKPOINTED = "checkpointed"
    STOPPED = "stopped"  # cold restart: stopped without a checkpoint
    PARKED = "parked"  # checkpointed; restored on its own node once that node is back (kernel-only patches)
    RESTORED = "restored"
    COLD_STARTED = "cold_started"
    RETURNED = "returned"  # put back on its own node (abort / failure before the patch)
    FINISHED = "finished"  # it ended by itself while we waited
    FAILED = "failed"
    # Its node's sweep failed and no node (its own included) took its checkpoint back: kept for an operator.
    STRANDED = "stranded"
    CHOICES = [
        (PLANNED, "Planned"),
        (CHECKPOINTED, "Checkpointed"),
        (PARKED, "Parked until its node is back"),
        (STOPPED, "Stopped for a cold restart"),
        (RESTORED, "Restored on target"),
        (COLD_STARTED, "Cold started"),
        (RETURNED, "Returned to its node"),
        (FINISHED, "Finished by itself"),
        (FAILED, "Failed"),
        (STRANDED, "Stranded: checkpoint kept, an operator must restore it"),
    ]


class Placement(ChoiceSet):
    """Where a checkpointed workload goes while its node is patched."""

    MOVE = "move"
    HOME = "home"
    CHOICES = [
        (MOVE, "Move it to a compatible node (back on its own node only when none is free)"),
        (HOME, "Bring it back to its own node after the reboot where its checkpoint stays valid"),
    ]


class HeldNodes(ChoiceSet):
    """What a campaign does with a node someone else has taken out of service (a repair, a drain)."""

    SKIP = "skip"
    SWEEP = "sweep"
    CHOICES = [
        (SKIP, "Skip it: listed as held in the plan, not touched"),
        (SWEEP, "Sweep it, keeping the other hold: it stays out of service at the end"),
    ]


class AfterRollback(ChoiceSet):
    """Where a node goes once a failed patch or health gate was reverted and its old versions verified."""

    STAY_OUT = "stay_out"
    RETURN = "return"
    CHOICES = [
        (STAY_OUT, "Stay out of service for an operator to look at"),
        (RETURN, "Return to service when its health gates pass on the old versions"),
    ]


class WaveGrowth(ChoiceSet):
    """How waves after the canary grow, capped by the parallelism limits."""

    FIXED = "fixed"
    LINEAR = "linear"
    EXPONENTIAL = "exponential"
    CHOICES = [
        (FIXED, "Fixed: every wave as large as the limits allow"),
        (LINEAR, "Linear: each wave n nodes larger than the one before"),
        (EXPONENTIAL, "Exponential: each wave n times the one before"),
    ]


class EvidenceKind(ChoiceSet):
    """Every kind of evidence event. CAMPAIGN kinds go into the campaign's chain, NODE kinds into
    the chain of one node sweep (campaigns.evidence)."""

    CREATED = "created"
    EDITED = "edited"
    PLANNED = "planned"
    APPROVED = "approved"
    FULLY_APPROVED = "fully_approved"
    STARTED = "started"
    WAITING_FOR_WINDOW = "waiting_for_window"
    WINDOW_OPENED = "window_opened"
    PAUSED = "paused"
    RESUMED = "resumed"
    HALTED = "halted"
    ABORTED = "aborted"
    COMPLETED = "completed"
    SEALED = "sealed"
    SOAKING = "soaking"
    SOAKED = "soaked"
    CANARY_FAILED = "canary_failed"
    ADMITTED = "admitted"
    STEP_DONE = "step_done"
    STEP_FAILED = "step_failed"
    RETRY = "retry"
    WAITING = "waiting"
    CHECKPOINTED = "checkpointed"
    PARKED = "parked"
    STOPPED = "stopped"
    FINISHED = "finished"
    RESTORED = "restored"
    RETURNED = "returned"
    STRANDED = "stranded"
    DONE = "done"
    FAILED = "failed"
    ROLLED_BACK = "rolled_back"
    SKIPPED = "skipped"
    # Health gates and reverting a patch (not ROLLED_BACK: that is an unpatched node unwound).
    HEALTH_CHECKED = "health_checked"
    REVERTED = "reverted"
    REVERT_VERIFIED = "revert_verified"
    REVERT_FAILED = "revert_failed"
    ROLLBACK_CAMPAIGN = "rollback_campaign"
    # A stranded workload restored by an operator after its sweep ended (manage.py recover_stranded).
    RECOVERED = "workload_recovered"
    # A wave's maintenance reservation (executors.base.SupportsWaveReservations).
    RESERVATION_CREATED = "reservation_created"
    RESERVATION_DELETED = "reservation_deleted"
    CHOICES = [
        (CREATED, "Created"),
        (EDITED, "Edited"),
        (PLANNED, "Planned"),
        (APPROVED, "Approved"),
        (FULLY_APPROVED, "Fully approved"),
        (STARTED, "Started"),
        (WAITING_FOR_WINDOW, "Waiting for a window"),
        (WINDOW_OPENED, "Window opened"),
        (PAUSED, "Paused"),
        (RESUMED, "Resumed"),
        (HALTED, "Halted"),
        (ABORTED, "Aborted"),
        (COMPLETED, "Completed"),
        (SEALED, "Heads sealed and signed"),
        (SOAKING, "Canary done, soaking"),
        (SOAKED, "Soak over, waves continue"),
        (CANARY_FAILED, "Canary failed"),
        (ADMITTED, "Admitted"),
        (STEP_DONE, "Step done"),
        (STEP_FAILED, "Step failed"),
        (RETRY, "Step to be retried"),
        (WAITING, "Waiting for a workload"),
        (CHECKPOINTED, "Workload checkpointed"),
        (PARKED, "Checkpoint parked until the node is back"),
        (STOPPED, "Workload stopped for a cold start"),
        (FINISHED, "Workload ended by itself"),
        (RESTORED, "Workload restored"),
        (RETURNED, "Workload returned to its node"),
        (STRANDED, "Workload stranded: checkpoint kept for an operator"),
        (DONE, "Node done"),
        (FAILED, "Node failed"),
        (ROLLED_BACK, "Node rolled back"),
        (SKIPPED, "Node skipped"),
        (HEALTH_CHECKED, "Health gates run"),
        (REVERTED, "Patch reverted: previous packages reinstalled"),
        (REVERT_VERIFIED, "Previous versions verified after the revert"),
        (REVERT_FAILED, "Revert failed"),
        (ROLLBACK_CAMPAIGN, "Rollback campaign created"),
        (RECOVERED, "Stranded workload restored"),
        (RESERVATION_CREATED, "Wave's maintenance reservation created"),
        (RESERVATION_DELETED, "Wave's maintenance reservation deleted"),
    ]
    CAMPAIGN = frozenset({CREATED, EDITED, PLANNED, APPROVED, FULLY_APPROVED, STARTED, WAITING_FOR_WINDOW,
                          WINDOW_OPENED, PAUSED, RESUMED, HALTED, ABORTED, COMPLETED, SEALED, SOAKING, SOAKED,
                          CANARY_FAILED, ROLLBACK_CAMPAIGN, RECOVERED, RESERVATION_CREATED, RESERVATION_DELETED})
    NODE = frozenset(set(dict(CHOICES)) - CAMPAIGN)
