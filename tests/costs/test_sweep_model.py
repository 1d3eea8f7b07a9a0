"""Issue 32: the sweep treats each node on its own, traces are read whole, the CLI and page answer."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.test import Client

from costs import fleet, report, synthetic
from costs.fleet import SimNode
from costs.inputs import params_from, read_trace
from costs.model import HELP, ModelError, Params
from costs.placement import place
from costs.simulate import simulate
from costs.strategies import INF, Scenario, sweep
from costs.trace import Task, Trace, from_openb
from costs.tracestats import busy_at, trace_stats
from tests.costs.test_simulate import HEADER, TRACE

D = 86400.0
FIXTURES = Path(__file__).parent / "fixtures"
OPENB = Path(settings.GPUSWEEP_SHARED_DATA_DIR) / "traces" / "alibaba-openb-2023"
needs_openb = pytest.mark.skipif(not (OPENB / "openb_pod_list_default.csv").exists(),
                                 reason="the shared Alibaba trace (../shared/data/traces) is not beside the checkout")


def _patched(nodes: list[SimNode], tasks: list[Task], params: Params) -> list[float]:
    tr = Trace(tasks=tasks, origin=datetime(2026, 1, 1, tzinfo=UTC), end=30 * D, kind="sacct")
    scenario = Scenario(nodes=nodes, trace=tr, placement=place(tasks, nodes), params=params, release=0.0)
    return sweep(scenario, params.parallelism[0]).patched_at


def _fleet() -> list[SimNode]:
    """One P100 node (its own cluster) and four T4 nodes: one node a wave per cluster, so the P100
    node shares wave 1 with t1; t2 to t4 are waves 2 to 4."""
    return [SimNode(index=0, name="p0", gpus=1, cluster="p100s", gpu_model="P100", versions={"driver": "old"})] + [
        SimNode(index=i, name=f"t{i}", gpus=2, cluster="t4s", gpu_model="T4", versions={"driver": "old"})
        for i in range(1, 5)]


ALONE = Params(parallelism=("1",), canary="0", patch_minutes=60, gpu_memory_gib=0, wait_limit_h=48,
               checkpointable_share=1.0, wait_poll_s=0)
# The T4 jobs move to t3 and t4 (waves 3 and 4) and have ended when those nodes' turns come.
WORK = [Task(name=f"job{i}", submit=0, start=0, end=3600.0 * (i + 0.5), milli=1000, limit=None, node=f"t{i}")
        for i in (1, 2)]


def _service(end: float | None) -> Task:
    return Task(name="svc", submit=0, start=0, end=end, milli=1000, limit=None, service=True, node="p0")


def _run(tasks: list[Task], params: Params):  # type: ignore[no-untyped-def]
    tr = Trace(tasks=tasks, origin=datetime(2026, 1, 1, tzinfo=UTC), end=30 * D, kind="sacct")
    [row] = simulate(_fleet(), tr, params.with_(release_s=0.0), strategies=("sweep",)).rows
    return row


def test_a_workload_without_receiver_waits_up_to_the_limit_then_its_node_fails():
    """Done-when 1 under the engine's rules (campaigns.engine.steps._wait_first, cold restart not
    allowed, a campaign's default): the P100 node's service has no receiver (no other P100), so
    before anything is checkpointed the node waits for it to end, up to the 48 h wait limit; it
    still runs then, so the node fails, unpatched, the service untouched. Every T4 node is patched
    when it would be without the service: a node waiting for a receiver keeps its slot (p0 is alone
    in its cluster) but holds no wave order (campaigns.policy.admits), so waves 3 and 4 go on. Under
    the engine's rule before issue 32 (`hold`, a what-if now) t3 and t4 waited for p0's failure."""
    h = 3600.0
    params = ALONE
    assert (params.last_group, params.wave_order) == ("wait", "strict")
    without = _patched(_fleet(), WORK, params)
    assert without == [h * n for n in (1, 1, 2, 3, 4)]
    waited = _patched(_fleet(), [_service(None), *WORK], params)
    assert waited[0] == INF and waited[1:] == without[1:]  # the other nodes' days to patched unchanged
    row = _run([_service(None), *WORK], params)
    assert (row.nodes_patched, row.cold_starts, row.recomputed_gpu_hours) == (4, 0, 0)
    [held] = row.holds
    assert (held.node, held.task, held.hours) == ("p0", "svc", pytest.approx(48))
    assert (held.why, held.ended) == ("no receiver for its checkpoint",
                                      "still running at the wait limit: the node failed")
    assert any("p0 (svc: no receiver for its checkpoint, still running at the wait limit)" in n for n in row.notes)
    assert any("waited up to the wait limit for work no node could receive" in n for n in row.notes)
    # What the rule saves against the engine before it: 1 + 2 + 3 + 4 hours against 1 + 2 + 49 + 50
    # (p0 counted to the trace's end, day 30, in both).
    [note] = [n for n in row.notes if "wave order" in n]
    assert f"{(10 * h + 30 * D) / D:,.1f} node-days; {(102 * h + 30 * D) / D:,.1f} had a waiting node held" in note
    held_order = _patched(_fleet(), [_service(None), *WORK], params.with_(wave_order="hold"))
    assert held_order[0] == INF and held_order[3:] == [49 * h, 50 * h]


def test_a_node_waiting_for_a_receiver_keeps_its_slot():
    """Its slot is kept: two P100 nodes in one cluster, one at a time; p0's service has no receiver
    (p1, the next wave, takes nothing), so p0 waits 48 h and fails; p1 starts only then (its slot),
    and p0, back on the old driver, has no room for p1's service (1 GPU, full): p1 waits too. The
    what-if `own_work` gives the slot back at once."""
    h = 3600.0
    nodes = [SimNode(index=i, name=f"p{i}", gpus=1, cluster="p100s", gpu_model="P100", versions={"driver": "old"})
             for i in range(2)]
    tasks = [Task(name="svc", submit=0, start=0, end=None, milli=1000, limit=None, service=True, node="p0"),
             Task(name="job", submit=0, start=0, end=10 * h, milli=1000, limit=None, node="p1")]
    # p1 starts at 48 h: its job has ended, nothing to move: patched 1 h later.
    assert _patched(nodes, tasks, ALONE) == [INF, 49 * h]
    assert _patched(nodes, tasks, ALONE.with_(wave_order="own_work")) == [INF, 11 * h]


def test_a_workload_without_receiver_that_ends_within_the_limit_lets_its_node_be_patched():
    """The service ends at 10.5 h: the node sees it end (here at once; the engine looks every
    WAIT_POLL_S), has nothing left to move and is patched, 1 h. Wave 3 does not wait for it (it
    waited for a receiver alone); under `hold`, the engine before issue 32, it did."""
    h = 3600.0
    assert _patched(_fleet(), [_service(10.5 * h), *WORK], ALONE) == [11.5 * h, h, 2 * h, 3 * h, 4 * h]
    assert _patched(_fleet(), [_service(10.5 * h), *WORK], ALONE.with_(wave_order="hold")) == [
        11.5 * h, h, 2 * h, 12.5 * h, 13.5 * h]
    row = _run([_service(10.5 * h), *WORK], ALONE)
    assert [(x.task, x.hours, x.ended) for x in row.holds] == [("svc", pytest.approx(10.5), "finished")]
    # The engine's look, every 30 s from the node's start: the end at 10.5 h + 10 s is seen at 10.5 h + 30 s.
    polled = _patched(_fleet(), [_service(10.5 * h + 10), *WORK], ALONE.with_(wait_poll_s=30))
    assert polled[0] == pytest.approx(11.5 * h + 30)


def test_without_a_wait_limit_the_node_waits_for_ever_and_holds_only_its_slot():
    """wait_limit none: the service never ends, so the P100 node never finishes; it waits for a
    receiver alone, so every T4 node is patched on time (under `hold`, the engine before issue 32,
    waves 3 and 4 never started)."""
    h = 3600.0
    patched = _patched(_fleet(), [_service(None), *WORK], ALONE.with_(wait_limit_h=None))
    assert patched == [INF, h, 2 * h, 3 * h, 4 * h]
    held = _patched(_fleet(), [_service(None), *WORK], ALONE.with_(wait_limit_h=None, wave_order="hold"))
    assert held == [INF, h, 2 * h, INF, INF]


def test_with_cold_restarts_allowed_the_workload_without_receiver_is_stopped_at_once():
    """cold_restart_allowed (`last_group` cold_restart): the plan cold-starts it; the node is patched
    in its 1 h turn, the service loses its warm-up (10 minutes of its GPU); every other node on time."""
    h = 3600.0
    params = ALONE.with_(last_group="cold_restart")
    assert _patched(_fleet(), [_service(None), *WORK], params) == [h * n for n in (1, 1, 2, 3, 4)]
    row = _run([_service(None), *WORK], params)
    assert (row.cold_starts, row.recomputed_gpu_hours, row.holds) == (1, pytest.approx(10 / 60), ())


def test_the_what_ifs_the_engine_does_not_do_are_kept_and_named():
    """`fail`: the engine before it waited (the node failed at once, every other node on time);
    `wait_then_cold_restart`: the wait, then a cold restart at the limit (p0 patched at 49 h, the
    T4 nodes on time: it waited for a receiver alone)."""
    h = 3600.0
    failed = _patched(_fleet(), [_service(None), *WORK], ALONE.with_(last_group="fail"))
    assert failed == [INF, h, 2 * h, 3 * h, 4 * h]
    row = _run([_service(None), *WORK], ALONE.with_(last_group="fail"))
    assert any("p0 (svc: no receiver for its checkpoint)" in n for n in row.notes)
    assert any("failed at once (--last-group fail, a what-if" in n for n in row.notes)
    killed = _patched(_fleet(), [_service(None), *WORK], ALONE.with_(last_group="wait_then_cold_restart"))
    assert killed == [49 * h, h, 2 * h, 3 * h, 4 * h]
    assert "what-if" in HELP["last_group"] and "fail" in HELP["last_group"]
    assert "what-ifs" in HELP["wave_order"].lower() and "hold" in HELP["wave_order"]


def test_a_node_that_failed_is_back_in_service_unpatched_and_receives_the_work_of_the_next():
    """The engine decides "nowhere to go" again at every look, on the receivers as they are: a node
    that failed is back in service on the old driver (campaigns.engine.recovery.unwind), so it is a
    node where a cuda checkpoint of its model is valid. Two P100 nodes, one at a time: q0's service
    has no receiver, waits 48 h and fails; q1 starts then, and its service moves to q0, which has a
    free GPU: q1 is patched 1 h later. Were q0 full, q1 would wait its 48 h and fail too."""
    h = 3600.0
    params = ALONE

    def sweep_of(gpus: int) -> list[float]:
        nodes = [SimNode(index=i, name=f"q{i}", gpus=gpus, gpu_model="P100", versions={"driver": "old"})
                 for i in range(2)]
        services = [Task(name=f"svc{i}", submit=0, start=0, end=None, milli=1000, limit=None, service=True,
                         node=f"q{i}") for i in range(2)]
        return _patched(nodes, services, params)

    assert sweep_of(2) == [INF, 49 * h]
    assert sweep_of(1) == [INF, INF]
    nodes = [SimNode(index=i, name=f"q{i}", gpus=2, gpu_model="P100", versions={"driver": "old"}) for i in range(2)]
    tr = Trace(tasks=[Task(name=f"svc{i}", submit=0, start=0, end=None, milli=1000, limit=None, service=True,
                           node=f"q{i}") for i in range(2)],
               origin=datetime(2026, 1, 1, tzinfo=UTC), end=30 * D, kind="sacct")
    [row] = simulate(nodes, tr, params.with_(release_s=0.0), strategies=("sweep",)).rows
    # q1 found its receiver at its first look: it held nothing.
    assert [(x.node, x.task, x.ended) for x in row.holds] == [
        ("q0", "svc0", "still running at the wait limit: the node failed")]


def test_work_that_came_after_the_plan_is_decided_on_the_receivers_as_they_are():
    """A job that starts on t1 after the release is no part of the plan: the engine decides at t1's
    turn whether any node could take its checkpoint (`_nowhere_to_go`). None can (t0 is patched, on
    the new driver; no later wave), so t1 waits for it to end (10 h), then is patched; with cold
    restarts allowed it is stopped at once. In a fleet of four, t1 (wave 2) sends it to t3 (wave 4),
    where no receiver is left: t3 waits for it."""
    h = 3600.0
    late = Task(name="late", submit=0, start=0.5 * h, end=10 * h, milli=1000, limit=None, node="t1")

    def fleet_of(count: int) -> list[SimNode]:
        return [SimNode(index=i, name=f"t{i}", gpus=1, gpu_model="T4", versions={"driver": "old"})
                for i in range(count)]

    assert _patched(fleet_of(2), [late], ALONE) == [h, 11 * h]
    cold = ALONE.with_(last_group="cold_restart")
    assert _patched(fleet_of(2), [late], cold) == [h, 2 * h]
    assert _patched(fleet_of(4), [late], ALONE) == [h, 2 * h, 3 * h, 11 * h]


def test_gpu_spec_is_honoured_where_a_task_is_placed():
    rows = [HEADER, "a,1000,0,1,1000,V100M32,BE,Succeeded,0,500,0", "b,1000,0,1,1000,,BE,Succeeded,0,600,0"]
    nodes = [SimNode(index=0, name="t", gpus=4, gpu_model="T4"),
             SimNode(index=1, name="v", gpus=4, gpu_model="V100M32")]
    tr = from_openb("\n".join(rows), Params())
    assert tr.tasks[0].gpu_models == ("V100M32",)
    assert place(tr.tasks, nodes).node_of == [1, 0]  # first fit, except where the spec says otherwise


def test_the_utilization_equals_a_direct_count_from_the_csv():
    """Done-when 3: the simulator's busy share at the release is the file's own count."""
    nodes = [SimNode(index=i, name=f"n{i}", gpus=1, gpu_model="T4") for i in range(4)]
    params = Params(release_s=10 * D)
    result = simulate(nodes, from_openb(TRACE, params), params, strategies=("window",))
    assert result.utilization * result.gpus == pytest.approx(busy_at(TRACE, 10 * D)) == pytest.approx(1.0)


# The bundled trace's P100 services (qos LS) whose cuda checkpoints reach the last two waves of their group.
P100_SERVICES = {f"openb-pod-{n:04d}" for n in (1, 2, 6, 7, 8, 9, 10, 11, 13, 14, 15)}


@needs_openb
def test_on_the_bundled_trace_the_utilization_is_the_files_and_exposure_falls_with_parallelism():
    """Done-when 2 on the bundled trace, with a campaign's defaults. The 11 P100 services that reach
    the last two waves of their driver group have no receiver: their nodes wait the 168 h wait limit
    (6 of them get the failed nodes as receivers at the limit, 5 fail), keeping their slots but not
    the wave order (campaigns.policy.admits), so the rest of the fleet goes on: the sweep's node-days
    fall as parallelism rises. Under `hold` (the engine before issue 32) those waits held every wave
    after the next: more node-days at every parallelism, and a rise from 5% to 10%. With cold
    restarts allowed nothing waits, and it falls lower still."""
    text = (OPENB / "openb_pod_list_default.csv").read_text()
    nodes = fleet.from_file(OPENB / "openb_node_list_gpu_node.csv")
    params = params_from({"parallelism": "1%,2%,5%,10%"}, release_s=100 * D)
    trace = read_trace(text, params)
    result = simulate(nodes, trace, params, strategies=("sweep",))
    assert result.placement.unplaced == 0
    assert result.utilization * result.gpus == pytest.approx(busy_at(text, 100 * D))
    exposure = [r.exposure_node_days for r in result.rows]
    assert exposure == sorted(exposure, reverse=True) and exposure[-1] < exposure[0]
    assert all(any("later waves start while a node waits for a receiver alone" in n for n in r.notes)
               for r in result.rows)
    assert all({h.task for h in r.holds} == P100_SERVICES for r in result.rows)
    assert all(len(nodes) - r.nodes_patched in (5, 6) for r in result.rows)
    held = [r.exposure_node_days for r in simulate(nodes, trace, params.with_(wave_order="hold"),
                                                   strategies=("sweep",)).rows]
    assert all(h > e for h, e in zip(held, exposure, strict=True)) and held[3] > held[2]
    allowed = simulate(nodes, trace, params.with_(last_group="cold_restart"), strategies=("sweep",))
    falls = [r.exposure_node_days for r in allowed.rows]
    assert falls == sorted(falls, reverse=True) and falls[-1] < falls[0]
    assert all(f < e for f, e in zip(falls, exposure, strict=True))


def test_the_second_trace_is_the_generators_and_exposure_falls_with_parallelism():
    """Done-when 2 on a busier generated trace (seed 7). With a campaign's defaults (cold restart not
    allowed) the work of the last two waves of each driver group has no receiver (and work that came
    after the plan finds none on the full nodes of later waves): those nodes wait up to the 168 h
    limit, keeping their slots but not the wave order, and 14 or 15 of them fail; exposure falls as
    parallelism rises. With cold restarts allowed every node is patched and it falls too, far lower."""
    assert (FIXTURES / "synthetic_pods.csv").read_text() == synthetic.pods_csv(7, count=900)
    assert (FIXTURES / "synthetic_nodes.csv").read_text() == synthetic.nodes_csv(7)
    text = (FIXTURES / "synthetic_pods.csv").read_text()
    nodes = fleet.from_file(FIXTURES / "synthetic_nodes.csv")
    params = params_from({"parallelism": "1,2,5,10"}, release_s=30 * D)
    trace = read_trace(text, params)
    engine = simulate(nodes, trace, params, strategies=("sweep",))
    exposure = [r.exposure_node_days for r in engine.rows]
    assert exposure == sorted(exposure, reverse=True) and exposure[0] > exposure[-1]
    assert [len(nodes) - r.nodes_patched for r in engine.rows] == [15, 15, 14, 14]
    assert all(any("last two waves of each driver group" in n for n in r.notes) for r in engine.rows)
    assert all(any(h.why == "no receiver for its checkpoint" for h in r.holds) for r in engine.rows)
    allowed = simulate(nodes, trace, params.with_(last_group="cold_restart"), strategies=("sweep",))
    falls = [r.exposure_node_days for r in allowed.rows]
    assert falls == sorted(falls, reverse=True) and falls[0] > falls[-1]
    assert all(r.nodes_patched == len(nodes) for r in allowed.rows)
    assert all(f * 20 < e for f, e in zip(falls, exposure, strict=True))
    stats = trace_stats(text)
    assert (stats.rows, stats.gpu_tasks, stats.constrained) == (900, 900, sum(
        1 for line in text.splitlines()[1:] if line.split(",")[5]))


def test_gpu_constraints_read_through_the_file_loaders_place_every_task_whose_model_the_fleet_has():
    """The node file is read through the inventory's mapping (`Tesla T4`, `NVIDIA A10`, `Tesla
    V100-SXM2-32GB`), the trace keeps openb's codes (`T4`, `A10|V100M32`): one rule reads both
    (inventory.gpumodel), so every constrained task goes to a node of a model it names; one constrained
    to a model the fleet lacks is left out and said so, by its spec."""
    nodes = fleet.from_file(FIXTURES / "synthetic_nodes.csv")
    assert {n.gpu_model for n in nodes} == {"Tesla T4", "NVIDIA A10", "Tesla V100-SXM2-32GB"}
    text = (FIXTURES / "synthetic_pods.csv").read_text() + "synth-pod-a100,4000,16384,1,1000,A100,BE,Running,0,,30\n"
    params = params_from({"parallelism": "5"}, release_s=30 * D)
    result = simulate(nodes, read_trace(text, params), params, strategies=("window",))
    tasks, node_of = result.trace.tasks, result.placement.node_of
    constrained = [i for i, t in enumerate(tasks) if t.gpu_models]
    assert len(constrained) == 230
    for i in constrained:
        where = node_of[i]
        if tasks[i].name == "synth-pod-a100":
            assert where is None
        else:
            assert where is not None and tasks[i].runs_on(nodes[where].gpu_model), tasks[i].name
    assert (result.placement.unplaced, result.placement.no_model) == (1, {"A100": 1})
    assert result.facts()["unplaced_no_model"] == {"A100": 1}
    assert "1 not placed, 1 of them constrained to GPU models this fleet lacks (A100: 1)" in report.sim_table(result)


def test_on_the_second_trace_the_placed_work_is_the_files_every_day():
    """Done-when 3 on the second trace: the simulator's busy share at the release, and the placed
    trace's busy GPUs on every day, equal a count from the CSV alone (every task placed)."""
    text = (FIXTURES / "synthetic_pods.csv").read_text()
    nodes = fleet.from_file(FIXTURES / "synthetic_nodes.csv")
    params = params_from({}, release_s=30 * D)
    result = simulate(nodes, read_trace(text, params), params, strategies=("window",))
    assert result.placement.unplaced == 0
    assert result.utilization * result.gpus == pytest.approx(busy_at(text, 30 * D))
    assert result.utilization == pytest.approx(0.5041, abs=1e-4)
    placed = [t for t, n in zip(result.trace.tasks, result.placement.node_of, strict=True) if n is not None]
    for day in range(60):
        busy = sum(t.milli for t in placed if t.alive(day * D)) / 1000
        assert busy == pytest.approx(busy_at(text, day * D)), day


@pytest.mark.parametrize("value", ["0", "abc", "-1%"])
def test_bad_parallelism_is_a_model_error_naming_it(value: str):
    with pytest.raises(ModelError, match="parallelism"):
        params_from({"parallelism": value})


def test_a_blank_field_keeps_the_default_and_none_unsets_it():
    assert params_from({"wait_limit_h": ""}).wait_limit_h == Params().wait_limit_h
    assert params_from({"wait_limit_h": "none"}).wait_limit_h is None


@pytest.mark.django_db
def test_simulate_help_works_and_bad_values_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as done:
        call_command("simulate", "--help")
    assert done.value.code == 0 and "--parallelism" in capsys.readouterr().out
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(synthetic.nodes_csv(7))
    pods.write_text(TRACE)
    for bad in ("0", "abc"):
        with pytest.raises(CommandError, match="parallelism") as error:
            call_command("simulate", "--fleet", str(nodes), "--trace", str(pods), "--parallelism", bad)
        assert error.value.returncode == 2


@pytest.mark.django_db
def test_the_page_answers_a_bad_value_with_a_form_error(client: Client, make_user):  # type: ignore[no-untyped-def]
    make_user("vera", "viewer")
    client.login(username="vera", password="pw-vera-12345")
    nodes = io.BytesIO(synthetic.nodes_csv(7).encode())
    nodes.name = "nodes.csv"
    pods = io.BytesIO(TRACE.encode())
    pods.name = "pods.csv"
    response = client.post("/costs/simulate/", {"fleet": "file", "fleet_file": nodes, "trace": "file",
                                                "trace_file": pods, "severity": "high", "release": "10",
                                                "trace_start": "2023-01-01T00:00:00+00:00", "p_parallelism": "0"})
    assert response.status_code == 200
    assert "parallelism" in response.context["form"].errors.get("p_parallelism", [""])[0]


@pytest.mark.django_db
def test_costs_lands_on_the_tools(client: Client, make_user):  # type: ignore[no-untyped-def]
    make_user("vera", "viewer")
    client.login(username="vera", password="pw-vera-12345")
    page = client.get("/costs/")
    assert page.status_code == 200
    assert "/costs/drain/" in page.content.decode() and "/costs/simulate/" in page.content.decode()
