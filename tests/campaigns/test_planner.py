from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from campaigns.planner import (
    PlanError,
    PlanNode,
    PlanWorkload,
    Policy,
    compare,
    parse_blackouts,
    parse_limit,
    parse_windows,
    plan,
)

MONDAY = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
OLD = {"driver": "570.86.15", "cuda": "12.8"}


def node(i: int, *, pool: str = "a", cluster: str = "c", workloads: int = 1, gpus: int = 2, deadline_days: int = 30,
         versions: dict[str, str] | None = None, policy: str = "checkpoint", engine: str = "cuda",
         target: dict[str, str] | None = None) -> PlanNode:
    return PlanNode(
        id=i, name=f"n{i:03d}", cluster=cluster, pool=pool, gpu_model="H100", gpu_count=8,
        versions=versions or OLD, target=target or {"driver": "570.195.03"},
        workloads=tuple(PlanWorkload(ref=f"w{i}-{j}", gpus=gpus, policy=policy, checkpoint_engine=engine)
                        for j in range(workloads)),
        deadline=MONDAY + timedelta(days=deadline_days),
    )


def spare(i: int, versions: dict[str, str] | None = None, exposed_to: tuple[str, ...] = ()) -> PlanNode:
    return PlanNode(id=1000 + i, name=f"spare{i}", cluster="c", pool="spare", gpu_model="H100", gpu_count=8,
                    versions=versions or OLD, exposed_to=exposed_to)


def test_it_keeps_every_wave_within_the_cluster_and_pool_limits():
    nodes = [node(i, pool="a" if i % 2 else "b", workloads=0) for i in range(20)]
    result = plan(nodes, [], Policy(start=MONDAY, per_cluster="25%", per_pool="2"))
    for wave in result["waves"]:
        pools = Counter(result["nodes"][str(n)]["pool"] for n in wave["nodes"])
        assert len(wave["nodes"]) <= 5 and max(pools.values()) <= 2
    assert sum(len(w["nodes"]) for w in result["waves"]) == 20


def test_it_puts_the_most_urgent_nodes_first():
    nodes = [node(i, workloads=0, deadline_days=30 - i) for i in range(6)]
    result = plan(nodes, [], Policy(start=MONDAY, per_cluster="2"))
    assert result["waves"][0]["nodes"] == [5, 4]
    assert result["waves"][-1]["nodes"] == [1, 0]


def test_every_move_has_a_compatible_target_outside_this_and_the_next_wave():
    nodes = [node(i) for i in range(8)]
    receivers = [spare(0), spare(1, versions={"driver": "580.95.05", "cuda": "12.8"})]
    result = plan(nodes, receivers, Policy(start=MONDAY, per_cluster="2", cold_restart_allowed=True))
    waves = {int(k): v["wave"] for k, v in result["nodes"].items()}
    for item in result["nodes"].values():
        for move in item["moves"]:
            if move["action"] == "migrate":
                assert move["to"] != 1001, "never to another driver"
                assert waves.get(move["to"], 10**9) > item["wave"] + 1
                assert move["requires"]["must"] == {"gpu_model": "H100", "driver": "570.86.15", "cuda": "12.8"}
                assert "driver 570.86.15" in move["why"] and "gpu model H100" in move["why"]
    used = Counter(m["to"] for n in result["nodes"].values() for m in n["moves"] if m["action"] == "migrate")
    assert all(count * 2 <= 8 for count in used.values()), "never more GPUs than a target has"


def test_the_last_groups_cold_start_or_finish_first_by_policy_and_are_named():
    cold = plan([node(i) for i in range(4)], [], Policy(start=MONDAY, per_cluster="2", cold_restart_allowed=True))
    assert {c["node_name"] for c in cold["cold_starts"]} >= {"n002", "n003"}
    assert all("cold start" in " ".join(cold["nodes"][str(c["node"])]["risks"]) for c in cold["cold_starts"])
    wait = plan([node(i, policy="wait") for i in range(2)], [], Policy(start=MONDAY, per_cluster="1"))
    assert len(wait["finish_first"]) == 2 and not wait["cold_starts"]
    blocked = plan([node(i) for i in range(2)], [], Policy(start=MONDAY, per_cluster="1"))
    assert blocked["summary"]["no_capacity"] == 2
    assert "no capacity for" in blocked["nodes"]["0"]["risks"][0]


def test_it_schedules_waves_inside_windows_and_outside_blackouts():
    windows = parse_windows([{"days": [1, 2, 3], "start": "22:00", "end": "02:00", "tz": "Europe/Berlin"}])
    blackouts = parse_blackouts([{"start": "2026-12-01T00:00:00+00:00", "end": "2026-12-02T12:00:00+00:00"}])
    result = plan([node(i, workloads=0, deadline_days=1) for i in range(3)], [],
                  Policy(start=MONDAY, per_cluster="1", windows=windows, blackouts=blackouts, node_seconds=3600))
    starts = [datetime.fromisoformat(w["start"]) for w in result["waves"]]
    # Tuesday 22:00 Berlin is 21:00 UTC and inside the blackout; Wednesday's window is the first free one.
    assert starts[0] == datetime(2026, 12, 2, 21, 0, tzinfo=UTC)
    assert starts[1] == datetime(2026, 12, 2, 22, 0, tzinfo=UTC)
    assert all(any(r.startswith("past deadline") for r in n["risks"]) for n in result["nodes"].values())


def test_a_re_plan_is_compared_node_by_node():
    nodes = [node(i, workloads=0) for i in range(4)]
    first = plan(nodes, [], Policy(start=MONDAY, per_cluster="2"))
    second = plan(nodes[:3], [], Policy(start=MONDAY, per_cluster="1"))
    diff = compare(first, second)
    assert diff["removed"] == [3] and diff["added"] == []
    assert {c["node"] for c in diff["changed"]} == {1, 2}


def test_bad_limits_and_windows_name_the_field():
    with pytest.raises(PlanError, match="parallelism_per_cluster"):
        parse_limit("lots", 10, "parallelism_per_cluster")
    assert parse_limit("10%", 5, "x") == 1 and parse_limit("50%", 10, "x") == 5
    with pytest.raises(PlanError, match=r"windows\[0\]"):
        parse_windows([{"days": [9], "start": "22:00", "end": "06:00"}])


def _moves(result):
    """Each workload's first move, off the node it ran on before the campaign."""
    return {m["workload"]: m for n in result["nodes"].values() for m in n["moves"] if "arrived_from" not in m}


def test_a_pool_of_signal_workloads_sweeps_itself_with_no_spare():
    nodes = [node(i, engine="signal") for i in range(6)]
    result = plan(nodes, [], Policy(start=MONDAY, per_cluster="1"))
    waves = {int(k): v["wave"] for k, v in result["nodes"].items()}
    assert result["summary"]["cold_starts"] == result["summary"]["no_capacity"] == 0
    moves = _moves(result)
    first = result["waves"][0]["nodes"][0]
    # The first node's work goes to a node not yet drained; later work lands on patched nodes.
    assert waves[moves[f"w{first}-0"]["to"]] >= waves[first] + 2
    patched_targets = [m for m in moves.values() if m["action"] == "migrate" and "patched in wave" in m["why"]]
    assert patched_targets, "later waves use nodes patched before them"
    for item in result["nodes"].values():
        for move in item["moves"]:
            assert move["action"] == "migrate"
            to_wave = waves[move["to"]]
            assert to_wave <= item["wave"] - 2 or to_wave >= item["wave"] + 2
            assert move["requires"]["must"] == {}


def test_cuda_workloads_of_the_last_group_finish_first_or_cold_start_as_named():
    cold = plan([node(i, gpus=1) for i in range(6)], [],
                Policy(start=MONDAY, per_cluster="1", cold_restart_allowed=True, restarters={"c": "Slurm requeue"}))
    last_waves = {w["wave"] for w in cold["waves"][-2:]}
    cold_nodes = {c["node"] for c in cold["cold_starts"]}
    assert cold_nodes and all(cold["nodes"][str(n)]["wave"] in last_waves for n in cold_nodes)
    assert all(c["restarted_by"] == "Slurm requeue" and "Slurm requeue" in c["why"] for c in cold["cold_starts"])
    nobody = plan([node(i) for i in range(2)], [], Policy(start=MONDAY, per_cluster="1", cold_restart_allowed=True))
    assert all(c["restarted_by"] == "" and "nobody restarts it" in c["why"] for c in nobody["cold_starts"])
    wait = plan([node(i, policy="wait") for i in range(6)], [], Policy(start=MONDAY, per_cluster="1"))
    assert {f["action"] for f in wait["finish_first"]} == {"finish_first"} and len(wait["finish_first"]) == 6


def test_a_kernel_only_patch_parks_a_cuda_checkpoint_on_its_own_node():
    kernel = {"driver": "570.86.15", "cuda": "12.8", "kernel": "6.1.0-25"}
    nodes = [node(i, versions=kernel, target={"kernel": "6.1.0-28"}) for i in range(2)]
    home = plan(nodes, [], Policy(start=MONDAY, per_cluster="1", placement="home"))
    assert {m["action"] for m in _moves(home).values()} == {"return_home"}
    # Placement "move" prefers another node; a CRIU image (kernel-bound) never comes home.
    moved = plan(nodes, [spare(0, versions=kernel)], Policy(start=MONDAY, per_cluster="1"))
    assert {m["action"] for m in _moves(moved).values()} == {"migrate"}
    criu = [node(i, versions=kernel, target={"kernel": "6.1.0-28"}, engine="criu", gpus=0) for i in range(2)]
    blocked = plan(criu, [], Policy(start=MONDAY, per_cluster="1"))
    assert {m["action"] for m in _moves(blocked).values()} == {"blocked"}


def test_exposed_receivers_are_named_and_offered_as_a_last_group():
    nodes = [node(i) for i in range(2)]
    result = plan(nodes, [spare(0, exposed_to=("NVIDIA 5703",))], Policy(start=MONDAY, per_cluster="1"))
    assert [r["name"] for r in result["exposed_receivers"]] == ["spare0"]
    assert result["exposed_receivers"][0]["advisories"] == ["NVIDIA 5703"]
    assert result["offers"] == [{"action": "add_last_group", "nodes": [1000], "why": result["offers"][0]["why"]}]
    # Clean receivers are preferred to exposed ones.
    clean = plan(nodes, [spare(0, exposed_to=("NVIDIA 5703",)), spare(1)], Policy(start=MONDAY, per_cluster="1"))
    assert {m["to_name"] for m in _moves(clean).values()} == {"spare1"}
    assert clean["exposed_receivers"] == []


def test_the_last_group_comes_after_every_other_node():
    nodes = [node(i, workloads=0, deadline_days=60) for i in range(3)]
    last = PlanNode(id=99, name="spare-late", cluster="c", pool="spare", gpu_model="H100", gpu_count=8,
                    versions=OLD, target={"driver": "570.195.03"}, last=True,
                    deadline=MONDAY + timedelta(days=1))
    result = plan([*nodes, last], [], Policy(start=MONDAY, per_cluster="2"))
    assert result["nodes"]["99"]["wave"] == max(w["wave"] for w in result["waves"]) > result["nodes"]["0"]["wave"]
    assert result["nodes"]["99"]["last_group"] is True


def test_an_exponential_rollout_starts_with_a_canary_that_soaks_and_grows_1_2_4_8():
    nodes = [node(i, workloads=0) for i in range(15)]
    result = plan(nodes, [], Policy(start=MONDAY, per_cluster="100%", canary="auto", soak_s=600,
                                    growth="exponential", growth_step=2, node_seconds=1800))
    assert [w["size"] for w in result["waves"]] == [1, 2, 4, 8]
    assert result["waves"][0]["canary"] and not result["waves"][1]["canary"]
    first_end = datetime.fromisoformat(result["waves"][0]["end"])
    assert datetime.fromisoformat(result["waves"][1]["start"]) == first_end + timedelta(seconds=600)
    assert result["canary"]["soak_until"] == result["waves"][1]["start"]
    # Capped by the limits: at most 3 a wave.
    capped = plan(nodes, [], Policy(start=MONDAY, per_cluster="3", canary="auto", growth="exponential"))
    assert [w["size"] for w in capped["waves"]] == [1, 2, 3, 3, 3, 3]
    linear = plan(nodes, [], Policy(start=MONDAY, per_cluster="100%", canary="1", growth="linear", growth_step=3))
    assert [w["size"] for w in linear["waves"]] == [1, 4, 7, 3]


def test_the_automatic_canary_takes_one_node_per_driver_group_and_cluster():
    other = {"driver": "580.82.07", "cuda": "13.0"}
    nodes = [node(i) for i in range(3)] + [node(10 + i, versions=other) for i in range(3)] + [
        node(20, cluster="d")]
    result = plan(nodes, [], Policy(start=MONDAY, per_cluster="100%", canary="auto", cold_restart_allowed=True))
    assert sorted(result["canary"]["nodes"]) == [0, 10, 20]
    assert sorted(result["waves"][0]["nodes"]) == [0, 10, 20]
