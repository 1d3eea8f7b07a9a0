"""Distribution version orders, from Debian Policy 5.6.12 and rpm's rpmvercmp rules."""

import pytest

from advisories import distro_versions as dv

# (a, b, expected compare(a, b)): Debian Policy's examples and the kernel ABI forms Ubuntu uses.
DPKG_TABLE = [
    ("1.0", "1.0", 0),
    ("1.0~rc1", "1.0", -1),  # ~ sorts before anything, even the end of the string
    ("1.0~~", "1.0~", -1),
    ("1.0~rc1", "1.0~rc2", -1),
    ("1.0", "1.0+b1", -1),  # + sorts after the end of the string
    ("1.0+dfsg", "1.0.1", -1),  # non-letters compare by ASCII: '+' < '.'
    ("1:0.1", "2.0", 1),  # the epoch wins
    ("0:2.0", "2.0", 0),  # epoch 0 is the default
    ("2.0-1", "2.0-2", -1),  # revisions
    ("2.0-10", "2.0-9", 1),  # numeric parts compare as numbers
    ("2.0", "2.0-0", 0),  # no revision is revision "0"
    ("5.15.0-1042.42", "5.15.0-1073.74", -1),  # kernel ABI numbers
    ("5.15.0-1073.74", "5.15.0-1073.74", 0),
    ("5.15.0-1073.74", "5.15.0-1073.75", -1),
    ("5.15.0-1100.100", "5.15.0-1073.74", 1),
    ("6.2.0-1003.3~22.04.1", "6.2.0-1003.3", -1),  # a backport sorts before its origin
    ("570.172.08-0ubuntu0.22.04.1", "570.172.08-0ubuntu0.22.04.2", -1),
    ("515.65.01-0ubuntu0.22.04.1", "515.48.07-0ubuntu0.22.04.2", 1),
    ("470.141.03-0ubuntu0.18.04.1", "470.141.03-0ubuntu0.18.04.1~", 1),
]

RPM_TABLE = [
    ("1.0", "1.0", 0),
    ("1.0", "1.0.1", -1),
    ("1.0a", "1.0", 1),  # a letter after matching parts sorts after
    ("1.0~rc1", "1.0", -1),  # rpm >= 4.10: ~ sorts before anything
    ("1.0^git1", "1.0", 1),  # ^ sorts after the end (rpm >= 4.15)
    ("1:1.0-1", "2.0-1", 1),  # the epoch wins
    ("2.0-1.el9", "2.0-2.el9", -1),  # releases
    ("2.0-10.el9", "2.0-9.el9", 1),
    ("5.14.0-427.13.1.el9_4", "5.14.0-427.18.1.el9_4", -1),  # kernel releases
    ("4.18.0-553.el8_10", "4.18.0-477.27.1.el8_8", 1),
    ("2.0", "2.0-1.el9", 0),  # no release: any release matches
]


@pytest.mark.parametrize(("a", "b", "expected"), DPKG_TABLE)
def test_dpkg_order(a: str, b: str, expected: int) -> None:
    assert dv.compare(dv.DPKG, a, b) == expected
    assert dv.compare(dv.DPKG, b, a) == -expected


@pytest.mark.parametrize(("a", "b", "expected"), RPM_TABLE)
def test_rpm_order(a: str, b: str, expected: int) -> None:
    assert dv.compare(dv.RPM, a, b) == expected
    assert dv.compare(dv.RPM, b, a) == -expected


def test_ecosystem_orders() -> None:
    assert dv.order_of("Ubuntu:22.04:LTS") == dv.DPKG
    assert dv.order_of("Debian:12") == dv.DPKG
    assert dv.order_of("AlmaLinux:9") == dv.RPM
    assert dv.order_of("Rocky Linux:9") == dv.RPM
    assert dv.order_of("Red Hat:enterprise_linux:9") == dv.RPM
    assert dv.order_of("PyPI") is None


def test_osv_interval() -> None:
    assert dv.in_range(dv.DPKG, "5.15.0-1042.42", "0", fixed="5.15.0-1073.74")
    assert not dv.in_range(dv.DPKG, "5.15.0-1073.74", "0", fixed="5.15.0-1073.74")
    assert not dv.in_range(dv.DPKG, "1.0", "1.1", fixed="2.0")
    assert dv.in_range(dv.DPKG, "1.5", "1.1", last_affected="1.5")
    assert not dv.in_range(dv.DPKG, "1.6", "1.1", last_affected="1.5")


def test_kernel_release() -> None:
    assert dv.kernel_release("5.15.0-1042-nvidia") == ("5.15.0", 1042, "nvidia")
    assert dv.kernel_release("6.8.0-45-generic") == ("6.8.0", 45, "generic")
    assert dv.kernel_release("5.14.0-427.13.1.el9_4.x86_64") is None
