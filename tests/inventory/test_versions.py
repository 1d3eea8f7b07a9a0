from __future__ import annotations

import pytest

from inventory.versions import VersionError, driver_branch, normalize_component, parse_version


def key(component: str, raw: str) -> str:
    parsed = parse_version(component, raw)
    assert parsed.key is not None, raw
    return parsed.key


def test_it_orders_driver_versions_field_by_field_not_as_text():
    versions = ["570.195.03", "570.9", "570.86.15", "535.274.02", "580.95.05"]
    assert sorted(versions, key=lambda v: key("driver", v)) == [
        "535.274.02", "570.9", "570.86.15", "570.195.03", "580.95.05",
    ]
    # The property the database relies on: plain string comparison of the keys.
    assert key("driver", "570.9") < key("driver", "570.86.15") < key("driver", "570.195.03")


def test_it_names_the_driver_branch_after_the_major_version():
    assert parse_version("driver", "570.86.15").branch == "R570"
    assert driver_branch("535.274.02") == "R535"
    assert parse_version("cuda", "12.8").branch == ""


@pytest.mark.parametrize("raw", ["570.86.15-beta", "latest", "r570", "570"])
def test_it_flags_unknown_driver_formats_instead_of_guessing(raw):
    parsed = parse_version("driver", raw)
    assert parsed.flagged
    assert parsed.key is None
    assert parsed.raw == raw
    assert parsed.branch == ""


def test_it_parses_other_components_by_their_leading_numbers():
    assert parse_version("kernel", "6.1.0-27-amd64").fields == (6, 1, 0)
    assert key("kernel", "6.1.0-27-amd64") < key("kernel", "6.10.0")
    assert parse_version("cuda", "12.8").fields == (12, 8)
    assert parse_version("os", "debian 12").flagged


def test_it_refuses_empty_and_oversized_versions():
    with pytest.raises(VersionError, match="empty"):
        parse_version("driver", "  ")
    with pytest.raises(VersionError, match="128"):
        parse_version("cuda", "1" * 129)


def test_it_accepts_new_components_without_a_migration():
    assert normalize_component("Fabric-Manager") == "fabric_manager"
    assert parse_version("my_new_engine", "2.3.4").fields == (2, 3, 4)
    with pytest.raises(VersionError):
        normalize_component("not a/name")
