"""A 240-node plan checked node by node against what the planner's rules say it must be.

The expectation is derived here from the rules in campaigns/planner.py's docstring (urgency
order, per-cluster limits, back-to-back waves, receivers outside the campaign filled in name order,
the plan's texts), not recorded from a run: a faster planner has to produce this same plan,
key order included.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from campaigns.choices import SweepState
from campaigns.planner import PlanNode, PlanWorkload, Policy, plan

START = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
OLD = {"driver": "570.86.15", "cuda": "12.8"}
CLUSTERS, PER_CLUSTER, NODES, SPARES = 3, 10, 240, 20
HALF_HOUR = timedelta(seconds=1800)


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def fleet() -> tuple[list[PlanNode], list[PlanNode]]:
    scope = []
    for i in range(NODES):
        livepatch = i % 10 == 9
        waits = i % 7 == 0
        scope.append(PlanNode(
            id=i, name=f"n{i:03d}", cluster=f"c{i % CLUSTERS}", pool="a", gpu_model="H100", gpu_count=8,
            versions=dict(OLD), target={"livepatch": "5"} if livepatch else {"driver": "570.195.03"},
            remedy="livepatch" if livepatch else "",
            workloads=(PlanWorkload(ref=f"w{i}", name=f"job{i}", gpus=2, policy="wait" if waits else "checkpoint",
                                    checkpoint_engine="cuda" if i % 2 == 0 else "signal"),),
            # Every node more urgent than the next: planning order is id order within a wave.
            deadline=START + timedelta(minutes=10 * (i + 1)),
        ))
    # Spares listed out of name order: the planner fills them by name.
    spares = [PlanNode(id=10_000 + c * 100 + j, name=f"s{c}-{j:02d}", cluster=f"c{c}", pool="spare",
                       gpu_model="H100", gpu_count=8, versions=dict(OLD))
              for c in range(CLUSTERS) for j in reversed(range(SPARES))]
    return scope, spares


def expected_plan(scope: list[PlanNode]) -> tuple[dict[str, dict[str, object]], list[list[int]]]:
    # Each cluster's k-th node (by urgency) is in wave k // limit + 1; waves run back to back from START.
    wave_of = {n.id: n.id // CLUSTERS // PER_CLUSTER + 1 for n in scope}
    order = sorted(scope, key=lambda n: (wave_of[n.id], n.id))
    waves = [[n.id for n in order if wave_of[n.id] == w] for w in range(1, max(wave_of.values()) + 1)]
    cuda = {"engine": "cuda", "must": {"gpu_model": "H100", "driver": "570.86.15", "cuda": "12.8"}, "if_reported": {}}
    signal = {"engine": "signal", "must": {}, "if_reported": {}}
    moved = dict.fromkeys(range(CLUSTERS), 0)  # checkpoints moved so far per cluster: 4 per 8-GPU spare
    nodes: dict[str, dict[str, object]] = {}
    for position, node in enumerate(order, start=1):
        wave, workload = wave_of[node.id], node.workloads[0]
        ends = START + wave * HALF_HOUR
        deadline = node.deadline
        assert deadline is not None
        entry: dict[str, object] = {
            "name": node.name, "cluster": node.cluster, "pool": "a", "wave": wave, "position": position,
            "expected_start": iso(ends - HALF_HOUR), "expected_end": iso(ends), "deadline": iso(deadline),
            "target": node.target, "versions": {c: OLD.get(c, "") for c in node.target}, "last_group": False,
        }
        risks = [f"past deadline {iso(deadline)}"] if ends > deadline else []
        if node.remedy:
            entry.update(moves=[], risks=risks, steps=list(SweepState.IN_PLACE_STEPS), remedy="livepatch",
                         in_place=True, stays=[{"workload": workload.ref, "name": workload.name, "gpus": 2,
                                                "why": "a livepatch fixes the running kernel: no drain, no "
                                                       "checkpoint, no reboot"}])
            nodes[str(node.id)] = entry
            continue
        move: dict[str, object] = {"workload": workload.ref, "name": workload.name, "gpus": 2,
                                   "engine": workload.checkpoint_engine}
        if workload.policy == "wait":
            move.update(action="finish_first", why="policy waits for it to end before the node drains")
            risks.insert(0, f"waits for {workload.name} to finish")
        else:
            cluster = node.id % CLUSTERS
            k = moved[cluster]
            moved[cluster] += 1
            spare = f"s{cluster}-{k // 4:02d}"
            depends = ("cuda checkpoint: same cuda 12.8, driver 570.86.15, gpu model H100"
                       if workload.checkpoint_engine == "cuda"
                       else "signal checkpoint: its image needs nothing of the node")
            move.update(requires=cuda if workload.checkpoint_engine == "cuda" else signal, action="migrate",
                        to=10_000 + cluster * 100 + k // 4, to_name=spare,
                        why=f"{depends}; {8 - 2 * (k % 4)} GPUs free on {spare}; outside the campaign")
        entry.update(moves=[move], risks=risks, steps=list(SweepState.STEPS))
        nodes[str(node.id)] = entry
    return nodes, waves


def test_a_240_node_plan_is_what_the_rules_say_node_by_node():
    scope, spares = fleet()
    result = plan(scope, spares, Policy(start=START, per_cluster=str(PER_CLUSTER), cold_restart_allowed=False))
    nodes, waves = expected_plan(scope)
    assert [w["nodes"] for w in result["waves"]] == waves
    assert list(result["nodes"]) == [str(i) for wave in waves for i in wave]
    for key, entry in nodes.items():
        got = result["nodes"][key]
        assert got == entry, key
        # The same keys in the same order (the stored plan's JSON is compared as text elsewhere).
        assert list(got) == list(entry), key
        assert [list(m) for m in got["moves"]] == [list(m) for m in entry["moves"]], key  # type: ignore[union-attr]
    livepatch = sum(1 for n in scope if n.remedy)
    finish_first = sum(1 for n in scope if not n.remedy and n.id % 7 == 0)
    assert result["summary"] == {
        "nodes": NODES, "waves": len(waves), "expected_end": iso(START + len(waves) * HALF_HOUR),
        "migrations": NODES - livepatch - finish_first, "returns_home": 0, "livepatch_only": livepatch,
        "packages_in_place": 0, "cold_starts": 0, "finish_first": finish_first, "no_capacity": 0,
        # Nodes 0 and 1 end at 12:30 after deadlines of 12:10 and 12:20; node 2's is 12:30 itself.
        "exposed_receivers": 0, "past_deadline": 2,
    }
    assert [f["node"] for f in result["finish_first"]] == [i for w in waves for i in w if i % 7 == 0 and i % 10 != 9]
