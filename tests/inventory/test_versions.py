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


# Ordering of the tails NVIDIA writes: pre-releases (PEP 440, as `packaging` orders them),
# letter suffixes, "Update N" and post-releases, each against its neighbours.
@pytest.mark.parametrize("ordered", [
    ["1.2.9", "1.3.0.dev1", "1.3.0a1", "1.3.0b2", "1.3.0rc1", "1.3.0rc17", "1.3.0", "1.3.0.post1", "1.3.1"],
    ["10.24.08", "10.24.09", "10.24.09.1", "10.24.09a", "10.24.09b", "10.24.10rc1", "10.24.10"],
    ["12.5", "12.5 Update 1", "12.5U2", "12.5.3", "12.6", "12.6 Update 1", "12.6 Update 2", "12.6u3", "12.7"],
    ["0.9", "v1.0.0-rc.1", "1.0.0-rc.2", "1.0.0", "1.0.1"],
    # Compound versions: MLNX_OFED's "<release>-<build>", DCGM Exporter's "<DCGM>-<exporter>".
    ["24.07-0.6.1.0", "24.10-0.7.0.0", "24.10-1.1.4.0", "25.01-0.6.0.0"],
    ["3.3.9-3.6.1", "4.1.1-4.0.4", "4.1.1-4.1.0", "4.2.3-4.1.1"],
    ["2.9.9", "v3.0.0 rc17", "3.0.0", "3.0.0a", "3.0.1rc1"],
])
def test_it_orders_pre_releases_letter_suffixes_and_updates(ordered):
    keys = [key("triton", v) for v in ordered]
    assert keys == sorted(keys), [v for _k, v in sorted(zip(keys, ordered, strict=True))]
    assert len(set(keys)) == len(keys)


def test_the_keys_agree_with_packagings_pep440_order():
    from packaging.version import Version

    versions = ["1.0.dev2", "1.0a1", "1.0a2", "1.0b1", "1.0rc1", "1.0rc10", "1.0", "1.0.post1", "1.0.1rc1", "1.0.1",
                "1.1.dev1", "1.1", "2.0.0b3", "2.0.0"]
    by_key = sorted(versions, key=lambda v: key("nemo", v))
    assert by_key == sorted(versions, key=Version)


def test_rc_is_before_final_and_letter_after_bare():
    assert key("triton", "1.3.0rc17") < key("triton", "1.3.0")
    assert key("triton", "v1.3.0 rc17") == key("triton", "1.3.0rc17")
    assert key("dcgm", "10.24.09a") > key("dcgm", "10.24.09")
    assert key("cuda_toolkit", "12.6 Update 2") == key("cuda_toolkit", "12.6.2")
    assert parse_version("triton", "1.3.0rc17").fields == (1, 3, 0)
    # Tails that are not an order stay out of it, as before.
    assert key("kernel", "6.1.0-27-amd64") == key("kernel", "6.1.0")
    assert set(key("triton", "1.3.0rc17")) <= set("0123456789abcdefghijklmnopqrstuvwxyz.")
