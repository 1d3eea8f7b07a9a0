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


def failed_mandatory_tests(document: dict[str, Any]) -> list[str]:
    report = csaf_validate(document, preset="mandatory")
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
        "under_investigation": ["prod/presumed-r560/driver"],
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
    advisory_id = Exposure.objects.filter(advisory__publisher_id="5703").values_list("advisory_id", flat=True)[0]
    from_api = client.get(f"/api/v1/advisories/advisories/{advisory_id}/vex/").json()
    assert schema_errors(from_api) == []
    assert statuses(from_api, "CVE-2025-23280") == statuses(
        json.loads(_vex_for("5703")), "CVE-2025-23280")
    filtered = client.get("/api/v1/advisories/exposures/vex/", {"advisory": "5703", "state": "presumed"}).json()
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
    assert statuses(document, "CVE-2024-0132") == {"known_not_affected": ["none"]}


def test_the_test_bulletins_are_valid_csaf_like_nvidias():
    for path in [*sorted((FIXTURES.parent / "test-csaf").glob("9*.json")), FIXTURES / "5703.json"]:
        assert schema_errors(json.loads(path.read_bytes())) == [], path.name
