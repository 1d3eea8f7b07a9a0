"""The cost pages through the real URL stack: uploads, results, errors, access."""

from __future__ import annotations

import io

import pytest
from django.contrib.staticfiles import finders
from django.test import Client

from tests.costs.test_drain import HAND, SACCT
from tests.costs.test_simulate import TRACE

pytestmark = pytest.mark.django_db
NODES_CSV = "name,gpu_count,gpu_model,driver\n" + "".join(f"n{i},1,T4,550.163.01\n" for i in range(4))


def upload(text: str, name: str) -> io.BytesIO:
    data = io.BytesIO(text.encode())
    data.name = name
    return data


@pytest.fixture
def viewer(client: Client, make_user) -> Client:  # type: ignore[no-untyped-def]
    make_user("vera", "viewer")
    client.login(username="vera", password="pw-vera-12345")
    return client


def test_the_drain_page_measures_an_uploaded_sacct_file(viewer: Client):
    response = viewer.post("/costs/drain/", {
        "sacct": upload(SACCT, "sacct.txt"), "windows": "2025-03-10T08:00", "baseline_start": "2025-03-01T08:00",
        "baseline_end": "2025-03-03T08:00", "days": "2", "tz": "UTC"})
    page = response.content.decode()
    assert response.status_code == 200
    assert f'class="drain-net">{HAND["drain_gpu_hours_net"]:.2f}<' in page
    assert f'class="held-jobs">{HAND["held_jobs"]}<' in page
    assert f'class="held-hours">{HAND["held_requested_gpu_hours"]:.2f}<' in page
    assert f'class="recompute-ceiling">{HAND["recompute_gpu_hours_ceiling"]:.2f}<' in page
    # The charts are SVG drawn on the server (costs/charts.py): nothing to fetch.
    assert 'data-chart="drain-chart-1"' in page and '<svg class="cost-chart" id="drain-chart-1"' in page


def test_a_bad_sacct_file_is_named_with_its_line_and_nothing_is_shown(viewer: Client):
    broken = SACCT.replace("2025-03-09T10:00:00|2025-03-09T10:00:00", "2025-03-09 10:00|2025-03-09T10:00:00")
    page = viewer.post("/costs/drain/", {"sacct": upload(broken, "sacct.txt"), "windows": "2025-03-10T08:00",
                                         "days": "2", "tz": "UTC"}).content.decode()
    assert "sacct.txt: line 11: Submit &#x27;2025-03-09 10:00&#x27;" in page
    assert "drain-net" not in page and "data-chart" not in page


def test_the_simulator_page_compares_the_strategies(viewer: Client):
    response = viewer.post("/costs/simulate/", {
        "fleet": "file", "fleet_file": upload(NODES_CSV, "nodes.csv"), "trace": "file",
        "trace_file": upload(TRACE, "pods.csv"), "severity": "critical", "release": "10",
        "trace_start": "2023-01-01T00:00:00+00:00", "p_parallelism": "1", "p_cadences": "monthly,quarterly",
        "p_patch_minutes": "60"})
    page = response.content.decode()
    assert response.status_code == 200, page
    assert page.count("<td>maintenance window</td>") == 2
    assert "<td>rolling drain and wait</td>" in page and "<td>checkpoint-migrate sweep</td>" in page
    assert "deadline 15.0 days" in page  # critical, from the deadline policy
    assert 'data-chart="sim-patched"' in page


def test_the_simulator_page_names_a_bad_parameter(viewer: Client):
    page = viewer.post("/costs/simulate/", {
        "fleet": "file", "fleet_file": upload(NODES_CSV, "nodes.csv"), "trace": "file",
        "trace_file": upload(TRACE, "pods.csv"), "severity": "high", "trace_start": "2023-01-01T00:00:00+00:00",
        "p_checkpointable_share": "1.5"}).content.decode()
    assert "checkpointable_share=1.5: expected in [0, 1]" in page
    assert 'id="sim-table"' not in page


def test_the_simulators_labels_are_written_for_people(viewer: Client):
    """Issue 31: "Time limit, as a multiple of a task's real duration", not "limit factor:"."""
    import re

    from costs.inputs import tunable
    from costs.model import LABELS

    page = viewer.get("/costs/simulate/").content.decode()
    labels = [re.sub(r"<[^>]+>", "", label).strip() for label in re.findall(r"<label[^>]*>(.*?)</label>", page)]
    assert "Time limit, as a multiple of a task&#x27;s real duration" in labels
    assert "Nodes patched at a time" in labels and "Soak after the canary (minutes)" in labels
    for name, _help, _default in tunable():
        assert name in LABELS, f"{name} has no label"
    assert not [label for label in labels if "_" in label or label.endswith(":") or label[:1].islower()], labels
    assert 'id="simulate-form"' in page and "<p><label" not in page  # the console's fields, not form.as_p


def test_the_pages_need_a_login_and_a_role(client: Client, make_user):  # type: ignore[no-untyped-def]
    assert client.get("/costs/drain/").status_code == 302
    make_user("nobody")
    client.login(username="nobody", password="pw-nobody-12345")
    assert client.get("/costs/drain/").status_code == 403
    assert client.get("/costs/simulate/").status_code == 403


def test_the_chart_library_is_served_from_the_projects_static_files():
    assert finders.find("costs/uplot/uPlot.iife.min.js")
    assert finders.find("costs/charts.js")
