"""Every assumption of the simulator, as one set of named parameters.

A trace lacks what a strategy's outcome depends on; each gap is a parameter here, printed with
the results, never a constant hidden in the code:

- time limits: the Alibaba trace has none. A finished task's limit is `limit_factor` x its real
  duration (users over-ask; 1.0 would be a perfect guess); a service, or a task still running when
  the trace ends, has no limit. sacct traces carry their real limits.
- node assignment: the Alibaba trace has none. Tasks are placed when they start, by `placement`:
  `first_fit` (the first node in fleet order with enough free GPU share) or `best_fit` (the one
  that fits most tightly). A sacct trace's NodeList is used where the fleet has that node.
- GPU sharing: a task holds `num_gpu x gpu_milli` thousandths of GPUs; shares add up on a node.
- what a kill costs: a batch task loses the work since its last save; the last save is unknown, so
  all its elapsed GPU-hours (the ceiling), or the time since the last multiple of `save_every_h`
  when given. A service (qos in `service_qos`) loses its warm-up: `service_warmup_min` of its GPUs.
- checkpoints: a `checkpointable_share` of tasks can be checkpointed (chosen by a stable hash of
  the task's name); a checkpoint holds the task's GPU memory (`gpu_memory_gib` per GPU of its
  model, times its share) plus its host memory, written at `checkpoint_s_per_gib` and restored at
  `restore_s_per_gib` (defaults from bench/checkpoint.py: 1.0 and 0.7 s/GiB).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from campaigns import policy
from campaigns.choices import WaveGrowth
from campaigns.planner import PlanError, canary_nodes, parse_limit
from executors import portability
from inventory.gpumodel import model_key, same_model


def _parallelism_ok(values: tuple[str, ...]) -> bool:
    try:
        for value in values:
            parse_limit(value, 100, "parallelism")
    except PlanError:
        return False
    return bool(values)


def _canary_ok(text: str) -> bool:
    try:
        canary_nodes([], text)
    except PlanError:
        return False
    return True

CADENCE_DAYS = {"monthly": 30.44, "quarterly": 91.31, "yearly": 365.25}
PLACEMENTS = ("first_fit", "best_fit")
CHECKPOINT_ENGINES = tuple(sorted(name for name, rule in portability.ENGINES.items() if rule.checkpointable))
POLICIES = ("wait", "cold_restart")
# Work no node can receive: "wait" and "cold_restart" are what the engine does without and with
# cold restarts; "fail" and "wait_then_cold_restart" are what-ifs (see Params.last_group).
LAST_GROUP = ("wait", "cold_restart", "fail", "wait_then_cold_restart")
WAVE_ORDERS = ("strict", "hold", "own_work")


# What each parameter means, for --help and the form (one line each).
HELP = {
    "release_s": "when the advisory is released, seconds on the trace's clock (default: the middle of the trace)",
    "severity": "the advisory's severity (sets the deadline)",
    "deadline_days": "days from release to the deadline",
    "limit_factor": "a finished task's time limit, as a multiple of its real duration (traces without limits)",
    "placement": "where tasks run when the trace does not say: first_fit or best_fit",
    "service_qos": "qos values that mark a task as a service (no limit; a kill costs its warm-up)",
    "patch_minutes": "minutes to patch, reboot and verify one node",
    "gpu_memory_gib": "GPU memory per GPU in a checkpoint, GiB",
    "gpu_memory_by_model": "per GPU model, e.g. T4=16,V100M32=32",
    "save_every_h": "batch tasks save their state every so many hours (unset: unknown, all elapsed work is lost)",
    "service_warmup_min": "minutes of GPU work a service loses when it is killed",
    "cadences": "maintenance window cadences: monthly, quarterly, yearly",
    "window_hours": "length of a maintenance window",
    "reservation_days": "how far ahead the maintenance reservation is set",
    "window_phase": "the next window opens this share of its period after the release (0.5: the average)",
    "parallelism": "nodes at a time for drain-and-wait and sweeps: a number or a percentage of each cluster",
    "wait_limit_h": "a drain kills what still runs after so many hours (none or 0: waits forever; empty: the default)",
    "checkpointable_share": "share of tasks that can be checkpointed",
    "checkpoint_s_per_gib": "checkpoint seconds per GiB",
    "restore_s_per_gib": "restore seconds per GiB",
    "last_group": "work no node can receive (a cuda checkpoint in the last two waves of a driver group): wait "
                  "(cold restart not allowed, a campaign's default: the engine waits for it to end, up to the wait "
                  "limit, and fails the node, unpatched, if it still runs then), cold_restart (allowed: the engine "
                  "stops it at once for a cold restart); what-ifs the engine does not do: fail (fail the node at "
                  "once, as the engine did before it waited) or wait_then_cold_restart (wait up to the limit, then "
                  "cold-start it)",
    "not_checkpointable": "work that cannot be checkpointed: wait or cold_restart",
    "checkpoint_engine": "how checkpointable work is checkpointed (executors.portability: cuda, criu, signal): "
                         "where its image is valid, so which nodes, patched ones too, may receive it",
    "canary": "the first wave as a campaign's canary: auto (one node per driver group and cluster), N nodes, or 0",
    "soak_minutes": "minutes the canary soaks before any other node drains",
    "wait_poll_s": "seconds between the engine's looks at a job a sweep waits for (it sees the end at the next look)",
    "wave_order": "strict (the engine): wave v starts once every wave up to v-2 is done; a node waiting for a "
                  "receiver for its work keeps its slot but holds no wave meanwhile. What-ifs the engine does not "
                  "do: hold (the engine before issue 32: a waiting node holds the order too); own_work (a waiting "
                  "node gives its slot back too)",
    "wave_growth": "how waves after the canary grow: fixed, linear or exponential",
    "growth_step": "+n nodes per wave (linear) or x n (exponential)",
}

# Each parameter's label on the simulator's form, written for people (the name is the CLI's --param).
LABELS = {
    "release_s": "Advisory released at (seconds on the trace's clock)",
    "severity": "Severity",
    "deadline_days": "Days to the deadline",
    "limit_factor": "Time limit, as a multiple of a task's real duration",
    "placement": "Task placement",
    "service_qos": "QOS values that mark a service",
    "patch_minutes": "Patch, reboot and verify a node (minutes)",
    "gpu_memory_gib": "GPU memory per GPU (GiB)",
    "gpu_memory_by_model": "GPU memory per GPU model (GiB)",
    "save_every_h": "Batch tasks save their state every (hours)",
    "service_warmup_min": "Work a killed service loses (minutes)",
    "cadences": "Maintenance window cadences",
    "window_hours": "Maintenance window length (hours)",
    "reservation_days": "Maintenance reservation set ahead (days)",
    "window_phase": "Next window opens after the release (share of its period)",
    "parallelism": "Nodes patched at a time",
    "wait_limit_h": "A drain kills what still runs after (hours)",
    "checkpointable_share": "Share of tasks that can be checkpointed",
    "checkpoint_s_per_gib": "Checkpoint time (seconds per GiB)",
    "restore_s_per_gib": "Restore time (seconds per GiB)",
    "last_group": "Work no node can receive",
    "not_checkpointable": "Work that cannot be checkpointed",
    "checkpoint_engine": "Checkpoint engine",
    "canary": "Canary",
    "soak_minutes": "Soak after the canary (minutes)",
    "wait_poll_s": "The engine looks at a waited job every (seconds)",
    "wave_order": "Wave order",
    "wave_growth": "Wave growth after the canary",
    "growth_step": "Wave growth step",
}


class ModelError(ValueError):
    """A parameter outside its range; the message names it."""


@dataclass(frozen=True)
class Params:
    # The advisory.
    release_s: float | None = None  # on the trace's clock; None: the middle of the trace
    severity: str = "high"
    deadline_days: float = 30.0
    # The trace model.
    limit_factor: float = 2.0
    placement: str = "first_fit"
    service_qos: tuple[str, ...] = ("LS", "Guaranteed")
    # The node and its work.
    patch_minutes: float = 20.0
    gpu_memory_gib: float = 16.0
    gpu_memory_by_model: dict[str, float] = field(default_factory=dict)
    save_every_h: float | None = None
    service_warmup_min: float = 10.0
    # Strategy 1: maintenance windows.
    cadences: tuple[str, ...] = ("monthly", "quarterly")
    window_hours: float = 8.0
    reservation_days: float = 14.0
    window_phase: float = 0.5  # the next window opens phase x its period after the release
    # Strategies 2 and 3: k nodes at a time (a number or a percentage of the fleet).
    parallelism: tuple[str, ...] = ("1%", "5%")
    wait_limit_h: float | None = 168.0  # how long a drain waits before it kills what still runs
    # Strategy 3: checkpoint-migrate sweeps.
    checkpointable_share: float = 0.8
    checkpoint_s_per_gib: float = 1.0
    restore_s_per_gib: float = 0.7
    # The driver-group rule, for work no node can receive (a `cuda` checkpoint needs the old driver:
    # in the last two waves of a driver group none is left; the plan calls it "blocked"). The engine
    # decides it before anything on the node is frozen (campaigns.engine.steps._wait_first and
    # _nowhere_to_go): "wait", a campaign's default (cold restart not allowed), waits for it to end
    # like a job whose policy waits (looking every `wait_poll_s`), up to the wait limit (none: for
    # ever), and fails the node, unpatched with its work untouched, if it still runs then;
    # "cold_restart" (allowed) stops it at once for a cold restart. What-ifs the engine does not do:
    # "fail" fails the node at once (the engine before it waited: it checkpointed, found no receiver
    # and failed the node); "wait_then_cold_restart" waits up to the limit, then cold-starts it.
    # Work that cannot be checkpointed cold-starts (a campaign's default workload policy,
    # "checkpoint", does that) or waits.
    last_group: str = "wait"
    not_checkpointable: str = "cold_restart"
    checkpoint_engine: str = "cuda"
    # The rollout, as a campaign's defaults: a canary wave (one node per driver group and cluster),
    # its soak before any other node drains, and how the waves after it grow.
    canary: str = "auto"
    soak_minutes: float = 10.0
    # The engine looks at a job it waits for this often (campaigns.policy.WAIT_POLL_S).
    wait_poll_s: float = policy.WAIT_POLL_S
    wave_growth: str = "fixed"
    growth_step: int = 2
    # What holds the wave order (campaigns.policy.admits: wave v once every wave up to v-2 is done):
    # "strict", the engine's dispatch: a node holds its slot until it ends, and the order too except
    # while it waits for a receiver alone (NodeSweep.waiting_since: its receivers are looked for
    # again at every look); it holds the order again once it goes on. What-ifs: "hold", the engine
    # before issue 32 (a waiting node holds the order too); "own_work", a node waiting for its own
    # work, whatever it waits for, gives its slot back too.
    wave_order: str = "strict"

    def __post_init__(self) -> None:
        checks: list[tuple[str, bool, str]] = [
            ("limit_factor", self.limit_factor >= 1.0, ">= 1 (a limit shorter than the run would have killed it)"),
            ("placement", self.placement in PLACEMENTS, f"one of {', '.join(PLACEMENTS)}"),
            ("patch_minutes", self.patch_minutes > 0, "> 0"),
            ("gpu_memory_gib", self.gpu_memory_gib >= 0, ">= 0"),
            ("save_every_h", self.save_every_h is None or self.save_every_h > 0, "> 0 or unset"),
            ("service_warmup_min", self.service_warmup_min >= 0, ">= 0"),
            ("cadences", bool(self.cadences) and all(c in CADENCE_DAYS for c in self.cadences),
             f"some of {', '.join(CADENCE_DAYS)}"),
            ("window_hours", self.window_hours > 0, "> 0"),
            ("reservation_days", self.reservation_days >= 0, ">= 0"),
            ("window_phase", 0 < self.window_phase <= 1, "in (0, 1]"),
            ("parallelism", _parallelism_ok(self.parallelism),
             "nodes at a time: whole numbers >= 1 or percentages such as 5%, comma separated"),
            ("wait_limit_h", self.wait_limit_h is None or self.wait_limit_h > 0, "> 0 or unset"),
            ("checkpointable_share", 0 <= self.checkpointable_share <= 1, "in [0, 1]"),
            ("checkpoint_s_per_gib", self.checkpoint_s_per_gib >= 0, ">= 0"),
            ("restore_s_per_gib", self.restore_s_per_gib >= 0, ">= 0"),
            ("last_group", self.last_group in LAST_GROUP, f"one of {', '.join(LAST_GROUP)}"),
            ("not_checkpointable", self.not_checkpointable in POLICIES, f"one of {', '.join(POLICIES)}"),
            ("deadline_days", self.deadline_days > 0, "> 0"),
            ("checkpoint_engine", self.checkpoint_engine in CHECKPOINT_ENGINES,
             f"one of {', '.join(CHECKPOINT_ENGINES)}"),
            ("canary", _canary_ok(self.canary), "'auto', a whole number of nodes, or 0 for none"),
            ("soak_minutes", self.soak_minutes >= 0, ">= 0"),
            ("wait_poll_s", self.wait_poll_s >= 0, ">= 0 (0: the end is seen at once)"),
            ("wave_growth", self.wave_growth in WaveGrowth.values(), f"one of {', '.join(WaveGrowth.values())}"),
            ("growth_step", self.growth_step >= 1, ">= 1"),
            ("wave_order", self.wave_order in WAVE_ORDERS, f"one of {', '.join(WAVE_ORDERS)}"),
        ]
        for name, ok, expected in checks:
            if not ok:
                raise ModelError(f"{name}={getattr(self, name)!r}: expected {expected}")

    def with_(self, **changes: Any) -> Params:
        return replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    def gpu_memory(self, gpu_model: str) -> float:
        """GiB per GPU of `gpu_model`: its `gpu_memory_by_model` entry, named as the trace or the fleet names it
        (`V100M32` is a `Tesla V100-SXM2-32GB`: inventory.gpumodel), the exact name first; else the default."""
        named = sorted(self.gpu_memory_by_model.items(), key=lambda item: model_key(item[0]) != model_key(gpu_model))
        return next((gib for name, gib in named if same_model(name, gpu_model)), self.gpu_memory_gib)

    def checkpointable(self, task_name: str) -> bool:
        """A stable choice: the same task is checkpointable in every run and every strategy."""
        digest = hashlib.sha256(task_name.encode()).digest()
        return int.from_bytes(digest[:4], "big") / 2**32 < self.checkpointable_share
