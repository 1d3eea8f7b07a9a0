"""Package versions in a distribution's own order, through kept libraries.

OSV ranges of type ECOSYSTEM are ordered the ecosystem's way: Debian and Ubuntu by dpkg's rules
(python-debian: epochs, `~` before anything, the revision after the last `-`), the Red Hat family
by rpm's (rpm-vercmp's rpmvercmp on each of epoch, version and release). No sort key is made
from these versions: they are compared in Python, on package sets (few) rather than on nodes.
"""

from __future__ import annotations

import re
from functools import cmp_to_key

from debian.debian_support import version_compare as dpkg_compare
from rpm_vercmp import vercmp as rpm_vercmp

DPKG = "dpkg"
RPM = "rpm"

# An OSV ecosystem's first field ("Ubuntu:22.04:LTS" -> Ubuntu) to its version order.
_ORDERS = {
    "ubuntu": DPKG, "debian": DPKG,
    "almalinux": RPM, "rocky linux": RPM, "red hat": RPM, "redhat": RPM, "rhel": RPM, "opensuse": RPM,
    "suse": RPM, "mageia": RPM, "openeuler": RPM,
}


def order_of(ecosystem: str) -> str | None:
    """The version order of an OSV ecosystem name; None for one gpusweep does not order."""
    return _ORDERS.get(ecosystem.split(":", 1)[0].strip().lower())


def _rpm_evr(version: str) -> tuple[int, str, str]:
    epoch, sep, rest = version.partition(":")
    if not sep or not epoch.isdigit():
        epoch, rest = "0", version
    ver, _, release = rest.rpartition("-") if "-" in rest else (rest, "", "")
    return int(epoch), ver, release


def rpm_compare(a: str, b: str) -> int:
    """rpm's order of two [epoch:]version[-release]: a missing release matches any (as rpm's own
    comparison of a dependency without one)."""
    ea, va, ra = _rpm_evr(a)
    eb, vb, rb = _rpm_evr(b)
    if ea != eb:
        return -1 if ea < eb else 1
    by_version = int(rpm_vercmp(va, vb))
    if by_version or not ra or not rb:
        return by_version
    return int(rpm_vercmp(ra, rb))


def compare(order: str, a: str, b: str) -> int:
    """-1, 0 or 1 as `a` sorts before, with or after `b` in `order` (DPKG or RPM)."""
    if order == DPKG:
        result = dpkg_compare(a, b)
    elif order == RPM:
        result = rpm_compare(a, b)
    else:
        raise ValueError(f"unknown version order {order!r}")
    return (result > 0) - (result < 0)


def sort(order: str, versions: list[str]) -> list[str]:
    def by_order(a: str, b: str) -> int:
        return compare(order, a, b)

    return sorted(versions, key=cmp_to_key(by_order))


_DPKG_VERSION = re.compile(r"^(\d+:)?[0-9][A-Za-z0-9.+~:-]*$")
_RPM_VERSION = re.compile(r"^(\d+:)?[A-Za-z0-9._+~^-]+$")


def is_valid(order: str, version: str) -> bool:
    """A version the order can compare (dpkg: starts with a digit; no blanks in either)."""
    pattern = _DPKG_VERSION if order == DPKG else _RPM_VERSION
    return bool(pattern.fullmatch(version))


def in_range(order: str, version: str, introduced: str, fixed: str = "", last_affected: str = "") -> bool:
    """OSV's rule for one interval: introduced <= version < fixed (or <= last_affected);
    introduced "0" is below every version."""
    if introduced not in ("", "0") and compare(order, version, introduced) < 0:
        return False
    if fixed:
        return compare(order, version, fixed) < 0
    if last_affected:
        return compare(order, version, last_affected) <= 0
    return True


# A kernel release as uname -r writes it on Debian/Ubuntu: upstream version, ABI number, flavour.
_UNAME = re.compile(r"^(?P<upstream>\d+\.\d+\.\d+)-(?P<abi>\d+)(?:-(?P<flavour>[a-z][a-z0-9-]*))?$")


def kernel_release(uname_r: str) -> tuple[str, int, str] | None:
    """("5.15.0", 1042, "nvidia") from "5.15.0-1042-nvidia"; None when it is not that form."""
    m = _UNAME.fullmatch(uname_r.strip())
    if not m:
        return None
    return m["upstream"], int(m["abi"]), m["flavour"] or ""


_KERNEL_PACKAGE = re.compile(r"^(?:\d+:)?(\d+\.\d+\.\d+)-(\d+)")


def kernel_abi(version: str) -> tuple[str, int] | None:
    """("5.15.0", 1050) of a kernel package's version "5.15.0-1050.51" (or a notice's base
    "4.15.0-69"); None when it is not that form."""
    m = _KERNEL_PACKAGE.match(version.strip())
    return (m[1], int(m[2])) if m else None


def kernel_order(upstream: str, abi: int) -> tuple[tuple[int, ...], int]:
    """A kernel's place in the series: its upstream numbers, then its ABI."""
    return tuple(int(p) for p in upstream.split(".") if p.isdigit()), abi
