from __future__ import annotations

from gpusweep.choices import ChoiceSet


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

    @classmethod
    def next(cls, state: str) -> str:
        return cls.STEPS[cls.STEPS.index(state) + 1]


class MoveState(ChoiceSet):
    PLANNED = "planned"
    CHECKPOINTED = "checkpointed"
    STOPPED = "stopped"  # cold restart: stopped without a checkpoint
    RESTORED = "restored"
    COLD_STARTED = "cold_started"
    RETURNED = "returned"  # put back on its own node (abort / failure before the patch)
    FINISHED = "finished"  # it ended by itself while we waited
    FAILED = "failed"
    CHOICES = [
        (PLANNED, "Planned"),
        (CHECKPOINTED, "Checkpointed"),
        (STOPPED, "Stopped for a cold restart"),
        (RESTORED, "Restored on target"),
        (COLD_STARTED, "Cold started"),
        (RETURNED, "Returned to its node"),
        (FINISHED, "Finished by itself"),
        (FAILED, "Failed"),
    ]


class WorkloadPolicyChoice(ChoiceSet):
    CHECKPOINT = "checkpoint"
    WAIT = "wait"
    COLD_RESTART = "cold_restart"
    CHOICES = [
        (CHECKPOINT, "Checkpoint and migrate"),
        (WAIT, "Wait for completion (up to the limit)"),
        (COLD_RESTART, "Cold restart"),
    ]
