"""A real Prometheus (Debian's `prometheus` package) scrapes gpusweep during a campaign; promtool
checks and unit-tests the alert rules; the Grafana dashboard's panels are the README's and their
queries run on that Prometheus.

The campaign runs on PostgreSQL, Redis, gunicorn with two workers and a real Celery worker
process, with the memory executor (executors/memory.py, a test double shared by the processes
through its state folder) and a fixed step time, as in tests/campaigns/test_e2e.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from campaigns import services
from campaigns.choices import CampaignStatus, SweepState
from campaigns.models import Campaign
from conftest import need
from executors.memory import Fleet
from inventory.models import Cluster
from tests.campaigns.fleet import add_node, approved_campaign, user
from tests.campaigns.test_e2e import STEP_S, _env
from tests.campaigns.test_e2e import _need_services as need_e2e_services
from tests.helpers import REPO, free_port, stop_process_group, wait_for

RULES = REPO / "deploy" / "prometheus"
DASHBOARD = REPO / "deploy" / "grafana" / "gpusweep-dashboard.json"
DASHBOARD_README = REPO / "deploy" / "grafana" / "README.md"
TOKEN = "prometheus-scrape-token-0123456789abcdef"
NODES = 4


def _promtool() -> str:
    tool = shutil.which("promtool")
    need(tool is not None, "needs promtool: apt-get install prometheus (scripts/install-system-deps.sh)")
    return str(tool)


def test_promtool_passes_the_alert_rules_and_their_unit_tests():
    promtool = _promtool()
    check = subprocess.run([promtool, "check", "rules", str(RULES / "rules.yml")], capture_output=True, text=True,
                           timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 7 rules found" in check.stdout
    # rules.test.yml feeds series to each alert and says when it must fire and with what text.
    unit = subprocess.run([promtool, "test", "rules", "rules.test.yml"], cwd=RULES, capture_output=True, text=True,
                          timeout=60)
    assert unit.returncode == 0, unit.stdout + unit.stderr


def test_the_rule_unit_tests_catch_a_broken_rule(tmp_path: Path):
    promtool = _promtool()
    broken = (RULES / "rules.yml").read_text().replace(
        "gpusweep_campaign_seconds_since_progress > gpusweep_campaign_step_timeout_seconds",
        "gpusweep_campaign_seconds_since_progress > 2 * gpusweep_campaign_step_timeout_seconds")
    (tmp_path / "rules.yml").write_text(broken)
    shutil.copy(RULES / "rules.test.yml", tmp_path)
    unit = subprocess.run([promtool, "test", "rules", "rules.test.yml"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert unit.returncode != 0 and "GpusweepCampaignStalled" in unit.stdout + unit.stderr


def test_the_example_scrape_configuration_is_valid(tmp_path: Path):
    promtool = _promtool()
    token = tmp_path / "token"
    token.write_text(TOKEN)
    config = (RULES / "prometheus.yml").read_text().replace("/etc/prometheus/gpusweep-metrics-token", str(token))
    (tmp_path / "prometheus.yml").write_text(config)
    shutil.copy(RULES / "rules.yml", tmp_path)
    check = subprocess.run([promtool, "check", "config", "prometheus.yml"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


def readme_panels() -> list[str]:
    table = DASHBOARD_README.read_text().split("## Panels", 1)[1]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith(("| panel", "| ---"))]
    return [row.split("|")[1].strip() for row in rows]


def panel_queries(dashboard: dict[str, Any]) -> dict[str, list[str]]:
    return {panel["title"]: [target["expr"] for target in panel["targets"]] for panel in dashboard["panels"]}


@pytest.mark.django_db
def test_the_dashboard_loads_with_the_panels_its_readme_names_over_metrics_gpusweep_exports(settings):
    dashboard = json.loads(DASHBOARD.read_text())
    names = readme_panels()
    assert len(names) == 12 and sorted(names) == sorted(panel_queries(dashboard))
    settings.GPUSWEEP_METRICS_TOKEN = TOKEN
    body = Client().get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).content.decode()
    families = set(re.findall(r"^# TYPE (\S+) ", body, flags=re.MULTILINE))

    def exported(name: str) -> bool:  # a family, or a histogram's series
        return name in families or re.sub(r"_(bucket|sum|count)$", "", name) in families

    for title, queries in panel_queries(dashboard).items():
        for query in queries:
            used = re.findall(r"gpusweep_[a-z0-9_]+", query)
            assert used and all(exported(name) for name in used), (title, used)
    # The README names each panel's metric too.
    for row in DASHBOARD_README.read_text().split("## Panels", 1)[1].splitlines():
        for metric in re.findall(r"`(gpusweep_[a-z0-9_]+)`", row):
            assert exported(metric), metric


# -- Prometheus scraping a campaign ---------------------------------------------------------------
class Prometheus:
    """A Prometheus server of the test's own: scrapes gpusweep every second and loads rules.yml."""

    def __init__(self, folder: Path, target: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (folder / "token").write_text(TOKEN)
        shutil.copy(RULES / "rules.yml", folder / "rules.yml")
        (folder / "prometheus.yml").write_text(json.dumps({  # JSON is YAML
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": ["rules.yml"],
            "scrape_configs": [{
                "job_name": "gpusweep", "metrics_path": "/metrics",
                "authorization": {"type": "Bearer", "credentials_file": str(folder / "token")},
                "static_configs": [{"targets": [target]}],
            }],
        }))
        self.log = folder / "prometheus.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                ["prometheus", f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                cwd=folder, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def api(self, path: str, **params: Any) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("query", query=expr)["result"]
        return result

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False


def _need_services() -> None:
    need_e2e_services()
    need(shutil.which("prometheus") is not None,
         "needs Prometheus: apt-get install prometheus (scripts/install-system-deps.sh)")


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(args, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _timeline(prom: Prometheus, campaign_id: int) -> list[dict[str, float]]:
    """Every scrape's node counts by state, in order, from the raw samples Prometheus stored."""
    series = prom.query(f'gpusweep_node_sweeps{{campaign="{campaign_id}"}}[10m]')
    by_time: dict[float, dict[str, float]] = {}
    for one in series:
        for at, value in one["values"]:
            by_time.setdefault(float(at), {})[one["metric"]["state"]] = float(value)
    return [by_time[at] for at in sorted(by_time)]


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_prometheus_sees_the_node_sweeps_of_a_campaign_move_through_their_states(tmp_path: Path, settings):
    _need_services()
    queue = f"metrics-{uuid.uuid4().hex[:12]}"
    settings.CELERY_TASK_DEFAULT_QUEUE = queue  # what this process enqueues
    state = tmp_path / "fleet"
    # The campaign end to end test's processes (PostgreSQL, Redis, the memory fleet's folder, its step
    # time), on a queue of this test's own, with the metrics token.
    env = {**_env(state), "GPUSWEEP_CELERY_QUEUE": queue, "GPUSWEEP_METRICS_TOKEN": TOKEN}
    fleet = Fleet(str(state))
    cluster = Cluster.objects.create(name="local", kind="static", connection={
        "executor": "memory", "executor_options": {"state_file": str(state)}})
    for index in range(NODES):
        add_node(fleet, cluster, f"gpu{index:02d}", labels={"sweep": "yes"})
    for index in range(2):
        add_node(fleet, cluster, f"spare{index:02d}", labels={"sweep": "no"}, workloads=0)
    rita, alan = user("rita", "operator"), user("alan", "approver")
    campaign = approved_campaign(rita, alan, name="scraped", parallelism_per_cluster="1", step_timeout_s=30,
                                 error_budget="0")

    web_port = free_port()
    log = tmp_path / "service.log"
    procs = [
        _spawn([sys.executable, "-m", "gunicorn", "gpusweep.wsgi:application", "--bind", f"127.0.0.1:{web_port}",
                "--workers", "2"], env, log),
        _spawn([sys.executable, "-m", "celery", "-A", "gpusweep", "worker", "--concurrency", "2", "--loglevel",
                "INFO", "--without-heartbeat", "--without-mingle", "--without-gossip"], env, log),
    ]
    prom = Prometheus(tmp_path, f"127.0.0.1:{web_port}")
    try:
        assert wait_for(prom.ready, timeout=30), prom.log.read_text()[-2000:]
        scraped = wait_for(lambda: [r for r in prom.query('up{job="gpusweep"}') if r["value"][1] == "1"], timeout=60)
        assert scraped, f"no successful scrape; targets {prom.api('targets')}; log:\n{log.read_text()[-3000:]}"

        services.start(campaign.pk, rita)
        done = wait_for(lambda: Campaign.objects.get(pk=campaign.pk).status in CampaignStatus.TERMINAL,
                        timeout=120, interval=0.5)
        assert done, f"campaign did not finish; log:\n{log.read_text()[-4000:]}"
        assert Campaign.objects.get(pk=campaign.pk).status == CampaignStatus.COMPLETED
        # A scrape after the end, then what Prometheus stored.
        expr = f'gpusweep_node_sweeps{{campaign="{campaign.pk}",state="done"}} == {NODES}'
        assert wait_for(lambda: prom.query(expr), timeout=30), prom.query("gpusweep_node_sweeps")
        timeline = _timeline(prom, campaign.pk)

        assert all(sum(sample.values()) == NODES for sample in timeline), timeline
        pending = [sample["pending"] for sample in timeline]
        finished = [sample["done"] for sample in timeline]
        assert pending == sorted(pending, reverse=True) and pending[-1] == 0 and pending[0] >= NODES - 1, pending
        assert finished == sorted(finished) and finished[-1] == NODES, finished
        assert any(0 < n < NODES for n in finished), f"no scrape caught the campaign midway: {timeline}"
        working = {s for sample in timeline for s, n in sample.items() if s in SweepState.WORKING and n > 0}
        assert len(working) >= 2, f"scrapes saw only {working} of the working states: {timeline}"

        # Histograms folded from the evidence: one patch per node, each taking the executor's step time.
        step = 'executor="memory",step="patching"'
        assert float(prom.query(f"gpusweep_step_duration_seconds_count{{{step}}}")[0]["value"][1]) == NODES
        assert float(prom.query(f"gpusweep_step_duration_seconds_sum{{{step}}}")[0]["value"][1]) >= NODES * STEP_S
        assert float(prom.query('gpusweep_checkpoint_bytes_count{engine="criu"}')[0]["value"][1]) == NODES
        # Two gunicorn workers answered the scrapes in turn: the counters never went back.
        resets = prom.query("sum(resets(gpusweep_step_duration_seconds_count[10m]))")
        assert float(resets[0]["value"][1]) == 0

        # The rules loaded and evaluate; a campaign that moved is not stalled.
        groups = prom.api("rules")["groups"]
        rules = {rule["name"]: rule for group in groups for rule in group["rules"]}
        assert len(rules) == 7 and all(rule["health"] == "ok" for rule in rules.values()), rules
        assert rules["GpusweepCampaignStalled"]["state"] == "inactive"
        # Every dashboard query runs on this Prometheus (an invalid one answers an error), and the
        # sweeps panel shows this campaign's nodes.
        queries = panel_queries(json.loads(DASHBOARD.read_text()))
        results = {title: [prom.query(q.replace("$__rate_interval", "1m").replace("$campaign", str(campaign.pk)))
                           for q in exprs] for title, exprs in queries.items()}
        by_state = {r["metric"]["state"]: float(r["value"][1]) for r in results["Node sweeps by state"][0]}
        assert by_state["done"] == NODES and sum(by_state.values()) == NODES, by_state
    finally:
        for proc in (*procs, prom.proc):
            stop_process_group(proc)
        time.sleep(0.2)
