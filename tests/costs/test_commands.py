"""`manage.py drain_cost` and `manage.py simulate` as a user runs them."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from campaigns.models import Campaign
from inventory.models import Cluster
from tests.advisories.conftest import add_node
from tests.costs.test_drain import HAND, SACCT
from tests.costs.test_pages import NODES_CSV
from tests.costs.test_simulate import TRACE


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.fixture
def sacct_file(tmp_path: Path) -> Path:
    path = tmp_path / "sacct.txt"
    path.write_text(SACCT)
    return path


def drain(path: Path, fmt: str) -> str:
    return run("drain_cost", "--sacct", str(path), "--window", "2025-03-10T08:00", "--baseline", "2025-03-01T08:00",
               "2025-03-03T08:00", "--days", "2", "--format", fmt)


def test_drain_cost_prints_the_five_steps_per_window(sacct_file: Path):
    table = drain(sacct_file, "table")
    net = round(HAND["drain_gpu_hours_net"], 2)
    assert f"drain (net, days above the baseline count against it): {net:g} GPU-hours" in table
    assert "3. held back: 6 job(s) pending when the window opened, 112 requested GPU-hours (1 without" in table
    assert f"at most {round(HAND['recompute_gpu_hours_ceiling'], 2):g} GPU-hours" in table
    [row] = list(csv.DictReader(io.StringIO(drain(sacct_file, "csv"))))
    assert float(row["held_requested_gpu_hours"]) == HAND["held_requested_gpu_hours"]
    data = json.loads(drain(sacct_file, "json"))
    assert [d["submissions"] for d in data["windows"][0]["days"]] == [2, 7]


def test_drain_cost_names_the_bad_line_and_prints_nothing(sacct_file: Path):
    sacct_file.write_text(SACCT.replace("gres/gpu:v100=1|gres/gpu:v100=1", "gres/gpu:v100=1|gres/gpu:v100"))
    out = io.StringIO()
    with pytest.raises(CommandError, match=r"sacct.txt: line 19: AllocTRES entry 'gres/gpu:v100' is not a TRES"):
        call_command("drain_cost", "--sacct", str(sacct_file), "--window", "2025-03-10T08:00", stdout=out)
    assert out.getvalue() == ""


def test_drain_cost_refuses_a_window_that_is_not_a_time(sacct_file: Path):
    with pytest.raises(CommandError, match="--window 'next Tuesday' is not a date"):
        call_command("drain_cost", "--sacct", str(sacct_file), "--window", "next Tuesday")


@pytest.mark.django_db
def test_simulate_compares_the_strategies_on_a_node_file_and_a_pod_trace(tmp_path: Path):
    (tmp_path / "nodes.csv").write_text(NODES_CSV)
    (tmp_path / "pods.csv").write_text(TRACE)
    args = ["simulate", "--fleet", str(tmp_path / "nodes.csv"), "--trace", str(tmp_path / "pods.csv"),
            "--release", "10", "--parallelism", "1", "--cadences", "monthly", "--patch-minutes", "60"]
    table = run(*args)
    assert "maintenance window" in table and "rolling drain and wait" in table and "checkpoint-migrate sweep" in table
    data = json.loads(run(*args, "--format", "json"))
    assert [(r["strategy"], r["cadence"]) for r in data["rows"]] == [
        ("window", "monthly"), ("drain_wait", "1"), ("sweep", "1")]
    assert data["params"]["limit_factor"] == 2.0  # the model's assumptions come with the figures
    assert data["facts"]["release_day"] == 10


@pytest.mark.django_db
def test_simulate_reads_a_cluster_of_the_inventory_and_sacct_output(tmp_path: Path):
    cluster = Cluster.objects.create(name="lab", kind="static")
    add_node(cluster, "gpu01", driver="570.86.15", cuda="12.8")
    add_node(cluster, "gpu02", driver="570.86.15", cuda="12.8")
    cluster.nodes.update(gpu_count=8, gpu_model="H100")
    (tmp_path / "sacct.txt").write_text(SACCT.replace("gpu[01-02]", "gpu01"))
    data = json.loads(run("simulate", "--cluster", "lab", "--trace", str(tmp_path / "sacct.txt"),
                          "--release", "2025-03-09T12:00", "--parallelism", "1", "--format", "json"))
    assert data["facts"]["nodes"] == 2
    assert data["facts"]["release"] == "2025-03-09T12:00:00+00:00"
    assert {r["strategy"] for r in data["rows"]} == {"window", "drain_wait", "sweep"}


@pytest.mark.django_db
def test_simulate_takes_a_campaigns_policy_and_an_explicit_parameter_still_wins(tmp_path: Path):
    (tmp_path / "nodes.csv").write_text(NODES_CSV)
    (tmp_path / "pods.csv").write_text(TRACE)
    campaign = Campaign.objects.create(name="c", canary="0", soak_s=60, parallelism_per_cluster="3",
                                       workload_policy="wait", node_estimate_s=120)
    data = json.loads(run("simulate", "--fleet", str(tmp_path / "nodes.csv"), "--trace", str(tmp_path / "pods.csv"),
                          "--release", "10", "--campaign", str(campaign.pk), "--patch-minutes", "5",
                          "--format", "json"))
    params = data["params"]
    assert (params["canary"], params["soak_minutes"], params["parallelism"]) == ("0", 1, ["3"])
    assert (params["not_checkpointable"], params["checkpointable_share"]) == ("wait", 0.0)
    assert params["patch_minutes"] == 5  # given on the command line: beats the campaign's 2 minutes
    with pytest.raises(CommandError, match="no campaign 999999"):
        call_command("simulate", "--fleet", str(tmp_path / "nodes.csv"), "--trace", str(tmp_path / "pods.csv"),
                     "--campaign", "999999")


@pytest.mark.django_db
def test_simulate_names_an_unknown_cluster():
    with pytest.raises(CommandError, match="cluster 'nowhere' has no node with GPUs"):
        call_command("simulate", "--cluster", "nowhere", "--trace", __file__)
