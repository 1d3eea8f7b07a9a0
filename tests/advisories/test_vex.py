"""The fleet's status as CSAF 2.0 VEX, checked against OASIS's CSAF 2.0 JSON schema.

The schema is the copy the `csaf` package (PyPI, MIT; the schema itself is OASIS's, published
under the OASIS IPR policy) ships in csaf/csaf/v20/schema/, validated here with jsonschema's
Draft 2020-12 validator; the same package's CSAF 2.0 mandatory tests (section 6.1, including the
VEX profile's) run on the document too.
"""

from __future__ import annotations

import datetime as dt
import io
import json
from importlib import resources
from typing import Any

import jsonschema
import pytest
from csaf.csaf.v20 import validate as csaf_validate
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.test import Client
from referencing import Registry, Resource

from advisories import services
from advisories.models import Exposure
from inventory.models import Cluster
from tests.advisories.conftest import FIXTURES, add_node

pytestmark = pytest.mark.django_db
SCHEMA_DIR = resources.files("csaf") / "csaf" / "v20" / "schema"


def schema_errors(document: dict[str, Any]) -> list[str]:
    schema = json.loads((SCHEMA_DIR / "csaf.json").read_text())
    registry: Registry = Registry()
    for name, uri in (("cvss-v2.0.json", "https://www.first.org/cvss/cvss-v2.0.json"),
                      ("cvss-v3.0.json", "https://www.first.org/cvss/cvss-v3.0.json"),
                      ("cvss-v3.1.json", "https://www.first.org/cvss/cvss-v3.1.json")):
        contents = json.loads((SCHEMA_DIR / "referenced" / name).read_text())
        registry = registry.with_resource(uri, Resource.from_contents(contents))
    validator = jsonschema.Draft202012Validator(schema, registry=registry,
                                                format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def failed_mandatory_tests(document: dict[str, Any], preset: str = "mandatory") -> list[str]:
    report = csaf_validate(document, preset=preset)
    return [f"{r.id} {r.title}: {[e.message for e in r.errors]}" for r in report.results
            if not r.passed and not r.skipped]


@pytest.fixture
def fleet() -> Cluster:
    for bulletin in ("5703", "5670"):
        call_command("ingest_advisories", str(FIXTURES / f"{bulletin}.json"), "--no-progress", stdout=io.StringIO())
    cluster = Cluster.objects.create(name="prod", kind="static")
    add_node(cluster, "open-r570", driver="570.172.07")
    add_node(cluster, "fixed-r580", driver="580.95.05")
    add_node(cluster, "presumed-r560", driver="560.35.03")
    add_node(cluster, "decided-r550", driver="550.163.01")
    remediated = add_node(cluster, "patched-r535", driver="535.261.03")
    from advisories.exposure import recompute

    recompute()
    approver = User.objects.create_user("anna")
    services.mark_not_affected(Exposure.objects.get(node__name="decided-r550", advisory__publisher_id="5703").id,
                               approver, "vulnerable_code_not_in_execute_path", "no display stack on these nodes")
    services.accept_risk(Exposure.objects.get(node__name="open-r570", advisory__publisher_id="5670").id, approver,
                         "lab cluster, isolated", dt.datetime.now(dt.UTC) + dt.timedelta(days=300))
    from tests.advisories.conftest import set_version

    set_version(remediated, "driver", "535.274.02")
    recompute(node_ids=[remediated.id])
    return cluster


def statuses(document: dict[str, Any], cve: str) -> dict[str, list[str]]:
    return next(v for v in document["vulnerabilities"] if v["cve"] == cve)["product_status"]


def test_exposures_prints_valid_csaf_vex_for_a_bulletin(fleet):
    out = io.StringIO()
    call_command("exposures", "--advisory", "5703", "--format", "csaf-vex", stdout=out)
    document = json.loads(out.getvalue())
    assert schema_errors(document) == []
    assert failed_mandatory_tests(document) == []
    assert document["document"]["category"] == "csaf_vex"
    status = statuses(document, "CVE-2025-23280")  # a Linux driver CVE of 5703
    assert status == {
        "known_affected": ["prod/open-r570/driver"],
        # fixed-r580 runs the fixed version, but 5703 has open review items: not claimed not affected.
        "under_investigation": ["prod/fixed-r580/driver", "prod/presumed-r560/driver"],
        "fixed": ["prod/patched-r535/driver"],
        "known_not_affected": ["prod/decided-r550/driver"],
    }
    vulnerability = next(v for v in document["vulnerabilities"] if v["cve"] == "CVE-2025-23280")
    assert vulnerability["flags"] == [{"label": "vulnerable_code_not_in_execute_path",
                                       "product_ids": ["prod/decided-r550/driver"]}]
    fixes = {r["details"]: r["product_ids"] for r in vulnerability["remediations"]}
    assert fixes["update to 570.195.03"] == ["prod/open-r570/driver"]
    assert fixes["move to a supported branch: R570 570.195.03 or R535 535.274.02"] == ["prod/presumed-r560/driver"]
    names = {p["product_id"]: p["name"] for p in document["product_tree"]["full_product_names"]}
    assert names["prod/patched-r535/driver"] == "prod/patched-r535/driver 535.274.02"


def test_the_whole_fleet_and_the_api_give_valid_vex(fleet, client: Client):
    out = io.StringIO()
    call_command("exposures", "--format", "csaf-vex", stdout=out)
    document = json.loads(out.getvalue())
    assert schema_errors(document) == [] and failed_mandatory_tests(document) == []
    assert "5670" in document["document"]["title"] and "5703" in document["document"]["title"]
    # The risk accepted on open-r570's 5670 exposure: still known_affected.
    accepted = Exposure.objects.get(state="risk_accepted")
    cve = accepted.affected_range.cves.order_by("cve_id").first()
    assert cve is not None and "prod/open-r570/driver" in statuses(document, cve.cve_id)["known_affected"]
    user = User.objects.create_user("vera")
    user.groups.add(Group.objects.get(name="viewer"))
    client.force_login(user)
    advisory_id = Exposure.objects.filter(advisory__publisher_id="5703").first().advisory.public_id
    from_api = client.get(f"/api/v1/advisories/advisories/{advisory_id}/vex/").json()
    assert schema_errors(from_api) == []
    assert statuses(from_api, "CVE-2025-23280") == statuses(
        json.loads(_vex_for("5703")), "CVE-2025-23280")
    filtered = client.get("/api/v1/advisories/exposures/vex/", {"advisory": "nvidia-5703", "state": "presumed"}).json()
    assert schema_errors(filtered) == []
    assert statuses(filtered, "CVE-2025-23280") == {"under_investigation": ["prod/presumed-r560/driver"]}


def _vex_for(bulletin: str) -> str:
    out = io.StringIO()
    call_command("exposures", "--advisory", bulletin, "--format", "csaf-vex", stdout=out)
    return out.getvalue()


def test_a_bulletin_with_no_exposed_node_is_still_valid_vex():
    call_command("ingest_advisories", str(FIXTURES / "5582.json"), "--no-progress", stdout=io.StringIO())
    document = json.loads(_vex_for("5582"))
    assert schema_errors(document) == [] and failed_mandatory_tests(document) == []
    # No node reports a Container Toolkit: nothing is known, so nothing is claimed not affected.
    assert statuses(document, "CVE-2024-0132") == {"under_investigation": ["fleet"]}


def test_the_test_bulletins_are_valid_csaf_like_nvidias():
    for path in [*sorted((FIXTURES.parent / "test-csaf").glob("9*.json")), FIXTURES / "5703.json"]:
        assert schema_errors(json.loads(path.read_bytes())) == [], path.name


def _ingest(path) -> None:
    call_command("ingest_advisories", str(path), "--no-progress", stdout=io.StringIO())


def test_known_not_affected_is_only_an_inventory_product_outside_every_range_of_a_reviewed_bulletin():
    _ingest(FIXTURES / "5582.json")  # no review item
    cluster = Cluster.objects.create(name="k8s", kind="static")
    add_node(cluster, "ctk-fixed", container_toolkit="1.16.2")
    add_node(cluster, "ctk-old", container_toolkit="1.16.1")
    add_node(cluster, "ctk-odd", container_toolkit="nightly")
    from advisories.exposure import recompute

    recompute()
    document = json.loads(_vex_for("5582"))
    assert schema_errors(document) == [] and failed_mandatory_tests(document) == []
    assert failed_mandatory_tests(document, preset="recommended") == []
    status = statuses(document, "CVE-2024-0132")
    assert status["known_affected"] == ["k8s/ctk-old/container_toolkit"]
    assert status["known_not_affected"] == ["k8s/ctk-fixed/container_toolkit"]
    assert "k8s/ctk-odd/container_toolkit" in status.get("under_investigation", [])
    vulnerability = next(v for v in document["vulnerabilities"] if v["cve"] == "CVE-2024-0132")
    assert vulnerability["flags"] == [{"label": "vulnerable_code_not_present",
                                       "product_ids": ["k8s/ctk-fixed/container_toolkit"]}]


def test_a_bulletin_with_open_review_items_never_says_known_not_affected_by_itself():
    _ingest(FIXTURES.parent / "test-csaf" / "9004.json")  # rows it cannot read: open review items
    cluster = Cluster.objects.create(name="prod", kind="static")
    add_node(cluster, "r580-fixed", driver="580.95.05")
    add_node(cluster, "r580-old", driver="580.82.07")
    from advisories.exposure import recompute

    recompute()
    document = json.loads(_vex_for("9004"))
    assert schema_errors(document) == [] and failed_mandatory_tests(document) == []
    assert failed_mandatory_tests(document, preset="recommended") == []
    seen = {status for v in document["vulnerabilities"] for status in v.get("product_status", {})}
    assert "known_not_affected" not in seen
    assert "under_investigation" in seen and "known_affected" in seen
    fixed = [v for v in document["vulnerabilities"]
             if "prod/r580-fixed/driver" in v.get("product_status", {}).get("under_investigation", [])]
    assert fixed, "the node on the fixed version is under investigation while the bulletin is under review"


def test_the_vex_passes_the_recommended_tests_too(fleet):
    document = json.loads(_vex_for("5703"))
    assert failed_mandatory_tests(document, preset="recommended") == []
