from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from executors.base import NodeRef, PermanentExecutorError, TemporaryExecutorError, get_executor
from executors.memory import Fleet, MemoryExecutor
from inventory.models import Cluster
from tests.helpers import REPO

A = NodeRef(cluster="c", name="a")
B = NodeRef(cluster="c", name="b")
C = NodeRef(cluster="c", name="other-driver")


@pytest.fixture
def fleet() -> Fleet:
    fleet = Fleet()
    fleet.reset()
    old = {"driver": "570.86.15", "cuda": "12.8"}
    fleet.add_node("c", "a", versions=old)
    fleet.add_node("c", "b", versions=old)
    fleet.add_node("c", "other-driver", versions={"driver": "570.195.03", "cuda": "12.8"})
    fleet.add_workload("c", "a", "w1", name="trainer", rate=1000)
    return fleet


def test_it_moves_a_workload_and_its_step_counter_continues(fleet: Fleet):
    ex = MemoryExecutor()
    ex.drain(A, "op-drain")
    time.sleep(0.01)
    checkpoint = ex.checkpoint(A, "w1", "criu", "op-ck")
    assert checkpoint.steps and checkpoint.steps > 0
    assert ex.list_workloads(A) == []
    restored = ex.restore(B, checkpoint.checkpoint_id, "op-restore")
    time.sleep(0.01)
    [moved] = ex.list_workloads(B)
    assert moved.id == restored.workload_id and moved.name == "trainer"
    assert moved.steps is not None and moved.steps > checkpoint.steps


def test_it_repeats_nothing_for_a_repeated_operation_id(fleet: Fleet):
    ex = MemoryExecutor()
    ex.drain(A, "d")
    first = ex.patch(A, "driver", "570.195.03", "p")
    second = ex.patch(A, "driver", "570.195.03", "p")
    assert first == second
    assert fleet.snapshot()["nodes"]["c/a"]["patches"] == {"driver": 1}
    ex.reboot(A, "r")
    ex.reboot(A, "r")
    assert fleet.snapshot()["nodes"]["c/a"]["reboots"] == 1
    assert ex.verify(A).versions["driver"] == "570.195.03"


def test_it_refuses_a_restore_on_a_different_driver_and_a_second_restore(fleet: Fleet):
    ex = MemoryExecutor()
    checkpoint = ex.checkpoint(A, "w1", "criu", "ck")
    with pytest.raises(PermanentExecutorError, match="incompatible"):
        ex.restore(C, checkpoint.checkpoint_id, "r1")
    ex.restore(B, checkpoint.checkpoint_id, "r2")
    with pytest.raises(PermanentExecutorError, match="already restored"):
        ex.restore(A, checkpoint.checkpoint_id, "r3")


def test_it_refuses_to_patch_a_node_in_service(fleet: Fleet):
    with pytest.raises(PermanentExecutorError, match="not in maintenance"):
        MemoryExecutor().patch(A, "driver", "570.195.03", "p")


def test_injected_faults_fire_the_given_number_of_times(fleet: Fleet):
    fleet.inject("drain", "c/a", "temporary", times=1)
    ex = MemoryExecutor()
    with pytest.raises(TemporaryExecutorError):
        ex.drain(A, "d")
    ex.drain(A, "d")
    assert fleet.snapshot()["nodes"]["c/a"]["maintenance"] is True


def test_a_file_backed_fleet_is_shared_between_processes(tmp_path: Path):
    state = str(tmp_path / "fleet.json")
    fleet = Fleet(state)
    fleet.add_node("c", "a", versions={"driver": "570.86.15"})
    code = (
        "from executors.memory import MemoryExecutor; from executors.base import NodeRef;"
        f"MemoryExecutor(state_file={state!r}).drain(NodeRef('c', 'a'), 'op')"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)
    assert fleet.snapshot()["nodes"]["c/a"]["maintenance"] is True


@pytest.mark.django_db
def test_it_loads_the_back_end_named_by_the_cluster_or_the_setting(settings):
    settings.GPUSWEEP_EXECUTOR = "memory"
    assert isinstance(get_executor(None), MemoryExecutor)
    cluster = Cluster.objects.create(name="x", kind="static", connection={"executor": "local"})
    assert get_executor(cluster).name == "local"
    cluster.connection = {"executor": "nowhere.Missing"}
    with pytest.raises(ImproperlyConfigured, match=r"nowhere\.Missing"):
        get_executor(cluster)
