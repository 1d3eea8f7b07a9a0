"""The CSAF parser on NVIDIA's real documents (bundled copies, and the whole shared corpus)."""

from __future__ import annotations

import json

import pytest

from advisories.csaf import DocumentError, decode_version_text, parse
from tests.advisories.conftest import FIXTURES

# Linux data-center (Tesla) driver ranges: bulletin -> {branch: fixed version}, read off the
# bulletins' tables by hand.
EXPECTED_LINUX_TESLA = {
    "5312": {"R510": "510.47.03", "R470": "470.103.01"},
    "5353": {"R510": "510.73.08", "R470": "470.129.06", "R450": "450.191.01"},
    "5383": {"R515": "515.65.01", "R510": "510.85.02", "R470": "470.141.03", "R450": "450.203.03"},
    "5415": {"R515": "515.86.01", "R510": "510.108.03", "R470": "470.161.03", "R450": "450.216.04"},
    "5452": {"R525": "525.105.17", "R515": "515.105.01", "R470": "470.182.03", "R450": "450.236.01"},
    "5468": {"R535": "535.54.03", "R525": "525.125.06", "R470": "470.199.02", "R450": "450.248.02"},
    "5491": {"R535": "535.129.03", "R525": "525.147.05", "R470": "470.223.02"},
    "5520": {"R550": "550.54.14", "R535": "535.161.07", "R470": "470.239.06"},
    "5551": {"R550": "550.90.07", "R535": "535.183.01", "R470": "470.256.02"},
    "5557": {},
    "5614": {"R570": "570.86.15", "R550": "550.144.03", "R535": "535.230.02"},
    "5630": {"R575": "575.51.02", "R570": "570.133.07", "R550": "550.163.01", "R535": "535.247.01"},
    "5670": {"R570": "570.172.08", "R535": "535.261.03"},
    "5703": {"R580": "580.95.05", "R570": "570.195.03", "R535": "535.274.02"},
}


def linux_tesla(parsed) -> dict[str, str]:
    rows = [r for r in parsed.ranges if r.component == "driver" and r.os_family == "linux"
            and r.product_line == "tesla"]
    table = {r.branch: r.fixed_version for r in rows}
    assert len(table) == len(rows), "one Linux Tesla range per branch"
    for r in rows:
        assert r.upper == r.fixed_version and not r.upper_inclusive, r
    return table


def test_it_reads_5703s_linux_data_center_branches():
    parsed = parse((FIXTURES / "5703.json").read_bytes(), "5703.json")
    assert (parsed.publisher, parsed.publisher_id, parsed.tracking_version) == ("NVIDIA", "5703", "1.0.0")
    assert parsed.severity == "high"
    assert linux_tesla(parsed) == {"R580": "580.95.05", "R570": "570.195.03", "R535": "535.274.02"}
    r580 = next(r for r in parsed.ranges if r.product_id == "linuxr580_tesla_all_driver_versions_prior_to_580_95_05")
    assert r580.raw == "all_driver_versions_prior_to_580_95_05"
    assert r580.fixed_product_id == "linuxr580_tesla_580_95_05"
    assert len(r580.cve_ids) == 6 and "CVE-2025-23280" in r580.cve_ids
    cve = next(c for c in parsed.cves if c.cve_id == "CVE-2025-23309")
    assert cve.cvss_vector == "CVSS:3.1/AV:L/AC:L/PR:L/UI:R/S:C/C:H/I:H/A:H"
    assert (cve.base_score, cve.severity, cve.cwe_id) == (8.2, "high", "CWE-427")
    assert "DLL" in cve.description


def test_it_finds_that_5557_has_no_linux_driver_range():
    parsed = parse((FIXTURES / "5557.json").read_bytes(), "5557.json")
    assert [r for r in parsed.ranges if r.component == "driver" and r.os_family == "linux"] == []
    assert {r.os_family for r in parsed.ranges} == {"windows"}
    assert parsed.ranges, "its Windows ranges are still read"


def test_it_applies_cves_per_branch_inside_one_bulletin():
    parsed = parse((FIXTURES / "5614.json").read_bytes(), "5614.json")
    cves = {r.branch: set(r.cve_ids) for r in parsed.ranges if r.os_family == "linux" and r.product_line == "tesla"}
    assert len(cves["R570"]) == 5 and len(cves["R535"]) == 4
    assert cves["R535"] < cves["R570"]


def test_it_reads_container_toolkit_and_gpu_operator_ranges():
    parsed = parse((FIXTURES / "5582.json").read_bytes(), "5582.json")
    table = {(r.component, r.upper, r.upper_inclusive, r.fixed_version) for r in parsed.ranges}
    assert table == {("container_toolkit", "1.16.1", True, "1.16.2"), ("gpu_operator", "24.6.1", True, "24.6.2")}
    assert parsed.severity == "critical"


def test_it_keeps_irregular_rows_raw_as_unparsed():
    parsed = parse((FIXTURES / "5670.json").read_bytes(), "5670.json")
    raws = [u.raw for u in parsed.unparsed]
    assert raws == ["539_28all_versions_prior_to_and_including_vgpu_16_10all_versions_prior_to_and_including_vgpu_18_3"]
    assert parsed.unparsed[0].product_id.startswith("windowsr535_vgpu_16_guest_driver_539_28")


@pytest.mark.parametrize(("text", "expected"), [
    ("all_driver_versions_prior_to_580_95_05", ("affected", None, "580.95.05", False, "")),
    ("all_drivers_versions_prior_to_510_47_03", ("affected", None, "510.47.03", False, "")),
    ("all_versions_up_to_and_including_v1_16_1", ("affected", None, "1.16.1", True, "")),
    ("22_09_to_24_03", ("affected", "22.09", "24.03", True, "")),
    ("580_82_07all_versions_prior_to_and_including_vgpu_19_1", ("affected", None, "580.82.07", True, "")),
    ("580_95_05vgpu_19_2", ("fixed", None, None, False, "580.95.05")),
    ("v24_6_2", ("fixed", None, None, False, "24.6.2")),
    ("2_3_4_and_2_3_5_latest", ("fixed", None, None, False, "2.3.4")),
])
def test_it_decodes_nvidia_version_texts(text, expected):
    d = decode_version_text(text)
    assert d is not None
    assert (d.kind, d.lower, d.upper, d.upper_inclusive, d.fixed) == expected


@pytest.mark.parametrize("text", [
    "available_the_week_of_june_29_2023",
    "all_versions_prior_to_516_94all_versions_prior_to_the_august_2022_release",
    "all_driver_versions_prior_475_06_to_for_support_of_geforce_kepler_desktop",
])
def test_it_refuses_to_guess_irregular_version_texts(text):
    assert decode_version_text(text) is None


def test_the_whole_shared_corpus_matches_the_expected_table(shared_csaf):
    seen = {}
    for path in sorted(shared_csaf.glob("5*.json")):
        parsed = parse(path.read_bytes(), path.name)
        if "Display Driver" in parsed.title:
            seen[parsed.publisher_id] = linux_tesla(parsed)
    assert seen == EXPECTED_LINUX_TESLA


def _doc() -> dict:
    return json.loads((FIXTURES / "5582.json").read_bytes())


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: d["document"].pop("tracking"), "document.tracking is missing"),
    (lambda d: d["document"]["tracking"].__setitem__("version", 3), "document.tracking.version should be str"),
    (lambda d: d.__setitem__("product_tree", {"full_product_names": []}), "product_tree.branches is missing"),
    (lambda d: d["product_tree"]["branches"][0].__setitem__("branches", [{"category": "vendor", "name": "x"}]),
     "unknown product tree shape"),
    (lambda d: d["vulnerabilities"][0].__setitem__("cve", "not-a-cve"), "is not a CVE id"),
    (lambda d: d["document"].__setitem__("csaf_version", "1.2"), "csaf_version '1.2' is not supported"),
])
def test_it_names_the_document_and_the_problem_on_bad_input(mutate, message):
    data = _doc()
    mutate(data)
    with pytest.raises(DocumentError) as info:
        parse(json.dumps(data).encode(), "bad-5582.json")
    assert str(info.value).startswith("bad-5582.json: ")
    assert message in str(info.value)


def test_it_reports_truncated_json_with_its_position():
    content = (FIXTURES / "5582.json").read_bytes()[:5000]
    with pytest.raises(DocumentError, match=r"^cut\.json: invalid JSON at line \d+ column \d+"):
        parse(content, "cut.json")
