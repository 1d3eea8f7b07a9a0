"""The document-level rules of issue 29, each on a bulletin changed in one place: undecodable rows
never borrow another CVE's fix, a bare release reads the notes, older branches, platform rows."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from advisories.csaf import parse
from tests.advisories.conftest import FIXTURES

TEST_CSAF = FIXTURES.parent / "test-csaf"
CTK = "linux_nvidia_container_toolkit_all_versions_up_to_and_including_v1_16_1"
CTK_FIX = "linux_nvidia_container_toolkit_v1_16_2"
TRITON = "linux_triton_inference_server_24_11"


def _leaves(data: dict[str, Any]) -> list[dict[str, Any]]:
    found, todo = [], list(data["product_tree"]["branches"])
    while todo:
        item = todo.pop()
        if item.get("category") == "product_version":
            found.append(item)
        todo += item.get("branches", [])
    return found


def _parsed(name: str, change: Callable[[dict[str, Any]], None]) -> Any:
    data = json.loads(((FIXTURES if name.startswith("5") else TEST_CSAF) / name).read_bytes())
    change(data)
    return parse(json.dumps(data).encode(), name)


def _rename(data: dict[str, Any], product_id: str, text: str) -> None:
    next(leaf for leaf in _leaves(data) if leaf["product"]["product_id"] == product_id)["product"]["name"] = text


def test_an_undecodable_row_keeps_its_own_cves_fix():
    parsed = _parsed("5582.json", lambda d: _rename(d, CTK, "See the release notes of 1.16"))
    rows = [r for r in parsed.ranges if r.product_id == CTK]
    assert [(r.basis, r.upper, r.fixed_version) for r in rows] == [("undecoded", "1.16.2", "1.16.2")]
    note = next(n for n in parsed.review if n.key == CTK)
    assert note.raw == "See the release notes of 1.16" and "'See the release notes of 1.16'" in note.reason


def test_an_undecodable_row_never_borrows_another_cves_fix():
    def change(data: dict[str, Any]) -> None:
        _rename(data, CTK, "See the release notes of 1.16")
        # The fixed row is the fix of CVE-2024-0133 only: CVE-2024-0132's row must not take it.
        data["vulnerabilities"][0]["product_status"]["fixed"].remove(CTK_FIX)

    parsed = _parsed("5582.json", change)
    rows = [r for r in parsed.ranges if r.product_id == CTK]
    assert [(r.basis, r.lower, r.upper, r.fixed_version) for r in rows] == [("undecoded", None, None, "")]
    assert any(n.key == CTK and n.kind == "unparsed_row" for n in parsed.review)


def _note(text: str) -> Callable[[dict[str, Any]], None]:
    return lambda data: data["document"]["notes"].append({"category": "details", "title": "Notes", "text": text})


@pytest.mark.parametrize(("sentence", "expected"), [
    # The notes say earlier releases are affected: every release up to 24.11, decoded.
    ("Earlier software releases of this product are also affected.", {("decoded", None, "24.11", True)}),
    # They hedge: 24.11 decoded, the earlier ones presumed, with the sentence quoted.
    ("<li>Earlier releases might also be affected.</li>",
     {("decoded", "24.11", "24.11", True), ("undecoded", None, "24.11", False)}),
    # They say earlier releases are not affected: the row is that release only.
    ("Earlier releases are not affected.", {("decoded", "24.11", "24.11", True)}),
])
def test_a_bare_release_is_the_range_the_notes_give(sentence, expected):
    parsed = _parsed("9002.json", _note(sentence))
    triton = {(r.basis, r.lower, r.upper, r.upper_inclusive) for r in parsed.ranges if r.component == "triton"}
    assert triton == expected
    presumed = [r for r in parsed.ranges if r.component == "triton" and r.basis == "undecoded"]
    assert all(sentence.removeprefix("<li>").removesuffix("</li>") in r.remediation for r in presumed)
    assert not [n for n in parsed.review if n.key.startswith(TRITON)], "the notes decide: nothing to review"


def test_a_bare_release_the_notes_say_nothing_of_is_presumed_below_and_reviewed():
    parsed = parse((TEST_CSAF / "9002.json").read_bytes(), "9002.json")
    triton = {(r.basis, r.lower, r.upper) for r in parsed.ranges if r.component == "triton"}
    assert triton == {("decoded", "24.11", "24.11"), ("undecoded", None, "24.11")}
    assert [n.key for n in parsed.review if n.key.startswith(TRITON)] == [f"{TRITON}#earlier"]


def test_an_only_release_is_a_point_whatever_the_notes():
    parsed = _parsed("9002.json", lambda d: (_rename(d, TRITON, "24.11 only"),
                                             _note("Earlier releases might also be affected.")(d)))
    assert {(r.basis, r.lower, r.upper) for r in parsed.ranges if r.component == "triton"} == {
        ("decoded", "24.11", "24.11")}


def test_branches_older_than_the_oldest_are_presumed_when_the_notes_hedge_else_reviewed():
    hedged = parse((FIXTURES / "5670.json").read_bytes(), "5670.json")  # "... might also be affected"
    older = [r for r in hedged.ranges if r.product_id.startswith("older_branch:linux:tesla:")]
    assert [(r.basis, r.lower, r.upper) for r in older] == [("unsupported_branch", None, "535")]
    assert "might also be affected" in older[0].remediation
    silent = parse((TEST_CSAF / "9004.json").read_bytes(), "9004.json")  # its notes say nothing
    assert not [r for r in silent.ranges if r.product_id.startswith("older_branch:")]
    note = next(n for n in silent.review if n.key == "older_branches")
    assert note.kind == "unsupported_branch" and "R535" in note.raw


@pytest.mark.parametrize(("architecture", "os_family"), [("Windows", "windows"), ("Linux", "linux"),
                                                          ("Jetson Linux", "jetson"), ("Tegra", "jetson"),
                                                          ("macOS", "macos")])
def test_platform_rows_never_cross(architecture, os_family):
    def change(data: dict[str, Any]) -> None:
        todo = list(data["product_tree"]["branches"])
        while todo:
            item = todo.pop()
            if item.get("category") == "architecture":
                item["name"] = architecture
            todo += item.get("branches", [])

    parsed = _parsed("5582.json", change)
    assert {r.os_family for r in parsed.ranges} == {os_family}


def test_a_list_of_releases_reads_the_notes_like_a_bare_release():
    def listed(sentence: str) -> Callable[[dict[str, Any]], None]:
        return lambda d: (_rename(d, TRITON, "Triton Inference Server 24.09, Triton Inference Server 24.11"),
                          _note(sentence)(d) if sentence else None)

    silent = _parsed("9002.json", listed(""))
    assert {(r.basis, r.lower, r.upper) for r in silent.ranges if r.component == "triton"} == {
        ("decoded", "24.09", "24.09"), ("decoded", "24.11", "24.11"), ("undecoded", None, "24.09")}
    definite = _parsed("9002.json", listed("Earlier software releases of this product are also affected."))
    assert {(r.basis, r.lower, r.upper) for r in definite.ranges if r.component == "triton"} == {
        ("decoded", None, "24.11")}
