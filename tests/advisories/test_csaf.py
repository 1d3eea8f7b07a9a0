"""The CSAF parser on NVIDIA's real documents (bundled copies, and the whole shared corpus)."""

from __future__ import annotations

import json

import pytest

from advisories.csaf import GRAMMAR, DocumentError, decode_version_text, parse
from tests.advisories.conftest import FIXTURES, bulletins

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
            and r.product_line == "tesla" and r.basis == "decoded"]
    table = {r.branch: r.fixed_version for r in rows}
    assert len(table) == len(rows), "one Linux Tesla range per branch"
    for r in rows:
        assert r.upper == r.fixed_version and not r.upper_inclusive, r
        assert r.lower == r.branch[1:] and r.lower_inclusive, "a driver row's branch is its lower bound"
    return table


def test_it_reads_5703s_linux_data_center_branches():
    parsed = parse((FIXTURES / "5703.json").read_bytes(), "5703.json")
    assert (parsed.publisher, parsed.publisher_id, parsed.tracking_version) == ("NVIDIA", "5703", "1.0.0")
    assert parsed.severity == "high"
    assert linux_tesla(parsed) == {"R580": "580.95.05", "R570": "570.195.03", "R535": "535.274.02"}
    r580 = next(r for r in parsed.ranges if r.product_id == "linuxr580_tesla_all_driver_versions_prior_to_580_95_05")
    assert r580.raw == "All driver versions prior to 580.95.05"  # the product name, as NVIDIA wrote it
    assert r580.fixed_product_id == "linuxr580_tesla_580_95_05"
    assert len(r580.cve_ids) == 6 and "CVE-2025-23280" in r580.cve_ids
    cve = next(c for c in parsed.cves if c.cve_id == "CVE-2025-23309")
    assert cve.cvss_vector == "CVSS:3.1/AV:L/AC:L/PR:L/UI:R/S:C/C:H/I:H/A:H"
    assert (cve.base_score, cve.severity, cve.cwe_id) == (8.2, "high", "CWE-427")
    assert "DLL" in cve.description


def test_it_presumes_the_branches_5703_skips_and_flags_nvidias_typo():
    parsed = parse((FIXTURES / "5703.json").read_bytes(), "5703.json")
    gaps = {(r.lower, r.upper, r.fixed_version, r.remediation) for r in parsed.ranges
            if r.basis == "unsupported_branch" and r.os_family == "linux" and r.product_line == "tesla"}
    assert gaps == {("540", "570", "570.195.03", "move to a supported branch: R570 570.195.03 or R535 535.274.02"),
                    ("575", "580", "580.95.05", "move to a supported branch: R580 580.95.05 or R570 570.195.03"),
                    # Older than R535, the oldest named: the notes hedge ("might also be affected").
                    (None, "535", "535.274.02", "move to a supported branch: R535 535.274.02. older branches presumed "
                     'affected: the bulletin says "Earlier software GPU branch releases that support these products '
                     'might also be affected."')}
    review = {(n.kind, n.key) for n in parsed.review}
    assert ("unsupported_branch", "unsupported_branch:R535-R570") in review
    # "R535 vGPU 16" fixed in 575.274.02: NVIDIA meant 535.274.02, a human should look.
    typo = [n for n in parsed.review if n.raw == "575.274.02(vGPU 16.12)"]
    assert typo and "outside branch R535" in typo[0].reason


def test_it_finds_that_5557_has_no_linux_driver_range():
    parsed = parse((FIXTURES / "5557.json").read_bytes(), "5557.json")
    assert [r for r in parsed.ranges if r.component == "driver" and r.os_family == "linux"] == []
    assert {r.os_family for r in parsed.ranges} == {"windows"}
    assert parsed.ranges, "its Windows ranges are still read"


def test_it_applies_cves_per_branch_inside_one_bulletin():
    parsed = parse((FIXTURES / "5614.json").read_bytes(), "5614.json")
    cves = {r.branch: set(r.cve_ids) for r in parsed.ranges if r.os_family == "linux" and r.product_line == "tesla"
            and r.basis == "decoded"}
    assert len(cves["R570"]) == 5 and len(cves["R535"]) == 4
    assert cves["R535"] < cves["R570"]


def test_it_reads_container_toolkit_and_gpu_operator_ranges():
    parsed = parse((FIXTURES / "5582.json").read_bytes(), "5582.json")
    table = {(r.component, r.upper, r.upper_inclusive, r.fixed_version) for r in parsed.ranges}
    assert table == {("container_toolkit", "1.16.1", True, "1.16.2"), ("gpu_operator", "24.6.1", True, "24.6.2")}
    assert parsed.severity == "critical"


def test_it_scopes_dgx_firmware_to_its_platform():
    parsed = parse((FIXTURES / "5367.json").read_bytes(), "5367.json")
    assert [(r.component, r.scope, r.upper, r.fixed_version) for r in parsed.ranges] == [
        ("system_firmware", {"platform": "dgx_a100"}, "22.5.5", "22.5.5")]


def test_it_decodes_5670s_guest_row_with_two_vgpu_labels():
    parsed = parse((FIXTURES / "5670.json").read_bytes(), "5670.json")
    guest = [r for r in parsed.ranges if r.product_id.startswith("windowsr535_vgpu_16_guest_driver_539_28")]
    assert {(r.branch, r.lower, r.upper, r.upper_inclusive) for r in guest} == {("R535", "535", "539.28", True)}
    assert [n.kind for n in parsed.review] == ["unparsed_row", "unsupported_branch"]  # Azure Stack HCI's odd row


# One row per form of GRAMMAR (and per condition): (text, listed as known_affected, form,
# [(lower, lower inclusive, upper, upper inclusive, condition)], fixed, vGPU labels).
FORMS = [
    ("all_driver_versions_prior_to_580_95_05", False, "prior to X", [(None, False, "580.95.05", False, ())], "", ()),
    ("all_drivers_versions_prior_to_474_44_for_support_of_geforce_kepler_desktop", False, "prior to X",
     [(None, False, "474.44", False, ())], "", ()),
    ("all_versions_before_release_25_07", False, "prior to X", [(None, False, "25.07", False, ())], "", ()),
    ("all_versions_up_to_and_including_v1_16_1", False, "up to and including X",
     [(None, False, "1.16.1", True, ())], "", ()),
    ("all_versions_prior_to_and_including_96_00_74_00_11", False, "prior to and including X",
     [(None, False, "96.00.74.00.11", True, ())], "", ()),
    ("35_6_2_and_earlier", False, "X and earlier", [(None, False, "35.6.2", True, ())], "", ()),
    ("22_09_to_24_03", False, "X to Y", [("22.09", True, "24.03", True, ())], "", ()),
    ("all_versions_from_24_01_prior_to_24_12", False, "from X prior to Y", [("24.01", True, "24.12", False, ())],
     "", ()),
    ("24_01_up_to_24_12", False, "X up to Y", [("24.01", True, "24.12", True, ())], "", ()),
    ("2_0_and_later_prior_to_2_3_1", False, "X and later, prior to Y", [("2.0", True, "2.3.1", False, ())], "", ()),
    ("later_than_1_2_0_up_to_and_including_1_3_0", False, "later than X, prior to Y",
     [("1.2.0", False, "1.3.0", True, ())], "", ()),
    ("prior_to_1_3_0_and_1_2_0_or_newer", False, "prior to Y, from X", [("1.2.0", True, "1.3.0", False, ())], "", ()),
    ("all_2_9_versions_prior_to_2_9_3", False, "all X.Y versions prior to Z", [("2.9", True, "2.9.3", False, ())],
     "", ()),
    ("all_2_10_versions", False, "all X.Y versions", [("2.10", True, "2.11", False, ())], "", ()),
    ("all_versions_prior_to_516_94all_versions_prior_to_the_august_2022_release", False,
     "prior to X / prior to the <month> release", [(None, False, "516.94", False, ())], "", ()),
    ("all_versions_prior_to_525_89_02all_versions_prior_to_and_including_february_2023_release", False,
     "prior to X / prior to the <month> release", [(None, False, "525.89.02", True, ())], "", ()),
    ("580_82_07all_versions_prior_to_and_including_vgpu_19_1", False,
     "X (up to and including <vGPU or release label>)", [(None, False, "580.82.07", True, ())], "", ("19.1",)),
    ("539_28all_versions_prior_to_and_including_vgpu_16_10all_versions_prior_to_and_including_vgpu_18_3", False,
     "X (up to and including <vGPU or release label>)", [(None, False, "539.28", True, ())], "", ("16.10", "18.3")),
    ("580_82_07all_versions_up_to_and_including_the_august_2025_release", False,
     "X (up to and including <vGPU or release label>)", [(None, False, "580.82.07", True, ())], "", ()),
    ("all_driver_versions", False, "all versions", [(None, False, None, False, ())], "", ()),
    ("580_95_05_or_newer", False, "X or newer", [], "580.95.05", ()),
    ("46_3008_or_newer", False, "X or newer", [], "46.3008", ()),
    ("2_3_4_and_2_3_5_latest", False, "X and Y (latest)", [], "2.3.4", ()),
    ("vgpu_software_19_4", False, "vGPU software X", [], "", ("19.4",)),
    ("581_80_vgpu_software_19_4", False, "X (<vGPU or release label>)", [], "581.80", ("19.4",)),
    ("580_95_05vgpu_19_2", False, "X (<vGPU or release label>)", [], "580.95.05", ("19.2",)),
    ("551_61february_2024_release", False, "X (<vGPU or release label>)", [], "551.61", ()),
    ("v24_6_2", False, "X (<vGPU or release label>)", [], "24.6.2", ()),
    ("r25_10", False, "X (<vGPU or release label>)", [], "25.10", ()),
    ("base_command_manager_3,_base_command_manager_10", True, "list of releases X, Y",
     [("3", True, "3", True, ()), ("10", True, "10", True, ())], "", ()),
    ("24_11_only", True, "only release X", [("24.11", True, "24.11", True, ())], "", ()),
    # A plain version that a CVE lists as known_affected is the affected release itself.
    ("24_11", True, "bare affected release X", [("24.11", True, "24.11", True, ())], "", ()),
    # Conditions, kept on the range and matched against node facts.
    ("all_driver_versions_prior_to_582_53_only_gpus_based_on_the_maxwell_volta_and_pascal_architectures", False,
     "prior to X", [(None, False, "582.53", False, (("gpu_architecture", ("maxwell", "volta", "pascal")),))], "", ()),
    ("all_versions_up_to_and_including_0_12_1_only_when_cdi_is_enabled", False, "up to and including X",
     [(None, False, "0.12.1", True, (("container_toolkit_mode", ("cdi",)),))], "", ()),
    ("all_versions_up_to_and_including_0_17_2_only_when_device_list_strategy_is_cdi_annotations_and_or_cdi_cri",
     False, "up to and including X", [(None, False, "0.17.2", True, (("container_toolkit_mode", ("cdi",)),))], "", ()),
    ("all_versions_up_to_and_including_1_17_7_cdi_mode_only_for_versions_prior_to_1_17_5", False,
     "up to and including X (CDI mode only below Y)",
     [("1.17.5", True, "1.17.7", True, ()), (None, False, "1.17.5", False, (("container_toolkit_mode", ("cdi",)),))],
     "", ()),
]


@pytest.mark.parametrize(("text", "listed", "form", "parts", "fixed", "labels"), FORMS, ids=[f[0][:50] for f in FORMS])
def test_it_decodes_every_nvidia_version_text_form(text, listed, form, parts, fixed, labels):
    d = decode_version_text(text, listed)
    assert d is not None
    assert d.form == form
    assert [(p.lower, p.lower_inclusive, p.upper, p.upper_inclusive, p.condition) for p in d.parts] == parts
    assert (d.kind, d.fixed, d.labels) == ("affected" if parts else "fixed", fixed, labels)


def test_every_grammar_form_has_a_row_above():
    assert {name for name, _pattern, _kind in GRAMMAR} <= {form for _t, _l, form, *_rest in FORMS}


@pytest.mark.parametrize("text", [
    "available_the_week_of_june_29_2023",
    "all_driver_versions_prior_475_06_to_for_support_of_geforce_kepler_desktop",
    "570_172_08all_versions_through_the_next_maintenance_release",
])
def test_it_refuses_to_guess_irregular_version_texts(text):
    assert decode_version_text(text) is None


def test_the_whole_shared_corpus_matches_the_expected_table(shared_csaf):
    seen = {}
    for path in bulletins(shared_csaf):
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
    (lambda d: d["document"]["tracking"].__setitem__("version", "x"), "tracking.version 'x' is not a CSAF version"),
    (lambda d: d["document"]["tracking"]["revision_history"][0].__setitem__("number", "first"),
     "revision_history[0].number 'first' is not a CSAF version"),
    (lambda d: d["document"]["tracking"]["revision_history"].append(
        {"date": "2024-10-01T00:00:00Z", "number": "2.0.0", "summary": "x"}), "names 2.0.0, newer than"),
    (lambda d: d["document"]["tracking"].__setitem__("revision_history", []), "revision_history is empty"),
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
