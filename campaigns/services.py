"""Campaign life cycle: create, edit, plan, approve, start, pause, resume, abort. Typed, atomic, evidenced.

Every change locks the campaign row first (evidence.lock_campaign), changes state with a
conditional UPDATE, and appends its evidence event in the same transaction. Work for Celery
is enqueued with transaction.on_commit (campaigns.queue), so a task never sees a row that was
rolled back. The API and the UI both create and edit campaigns through `create_campaign` and
`update_campaign`: one validation, one evidence trail.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import Max, Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from campaigns import evidence, policy
from campaigns.choices import (
    AfterRollback,
    CampaignStatus,
    EvidenceKind,
    HeldNodes,
    Placement,
    SweepState,
    in_place,
)
from campaigns.models import Approval, Campaign, NodeSweep, Plan
from campaigns.planner import (
    PlanError,
    PlanNode,
    PlanWorkload,
    Policy,
    canary_nodes,
    compare,
    parse_blackouts,
    parse_limit,
    parse_windows,
)
from campaigns.planner import plan as run_planner
from campaigns.queue import enqueue
from executors import portability
from executors.base import (
    BARE_PROCESS,
    Executor,
    ExecutorError,
    GpuUser,
    NodeRef,
    SupportsGpuUsers,
    SupportsMaintenanceHolds,
    SupportsWaveReservations,
    get_executor,
)
from inventory.choices import ServiceState, WorkloadKind
from inventory.models import Cluster, Node, Workload
from inventory.versions import DRIVER, parse_version

if TYPE_CHECKING:
    from advisories.osplan import OsTarget

# A site check's name as a node agent's health_options.site.commands holds it.
SITE_CHECK_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class CampaignError(Exception):
    """A request that cannot be honoured in the campaign's state; the message says why."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


class DefinitionError(CampaignError):
    """Invalid campaign fields; `errors` maps each field to what is wrong with it."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()), status=400)
        self.errors = errors


def actor_of(user: User | None) -> str:
    return f"user:{user.get_username()}" if user is not None else "system"


def node_ref(node: Node) -> NodeRef:
    """The executor's view of an inventory node (its versions as the inventory knows them)."""
    return NodeRef(
        cluster=node.cluster.name, name=node.name, node_id=node.pk, endpoint=node.agent_endpoint,
        gpu_model=node.gpu_model, gpu_count=node.gpu_count, versions=node.component_versions(), pool=node.pool,
        labels=dict(node.labels or {}),
    )


# -- the campaign's definition -----------------------------------------------------------
DEFINITION_FIELDS = (
    "name", "description", "clusters", "pools", "node_selector", "last_group", "target_versions", "canary", "soak_s",
    "wave_growth", "growth_step", "dcgm_level", "site_checks", "after_rollback",
    "parallelism_per_cluster", "parallelism_per_pool", "windows", "blackouts", "error_budget", "workload_policy",
    "wait_limit", "cold_restart_allowed", "workload_placement", "held_nodes", "workload_overrides",
    "approvals_required",
    "deadline", "step_timeout_s", "node_estimate_s",
)


def _names(value: Any, field: str, known: set[str], errors: dict[str, str]) -> None:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        errors[field] = "a list of names"
    elif unknown := sorted(set(value) - known):
        errors[field] = f"unknown {field}: {', '.join(unknown)}; known: {', '.join(sorted(known)) or 'none'}"


def _check_selector(selector: Any, errors: dict[str, str]) -> None:
    if not isinstance(selector, dict):
        errors["node_selector"] = 'an object: {"label": "value"} or {"names": ["node", ...]}'
        return
    for key, value in selector.items():
        if key == "names":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                errors["node_selector"] = '"names" must be a list of node names'
        elif not isinstance(value, str | int | float | bool):
            errors["node_selector"] = f"label {key!r}: the value must be a string or number"


def _check_policy_fields(values: dict[str, Any], errors: dict[str, str]) -> None:
    for name in ("parallelism_per_cluster", "parallelism_per_pool"):
        value = values.get(name)
        if value:
            try:
                parse_limit(str(value), 100, name)
            except PlanError as exc:
                errors[name] = str(exc)
    if "error_budget" in values:
        try:
            policy.check_error_budget(str(values["error_budget"]))
        except PlanError as exc:
            errors["error_budget"] = str(exc)
    for name, parse in (("windows", parse_windows), ("blackouts", parse_blackouts)):
        if name in values:
            try:
                if not isinstance(values[name], list) or not all(isinstance(i, dict) for i in values[name]):
                    raise PlanError(f"{name} must be a list of objects")
                parse(values[name])
            except PlanError as exc:
                errors[name] = str(exc)
    if "workload_overrides" in values:
        try:
            policy.check_overrides(values["workload_overrides"])
        except PlanError as exc:
            errors["workload_overrides"] = str(exc)
    if "canary" in values:
        try:
            canary_nodes([], str(values["canary"]))
        except PlanError as exc:
            errors["canary"] = str(exc)
    if "soak_s" in values and not (isinstance(values["soak_s"], int) and 0 <= values["soak_s"] <= 7 * 86400):
        errors["soak_s"] = "seconds between 0 and 604800 (a week)"
    if "growth_step" in values and not (isinstance(values["growth_step"], int) and 1 <= values["growth_step"] <= 100):
        errors["growth_step"] = "a whole number between 1 and 100"
    if "dcgm_level" in values and not (isinstance(values["dcgm_level"], int) and 0 <= values["dcgm_level"] <= 4):
        errors["dcgm_level"] = "0 (no DCGM diagnostics) to 4 (dcgmi diag -r LEVEL)"
    if "site_checks" in values and not (isinstance(values["site_checks"], list) and all(
            isinstance(n, str) and SITE_CHECK_RE.match(n) for n in values["site_checks"])):
        errors["site_checks"] = "a list of site check names as the nodes' agents configure them (letters, digits, ._-)"
    if "after_rollback" in values and values["after_rollback"] not in AfterRollback.values():
        errors["after_rollback"] = f"one of {', '.join(AfterRollback.values())}"
    if "approvals_required" in values and not (isinstance(values["approvals_required"], int)
                                               and 1 <= values["approvals_required"] <= 10):
        errors["approvals_required"] = "between 1 and 10: every campaign needs an approver who did not write it"
    targets = values.get("target_versions", {})
    if not isinstance(targets, dict) or not all(isinstance(v, str | dict) for v in targets.values()):
        errors["target_versions"] = 'use {"driver": "580.95.05"} or {"driver": {"R570": "570.195.03"}}'


def definition_errors(values: dict[str, Any]) -> dict[str, str]:
    """What is wrong with these campaign fields (only the fields given are checked)."""
    errors: dict[str, str] = {}
    if "clusters" in values:
        _names(values["clusters"], "clusters", set(Cluster.objects.values_list("name", flat=True)), errors)
    if "pools" in values:
        clusters = values.get("clusters") if isinstance(values.get("clusters"), list) else []
        pools = Node.objects.exclude(service_state=ServiceState.GONE)
        if clusters:
            pools = pools.filter(cluster__name__in=clusters)
        _names(values["pools"], "pools", set(pools.values_list("pool", flat=True).distinct()), errors)
    if "node_selector" in values:
        _check_selector(values["node_selector"], errors)
    if "last_group" in values:
        group = values["last_group"]
        if not isinstance(group, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in group):
            errors["last_group"] = "a list of node ids"
        elif missing := sorted(set(group) - set(Node.objects.filter(pk__in=group).values_list("pk", flat=True))):
            errors["last_group"] = f"unknown node ids {missing}"
    _check_policy_fields(values, errors)
    return errors


def _apply(campaign: Campaign, values: dict[str, Any]) -> None:
    unknown = set(values) - set(DEFINITION_FIELDS)
    if unknown:
        raise DefinitionError({name: "not a campaign field that can be set" for name in sorted(unknown)})
    checked = dict(values)
    if "pools" in values and "clusters" not in values:
        checked["clusters"] = campaign.clusters  # pools are known within the campaign's clusters
    errors = definition_errors(checked)
    if errors:
        raise DefinitionError(errors)
    for name, value in values.items():
        setattr(campaign, name, value)


def create_campaign(user: User, values: dict[str, Any], advisories: list[int] | None = None) -> Campaign:
    """A new draft campaign, requested by `user`, with its "created" event."""
    with transaction.atomic():
        campaign = Campaign(requested_by=user)
        _apply(campaign, values)
        campaign.save()
        if advisories:
            campaign.advisories.set(advisories)
        locked = evidence.lock_campaign(campaign.pk)
        evidence.campaign_event(locked, EvidenceKind.CREATED, actor_of(user),
                                {"fields": _described(campaign), "advisories": sorted(advisories or [])})
        return campaign


def update_campaign(campaign_id: int, user: User, values: dict[str, Any],
                    advisories: list[int] | None = None) -> Campaign:
    """Edit a campaign before it starts: it goes back to draft, and its editor can never approve it."""
    with transaction.atomic():
        campaign = evidence.lock_campaign(campaign_id)
        if campaign.status not in CampaignStatus.EDITABLE:
            raise CampaignError(f"campaign {campaign.pk} is {campaign.status}; it can no longer be edited")
        before = _described(campaign)
        _apply(campaign, values)
        campaign.status, campaign.approved_plan = CampaignStatus.DRAFT, None
        campaign.save()
        changes = {k: [before.get(k), v] for k, v in _described(campaign).items() if before.get(k) != v}
        if advisories is not None:
            old = sorted(campaign.advisories.values_list("pk", flat=True))
            campaign.advisories.set(advisories)
            if old != sorted(advisories):
                changes["advisories"] = [old, sorted(advisories)]
        campaign.editors.add(user)
        evidence.campaign_event(campaign, EvidenceKind.EDITED, actor_of(user), {"changes": changes})
        return campaign


def _described(campaign: Campaign) -> dict[str, Any]:
    values = {name: getattr(campaign, name) for name in DEFINITION_FIELDS}
    values["wait_limit"] = campaign.wait_limit.total_seconds() if campaign.wait_limit else None
    values["deadline"] = campaign.deadline.isoformat() if campaign.deadline else None
    return values


def add_last_group(campaign_id: int, user: User, node_ids: list[int]) -> Campaign:
    """Take the plan's offer: sweep these nodes (e.g. exposed receivers) after every other node."""
    campaign = Campaign.objects.get(pk=campaign_id)
    group = list(dict.fromkeys([*campaign.last_group, *node_ids]))
    return update_campaign(campaign_id, user, {"last_group": group})


# -- targets and scope -------------------------------------------------------------------
def _newer(version: str, than: str, component: str) -> bool:
    if not than:
        return bool(version)  # a component the node lacks (no livepatch yet) is wanted
    if component == "kernel":  # uname -r: the ABI number orders kernels of one upstream release
        from advisories.distro_versions import kernel_order, kernel_release

        ka, kb = kernel_release(version), kernel_release(than)
        if ka is not None and kb is not None:
            return kernel_order(*ka[:2]) > kernel_order(*kb[:2])
    a, b = parse_version(component, version), parse_version(component, than)
    if a.key is None or b.key is None:
        return version != than
    return a.key > b.key


def _advisory_ids(campaign: Campaign) -> list[int] | None:
    manager = getattr(campaign, "advisories", None)
    if manager is None or campaign.pk is None:
        return None
    return list(manager.values_list("pk", flat=True))


def _exposures(nodes: list[Node], campaign: Campaign) -> dict[int, list[tuple[str, str, Any]]]:
    """node id -> [(component, fixed version, deadline)] of its open exposures (advisories app)."""
    try:
        from advisories.choices import ExposureState
        from advisories.models import Exposure
        from advisories.osv import OS_PACKAGE
    except ImportError:  # the advisories app is optional for planning with explicit targets
        return {}
    rows = Exposure.objects.filter(node__in=nodes, state=ExposureState.OPEN)
    advisory_ids = _advisory_ids(campaign)
    if advisory_ids is not None and advisory_ids:
        rows = rows.filter(advisory_id__in=advisory_ids)
    found: dict[int, list[tuple[str, str, Any]]] = {}
    for node_id, component, fixed, deadline in rows.values_list(
        "node_id", "component", "affected_range__fixed_version", "deadline"
    ):
        # A distribution package's fix is no component version: _os_targets turns it into one.
        found.setdefault(node_id, []).append((component, "" if component == OS_PACKAGE else fixed, deadline))
    return found


def _os_targets(nodes: list[Node], campaign: Campaign) -> dict[int, OsTarget]:
    """node id -> what fixes its open exposures to the campaign's distribution advisories
    (advisories.osplan: a livepatch, the fixed kernel and its reboot, a packaged driver)."""
    from advisories import osplan

    advisory_ids = _advisory_ids(campaign)
    remedies = osplan.remedies([n.pk for n in nodes], advisory_ids or None)
    kernels = {n.pk: n.running_kernel for n in nodes}
    found = {node_id: osplan.node_target(remedy, kernels[node_id]) for node_id, remedy in remedies.items()}
    return {node_id: t for node_id, t in found.items() if t.kind}


def node_target(campaign: Campaign, node: Node, versions: dict[str, str],
                exposures: list[tuple[str, str, Any]], os_target: OsTarget | None = None) -> tuple[dict[str, str], str]:
    """The versions this node must reach, and why it is skipped when that is empty."""
    target: dict[str, str] = {}
    if campaign.target_versions:
        for component, wanted in campaign.target_versions.items():
            if isinstance(wanted, dict):
                branch = parse_version(DRIVER, versions.get(DRIVER, "")).branch if component == DRIVER else ""
                chosen = wanted.get(branch) or wanted.get("*")
                if not chosen:
                    return {}, f"no target version for {component} branch {branch or '?'}"
            else:
                chosen = str(wanted)
            target[component] = str(chosen)
    else:
        # The fixed version within the node's own branch: the highest any open exposure asks for.
        # A packaged driver is fixed by the distribution's package: NVIDIA's upstream fix is no version
        # its package manager can install (advisories.findings: the distribution's source decides).
        packaged = set(os_target.install) & {DRIVER} if os_target else set()
        fixes = [(c, f) for c, f, _deadline in exposures if c not in packaged]
        fixes += list((os_target.target if os_target else {}).items())
        for component, fixed in fixes:
            if fixed and (component not in target or _newer(fixed, target[component], component)):
                target[component] = fixed
        if not target and os_target and os_target.unpatched:
            return {}, f"no patch step for the distribution packages {', '.join(os_target.unpatched)}"
        if not target:
            return {}, "no open exposure with a fixed version"
    needed = {}
    for component, version in target.items():
        current = versions.get(component, "")
        # A move to another driver branch is wanted even when the new branch number is lower.
        other_branch = component == DRIVER and bool(current) and (
            parse_version(DRIVER, version).branch != parse_version(DRIVER, current).branch)
        # A campaign rolling another back goes down to the recorded previous versions.
        downgrade = campaign.rollback_of_id is not None
        if current != version and (downgrade or other_branch or _newer(version, current, component)):
            needed[component] = version
    if not needed:
        return {}, "already at or above the target versions"
    return needed, ""


def scope_nodes(campaign: Campaign) -> tuple[list[Node], list[Node]]:
    """(nodes in scope, other nodes of the same clusters that may receive work)."""
    nodes = Node.objects.exclude(service_state=ServiceState.GONE).select_related("cluster").prefetch_related(
        "components", "workloads"
    )
    if campaign.clusters:
        nodes = nodes.filter(cluster__name__in=campaign.clusters)
    everyone = list(nodes)
    selector = dict(campaign.node_selector or {})
    names = set(selector.pop("names", []) or [])
    in_scope: list[Node] = []
    others: list[Node] = []
    for node in everyone:
        chosen = (not campaign.pools or node.pool in campaign.pools) and (not names or node.name in names) and all(
            str(node.labels.get(k)) == str(v) for k, v in selector.items()
        )
        (in_scope if chosen else others).append(node)
    return in_scope, others


def _plan_node(campaign: Campaign, node: Node, target: dict[str, str], deadline: Any,
               exposed_to: tuple[str, ...] = (), remedy: str = "") -> PlanNode:
    versions = {c.component: c.version for c in node.components.all()}
    workloads = tuple(
        PlanWorkload(
            ref=w.scheduler_id, name=w.name, gpus=w.gpus,
            policy=policy.workload_policy(campaign, w.scheduler_id, w.name, w.policy),
            checkpoint_engine=w.checkpoint_engine, inference_engine=w.engine, engine_version=w.engine_version,
            model_name=w.model_name, model_version=w.model_version,
            requires=tuple(sorted({**{str(k): str(v) for k, v in (w.requires or {}).items()},
                                   **portability.placement_requires(w.placement)}.items())),
            owner=w.owner, notes=tuple(str(n) for n in (w.placement or {}).get("notes") or ()),
        )
        for w in node.workloads.all() if w.gone_at is None
    )
    return PlanNode(
        id=node.pk, name=node.name, cluster=node.cluster.name, pool=node.pool, gpu_model=node.gpu_model,
        gpu_count=node.gpu_count, versions=versions, workloads=workloads, target=target, deadline=deadline,
        last=node.pk in set(campaign.last_group or []), exposed_to=exposed_to, remedy=remedy,
    )


def policy_of(campaign: Campaign, restarters: dict[str, str] | None = None) -> Policy:
    try:
        return Policy(
            start=max(timezone.now(), campaign.created_at or timezone.now()),
            per_cluster=campaign.parallelism_per_cluster, per_pool=campaign.parallelism_per_pool,
            windows=parse_windows(campaign.windows or []), blackouts=parse_blackouts(campaign.blackouts or []),
            node_seconds=campaign.node_estimate_s, cold_restart_allowed=campaign.cold_restart_allowed,
            deadline=campaign.deadline,
            placement="home" if campaign.workload_placement == Placement.HOME else "move",
            restarters=restarters or {}, canary=campaign.canary, soak_s=campaign.soak_s,
            growth=campaign.wave_growth, growth_step=campaign.growth_step,
        )
    except PlanError as exc:
        raise CampaignError(f"campaign {campaign.pk}: {exc}", status=400) from exc


def _executors(nodes: list[Node]) -> dict[str, Executor]:
    found: dict[str, Executor] = {}
    for node in nodes:
        if node.cluster.name not in found:
            found[node.cluster.name] = get_executor(node.cluster)
    return found


def _receiver_exposures(nodes: list[Node], campaign: Campaign) -> dict[int, tuple[str, ...]]:
    """node id -> names of the campaign's advisories it is exposed to (open exposures)."""
    from advisories.choices import ExposureState
    from advisories.models import Exposure

    advisory_ids = _advisory_ids(campaign)
    if not advisory_ids:
        return {}
    found: dict[int, set[str]] = {}
    for node_id, publisher, ident in Exposure.objects.filter(
            node__in=nodes, state=ExposureState.OPEN, advisory_id__in=advisory_ids).values_list(
            "node_id", "advisory__publisher", "advisory__publisher_id"):
        found.setdefault(node_id, set()).add(f"{publisher} {ident}".strip())
    return {k: tuple(sorted(v)) for k, v in found.items()}


def compute_plan(campaign: Campaign) -> dict[str, Any]:
    """Run the planner on the current inventory (read only: the dry run)."""
    in_scope, others = scope_nodes(campaign)
    if not in_scope:
        # A typo in a selector would otherwise plan, run and "complete" a campaign that patched nothing.
        raise CampaignError(
            f"campaign {campaign.pk} selects no node: clusters {campaign.clusters or 'any'}, pools "
            f"{campaign.pools or 'any'}, node_selector {campaign.node_selector or {}}", status=400)
    executors = _executors([*in_scope, *others])
    reasons = {n.pk: executors[n.cluster.name].reachable(node_ref(n)) for n in [*in_scope, *others]}
    holds = _holds(executors, [n for n in [*in_scope, *others] if not reasons[n.pk]], reasons)
    exposures = _exposures(in_scope, campaign)
    os_targets = {} if campaign.target_versions else _os_targets(in_scope, campaign)
    scope: list[PlanNode] = []
    skipped, blocked, held = [], [], []
    for node in in_scope:
        versions = {c.component: c.version for c in node.components.all()}
        mine = exposures.get(node.pk, [])
        target, reason = node_target(campaign, node, versions, mine, os_targets.get(node.pk))
        if not target:
            skipped.append({"node": node.pk, "name": node.name, "reason": reason})
            others.append(node)  # not swept, so it may receive work
            continue
        if reasons[node.pk]:
            # Listed, never swept: its first step could only fail.
            blocked.append({"node": node.pk, "name": node.name, "cluster": node.cluster.name,
                            "target": target, "reason": reasons[node.pk]})
            continue
        if holds.get(node.pk) and campaign.held_nodes == HeldNodes.SKIP:
            # Someone else took it out of service: theirs to give back, not ours to touch.
            held.append({"node": node.pk, "name": node.name, "cluster": node.cluster.name, "target": target,
                         **holds[node.pk]})
            continue
        deadlines = [d for _c, _f, d in mine if d is not None]
        os_target = os_targets.get(node.pk)
        scope.append(_plan_node(campaign, node, target, min(deadlines) if deadlines else None,
                                remedy=os_target.kind if os_target else ""))
    usable = [n for n in others if n.service_state == ServiceState.IN_SERVICE and not reasons[n.pk]
              and not holds.get(n.pk)]
    exposed = _receiver_exposures(usable, campaign)
    receivers = [_plan_node(campaign, node, {}, None, exposed.get(node.pk, ())) for node in usable]
    restarters = {name: ex.restarts_cold_starts for name, ex in executors.items()}
    try:
        content = run_planner(scope, receivers, policy_of(campaign, restarters))
    except PlanError as exc:
        raise CampaignError(f"campaign {campaign.pk}: {exc}", status=400) from exc
    for node_id, os_target in os_targets.items():
        if entry := content["nodes"].get(str(node_id)):
            # What the distribution fixes per source package on this node's release, and what no step patches.
            entry["os_packages"] = os_target.packages
            if os_target.install:  # the exact binaries each component's patch installs (the agent's packages)
                entry["os_install"] = os_target.install
            if os_target.unpatched:
                entry["risks"].append(f"no patch step for {', '.join(os_target.unpatched)}")
    content["skipped"] = skipped
    content["blocked"] = blocked
    content["held"] = held
    for node_id, hold in holds.items():
        if str(node_id) in content["nodes"]:
            content["nodes"][str(node_id)]["held_by"] = hold  # swept, keeping the other hold
    content["summary"]["blocked"] = len(blocked)
    content["summary"]["held"] = len(held)
    unreported = unreported_gpu_users(campaign, executors, [n for n in in_scope if str(n.pk) in content["nodes"]])
    for node_id, users in unreported.items():
        content["nodes"][str(node_id)]["unreported_gpu_users"] = users
    content["unreported_gpu_users"] = [{"node": node_id, "name": content["nodes"][str(node_id)].get("name", ""),
                                        "users": users} for node_id, users in unreported.items()]
    content["summary"]["unreported_gpu_users"] = sum(len(u) for u in unreported.values())
    add_reservations(content, campaign.pk, {n.pk: n for n in in_scope}, executors)
    return content


def add_reservations(content: dict[str, Any], campaign_id: int, nodes: dict[int, Node],
                     executors: dict[str, Executor]) -> None:
    """List under each wave the maintenance reservations the engine will create when it is admitted
    (one per cluster whose back end holds one: SupportsWaveReservations.wave_reservation), with their nodes and time."""
    total = 0
    for wave in content.get("waves") or []:
        by_cluster: dict[str, list[str]] = {}
        for node_id in wave.get("nodes") or []:
            node = nodes.get(int(node_id))
            # A livepatched node keeps taking work: no reservation holds it.
            if node is not None and not in_place((content["nodes"].get(str(node_id)) or {}).get("target")):
                by_cluster.setdefault(node.cluster.name, []).append(node.name)
        start = parse_datetime(wave["start"]) if wave.get("start") else None
        end = parse_datetime(wave["end"]) if wave.get("end") else None
        minutes = policy.reservation_minutes(start, end, start or timezone.now())
        listed = []
        for cluster, names in sorted(by_cluster.items()):
            ex = executors[cluster]
            name = (ex.wave_reservation(campaign_id, int(wave["wave"]))
                    if isinstance(ex, SupportsWaveReservations) else "")
            if name:
                listed.append({"cluster": cluster, "name": name, "nodes": sorted(names), "start": wave.get("start"),
                               "minutes": minutes})
        wave["reservations"] = listed
        total += len(listed)
    content["summary"]["reservations"] = total


def _reported(user: GpuUser, known: list[tuple[str, str, int]]) -> str:
    """Why the scheduler accounts for this GPU user ("" when it does not): it declared it with GPUs."""
    if user.owner_kind == "slurm_job":
        wanted = {(WorkloadKind.SLURM_JOB, user.owner_id)}
    elif user.owner_kind == "k8s_pod":
        wanted = {(WorkloadKind.K8S_POD, user.owner_id)}
    else:  # a bare process: only a workload registered with the agent is known
        wanted = {(WorkloadKind.PROCESS, user.workload_id)} if user.workload_id else set()
    for kind, ref, gpus in known:
        if (kind, ref) in wanted and gpus > 0:
            return f"{kind} {ref} with {gpus} GPU(s)"
    return ""


def unreported_gpu_users(campaign: Campaign, executors: dict[str, Executor],
                         nodes: list[Node]) -> dict[int, list[dict[str, Any]]]:
    """node id -> the processes holding a GPU there that no scheduler reported as a GPU workload (a pod
    without an nvidia.com/gpu request, a job that declared no GPUs, a process started by hand), each
    with what the campaign's workload policy does with it (checkpoint, stop or wait)."""
    found: dict[int, list[dict[str, Any]]] = {}
    for node in nodes:
        ex = executors[node.cluster.name]
        if not isinstance(ex, SupportsGpuUsers):
            continue  # this back end cannot see GPU users: the scheduler's view is all there is
        try:
            users = ex.gpu_users(node_ref(node))
        except ExecutorError as exc:
            found[node.pk] = [{"error": f"its GPU users could not be read: {exc}"}]
            continue
        if not users:
            continue
        known = list(Workload.objects.filter(Q(node=node) | Q(nodes=node), gone_at__isnull=True).distinct()
                     .values_list("kind", "scheduler_id", "gpus"))
        for user in users:
            if user.system or _reported(user, known):
                continue
            if user.stays:  # a DaemonSet's or static pod: the back end leaves it on its node, whatever the policy
                chosen, action = "", user.stays
            else:
                # Looked up as the engine will: by the workload the back end acts on (WorkloadInfo id and name).
                ref = user.workload_ref or (user.owner_id if user.owner_kind != "process"
                                            else f"{BARE_PROCESS}{user.pid}")
                chosen = policy.workload_policy(campaign, ref, user.workload_name or user.name, "")
                action = POLICY_ACTIONS.get(chosen, chosen)
            found.setdefault(node.pk, []).append({
                "pid": user.pid, "name": user.name, "owner": {"kind": user.owner_kind, "id": user.owner_id},
                "devices": list(user.devices), "cgroup": user.cgroup, "policy": chosen, "action": action})
    return found


# What the plan says happens to a GPU user under each workload policy.
POLICY_ACTIONS = {"checkpoint": "checkpoint it", "cold_restart": "stop it", "wait": "wait for it to end"}


STALE_MARK = re.compile(r"\bgs-(\d+)-\d+\b")


def _holds(executors: dict[str, Executor], nodes: list[Node], reasons: dict[int, str]) -> dict[int, dict[str, Any]]:
    """node id -> {"hold": what holds it, "stale": marks of gpusweep campaigns that are over} for every
    node someone other than this campaign keeps out of service. A node whose back end does not answer
    is blocked instead (`reasons`)."""
    found: dict[int, dict[str, Any]] = {}
    for node in nodes:
        ex = executors[node.cluster.name]
        if not isinstance(ex, SupportsMaintenanceHolds):
            continue  # this back end knows of no one else's holds
        try:
            hold = ex.maintenance_hold(node_ref(node))
        except ExecutorError as exc:
            reasons[node.pk] = f"its state could not be read: {exc}"
            continue
        if not hold:
            continue
        ids = {int(i) for i in STALE_MARK.findall(hold)}
        live = set(Campaign.objects.filter(pk__in=ids, status__in=CampaignStatus.ACTIVE).values_list("pk", flat=True))
        # A mark of a campaign that is over is reported as such, never silently kept or removed.
        found[node.pk] = {"hold": hold, "stale_marks_of_campaigns": sorted(ids - live)}
    return found


# -- life cycle --------------------------------------------------------------------------
def _set_status(campaign: Campaign, expected: set[str], status: str, **fields: Any) -> None:
    rows = Campaign.objects.filter(pk=campaign.pk, status__in=expected).update(status=status, **fields)
    if rows != 1:
        raise CampaignError(f"campaign {campaign.pk} is {campaign.status}; cannot become {status}")
    campaign.status = status
    for name, value in fields.items():
        setattr(campaign, name, value)


def make_plan(campaign_id: int, user: User | None) -> Plan:
    """Store a new plan version; earlier approvals no longer count (they approved another plan)."""
    with transaction.atomic():
        campaign = evidence.lock_campaign(campaign_id)
        if campaign.status not in CampaignStatus.EDITABLE:
            raise CampaignError(f"campaign {campaign.pk} is {campaign.status}; plans are made before it starts")
        content = compute_plan(campaign)
        version = (campaign.plans.aggregate(v=Max("version"))["v"] or 0) + 1
        plan = Plan.objects.create(campaign=campaign, version=version, created_by=user, content=content,
                                   summary=content["summary"])
        _set_status(campaign, set(CampaignStatus.EDITABLE), CampaignStatus.PLANNED, approved_plan=None)
        evidence.campaign_event(campaign, EvidenceKind.PLANNED, actor_of(user), {
            "plan": plan.pk, "version": version, "summary": content["summary"],
            "blocked": [b["name"] for b in content.get("blocked", [])],
            "exposed_receivers": [r["name"] for r in content.get("exposed_receivers", [])]})
        return plan


def compare_plans(campaign: Campaign, old_version: int | None = None, new_version: int | None = None
                  ) -> dict[str, Any]:
    """Compare two stored versions, or the newest stored one with a fresh re-plan."""
    plans = {p.version: p for p in campaign.plans.all()}
    if not plans:
        raise CampaignError(f"campaign {campaign.pk} has no stored plan to compare", status=400)
    old = plans.get(old_version or max(plans))
    if old is None:
        raise CampaignError(f"campaign {campaign.pk} has no plan version {old_version}", status=404)
    if new_version is None:
        new_content = compute_plan(campaign)
    elif new_version in plans:
        new_content = plans[new_version].content
    else:
        raise CampaignError(f"campaign {campaign.pk} has no plan version {new_version}", status=404)
    return {"old": old.version, "new": new_version or "re-plan", **compare(old.content, new_content)}


def authors(campaign: Campaign, plan: Plan) -> set[int]:
    """Who wrote what an approver approves: the requester, every editor, the plan's maker."""
    found = set(campaign.editors.values_list("pk", flat=True))
    found |= {pk for pk in (campaign.requested_by_id, plan.created_by_id) if pk is not None}
    return found


def approve(campaign_id: int, user: User, comment: str = "") -> Campaign:
    """Approve the newest plan; nobody approves a plan they requested, edited or planned."""
    with transaction.atomic():
        campaign = evidence.lock_campaign(campaign_id)
        if campaign.status not in (CampaignStatus.PLANNED, CampaignStatus.APPROVED):
            raise CampaignError(f"campaign {campaign.pk} is {campaign.status}; only a planned campaign is approved")
        plan = campaign.plans.order_by("-version").first()
        assert plan is not None  # PLANNED implies a plan
        if user.pk in authors(campaign, plan):
            raise CampaignError(f"campaign {campaign.pk}: you requested, edited or planned it, so you cannot "
                                "approve it (the requester cannot approve their own campaign)", 403)
        _approval, created = Approval.objects.get_or_create(campaign=campaign, plan=plan, user=user,
                                                            defaults={"comment": comment})
        if created:
            evidence.campaign_event(campaign, EvidenceKind.APPROVED, actor_of(user), {
                "plan": plan.pk, "version": plan.version, "comment": comment})
        count = Approval.objects.filter(plan=plan).count()
        if count >= campaign.approvals_required and campaign.status == CampaignStatus.PLANNED:
            _set_status(campaign, {CampaignStatus.PLANNED}, CampaignStatus.APPROVED, approved_plan=plan)
            evidence.campaign_event(campaign, EvidenceKind.FULLY_APPROVED, actor_of(user),
                                    {"plan": plan.pk, "approvals": count})
        return campaign


def start(campaign_id: int, user: User | None) -> Campaign:
    """Create one sweep per planned node and begin; a node already in an active campaign is refused."""
    with transaction.atomic():
        campaign = evidence.lock_campaign(campaign_id)
        if campaign.status != CampaignStatus.APPROVED or campaign.approved_plan_id is None:
            raise CampaignError(f"campaign {campaign.pk} is {campaign.status}: it must be approved before it starts")
        plan = campaign.approved_plan
        assert plan is not None
        nodes = plan.content.get("nodes", {})
        if not nodes:
            blocked = ", ".join(f"{b['name']} ({b['reason']})" for b in plan.content.get("blocked", []))
            raise CampaignError(f"campaign {campaign.pk}: its plan sweeps no node"
                                + (f"; blocked: {blocked}" if blocked else "; every node in scope is skipped"))
        sweeps = [
            NodeSweep(campaign=campaign, node_id=int(node_id), wave=item["wave"], position=item["position"],
                      target=item["target"], planned=item)
            for node_id, item in nodes.items()
        ]
        try:
            with transaction.atomic():
                NodeSweep.objects.bulk_create(sweeps)
        except IntegrityError:
            busy = NodeSweep.objects.filter(node_id__in=[s.node_id for s in sweeps],
                                            state__in=SweepState.ACTIVE).select_related("node").first()
            where = f"node {busy.node.name} is in active campaign {busy.campaign_id}" if busy else "a node is busy"
            raise CampaignError(f"campaign {campaign.pk} cannot start: {where}") from None
        canary = plan.content.get("canary") or {}
        # "reservations": whether the approved plan lists any wave reservation; without one, no
        # dispatch asks the back ends about them (engine.sync_reservations). A plan from before the
        # count was kept says nothing, and the engine asks.
        limits = {**(plan.content.get("limits") or {}), "canary": bool(canary.get("nodes")),
                  "soak_s": int(canary.get("soak_s") or 0),
                  "reservations": bool((plan.content.get("summary") or {}).get("reservations", True))}
        _set_status(campaign, {CampaignStatus.APPROVED}, CampaignStatus.RUNNING, started_at=timezone.now(),
                    limits=limits)
        # Versions before are recorded per node as the node reports them, when it is drained.
        evidence.campaign_event(campaign, EvidenceKind.STARTED, actor_of(user), {"plan": plan.pk,
                                                                                 "nodes": len(sweeps)})
        enqueue("dispatch", campaign.pk)
        return campaign


def pause(campaign_id: int, user: User | None) -> Campaign:
    with transaction.atomic():
        campaign = evidence.lock_campaign(campaign_id)
        _set_status(campaign, {CampaignStatus.RUNNING, CampaignStatus.WAITING}, CampaignStatus.PAUSED)
        evidence.campaign_event(campaign, EvidenceKind.PAUSED, actor_of(user), {})
        return campaign


def resume(campaign_id: int, user: User | None) -> Campaign:
    with transaction.atomic():
        campaign = evidence.lock_campaign(campaign_id)
        was = campaign.status
        _set_status(campaign, {CampaignStatus.PAUSED, CampaignStatus.HALTED}, CampaignStatus.RUNNING,
                    status_reason="")
        evidence.campaign_event(campaign, EvidenceKind.RESUMED, actor_of(user), {"from": was})
        enqueue("dispatch", campaign.pk)
        return campaign


def abort(campaign_id: int, user: User | None, reason: str = "") -> Campaign:
    """Stop: pending nodes are skipped; nodes not yet patched are rolled back by their next step."""
    with transaction.atomic():
        campaign = evidence.lock_campaign(campaign_id)
        if campaign.status in CampaignStatus.TERMINAL:
            raise CampaignError(f"campaign {campaign.pk} is already {campaign.status}")
        _set_status(campaign, set(CampaignStatus.values()) - set(CampaignStatus.TERMINAL), CampaignStatus.ABORTED,
                    status_reason=reason or "aborted", finished_at=timezone.now())
        evidence.campaign_event(campaign, EvidenceKind.ABORTED, actor_of(user), {"reason": reason})
        for sweep in NodeSweep.objects.filter(campaign=campaign, state=SweepState.PENDING).only(
                "pk", "campaign_id", "evidence_seq", "evidence_head"):
            if NodeSweep.objects.filter(pk=sweep.pk, state=SweepState.PENDING).update(state=SweepState.SKIPPED):
                evidence.node_event(sweep, EvidenceKind.SKIPPED, actor_of(user), {"reason": "campaign aborted"})
                evidence.sign_node_head(sweep)
        for sweep_id in NodeSweep.objects.filter(
            campaign=campaign, state__in=SweepState.BEFORE_PATCH - {SweepState.PENDING}
        ).values_list("pk", flat=True):
            enqueue("advance", sweep_id)
        enqueue("dispatch", campaign.pk)  # seals the campaign once its last node has come to rest
        return campaign


# What a rollback campaign takes over from the campaign it rolls back: how it rolls out, not what.
ROLLBACK_COPIED = (
    "canary", "soak_s", "wave_growth", "growth_step", "parallelism_per_cluster", "parallelism_per_pool", "windows",
    "blackouts", "error_budget", "workload_policy", "wait_limit", "cold_restart_allowed", "workload_placement",
    "held_nodes", "workload_overrides", "approvals_required", "step_timeout_s", "node_estimate_s", "dcgm_level",
    "site_checks", "after_rollback",
)


def rollback_completed(campaign_id: int, user: User) -> list[Campaign]:
    """"Roll back completed nodes" of a halted (or aborted) campaign: new draft campaigns taking each
    node it finished back to the versions it recorded before its patch, one campaign per set of
    previous versions, to be planned and approved like any other. Asking again returns the same ones."""
    with transaction.atomic():
        campaign = evidence.lock_campaign(campaign_id)
        existing = list(campaign.rollbacks.order_by("pk"))
        if existing:
            return existing
        if campaign.status not in (CampaignStatus.HALTED, CampaignStatus.ABORTED):
            raise CampaignError(f"campaign {campaign.pk} is {campaign.status}: only a halted or aborted campaign's "
                                "completed nodes are rolled back")
        groups: dict[tuple[tuple[str, str], ...], list[tuple[str, str]]] = {}
        for cluster, name, target, before in NodeSweep.objects.filter(
                campaign=campaign, state=SweepState.DONE).order_by("position").values_list(
                "node__cluster__name", "node__name", "target", "versions_before"):
            previous = tuple(sorted((c, str((before or {}).get(c))) for c in target if (before or {}).get(c)))
            if previous:
                groups.setdefault(previous, []).append((cluster, name))
        if not groups:
            raise CampaignError(f"campaign {campaign.pk} has no completed node with recorded previous versions")
        created = []
        for previous, nodes in groups.items():
            versions = ", ".join(f"{c} {v}" for c, v in previous)
            values: dict[str, Any] = {name: getattr(campaign, name) for name in ROLLBACK_COPIED}
            values.update(
                name=f"Roll back #{campaign.pk} to {versions}"[:200],
                description=f"Rolls the nodes campaign #{campaign.pk} ({campaign.name}) completed back to the "
                            f"versions they had before it: {versions}.",
                clusters=sorted({c for c, _ in nodes}), node_selector={"names": [n for _, n in nodes]},
                target_versions=dict(previous))
            new = create_campaign(user, values)
            Campaign.objects.filter(pk=new.pk).update(rollback_of=campaign)
            new.rollback_of = campaign
            created.append(new)
        evidence.campaign_event(campaign, EvidenceKind.ROLLBACK_CAMPAIGN, actor_of(user), {
            "campaigns": [c.pk for c in created], "nodes": sum(len(n) for n in groups.values())})
        return created


def seal_now(campaign_id: int, user: User | None) -> None:
    """Sign the campaign's current heads on demand (an auditor's checkpoint in time)."""
    with transaction.atomic():
        evidence.seal(evidence.lock_campaign(campaign_id), "requested", actor_of(user))

