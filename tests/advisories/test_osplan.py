"""What a node's campaign target is from its OS remedy (advisories.osplan.node_target): pure, a table."""

from __future__ import annotations

import pytest

from advisories import distro_versions as dv
from advisories.osplan import NodeRemedy, install_label, node_target, upstream


@pytest.mark.parametrize(
    ("remedy", "running", "target", "kind", "unpatched"),
    [
        # A notice covers every kernel CVE: the livepatch alone, its version.
        (
            NodeRemedy(1, livepatch={"LSN-0066-1": 66, "LSN-0065-1": 65}),
            "4.15.0-70-generic",
            {"livepatch": "66"},
            "livepatch",
            (),
        ),
        # Some kernel CVE has no livepatch: the fixed kernel as uname -r, flavour from the running one.
        (
            NodeRemedy(1, kernel={"linux-nvidia": "5.15.0-1073.74"}),
            "5.15.0-1042-nvidia",
            {"kernel": "5.15.0-1073-nvidia"},
            "reboot",
            (),
        ),
        (
            NodeRemedy(1, livepatch={"LSN-0066-1": 66}, kernel={"linux": "4.15.0-99.100"}),
            "4.15.0-60-generic",
            {"kernel": "4.15.0-99-generic"},
            "livepatch+reboot",
            (),
        ),
        # Two kernel fixes: the later by ABI number (999 before 1042, as numbers).
        (
            NodeRemedy(1, kernel={"a": "5.15.0-999.9", "b": "5.15.0-1042.42"}),
            "5.15.0-91-generic",
            {"kernel": "5.15.0-1042-generic"},
            "reboot",
            (),
        ),
        # A packaged driver: its upstream version, so it follows the driver groups.
        (
            NodeRemedy(1, packages={"nvidia-graphics-drivers-570-server": "570.172.08-0ubuntu0.22.04.1"}),
            "",
            {"driver": "570.172.08"},
            "packages",
            (),
        ),
        # A package none of whose binaries was found to install is named.
        (NodeRemedy(1, packages={"openssl": "3.0.2-0ubuntu1.15"}), "", {}, "packages", ("openssl",)),
        # A running kernel that is no uname -r of a packaged kernel: its fix is named, not guessed.
        (NodeRemedy(1, kernel={"linux": "4.15.0-99.100"}), "custom", {}, "reboot", ("linux",)),
    ],
)
def test_the_target_of_a_remedy(remedy, running, target, kind, unpatched):
    found = node_target(remedy, running)
    assert (found.target, found.kind, found.unpatched) == (target, kind, unpatched)


def test_kernel_versions_and_their_order():
    assert dv.kernel_abi("5.15.0-1050.51") == ("5.15.0", 1050)
    assert dv.kernel_abi("1:5.15.0-1050.51") == ("5.15.0", 1050)
    assert dv.kernel_abi("4.15.0-69") == ("4.15.0", 69)  # a Livepatch notice's base kernel
    assert dv.kernel_abi("linux") is None
    assert dv.kernel_order("5.15.0", 999) < dv.kernel_order("5.15.0", 1042) < dv.kernel_order("6.8.0", 1)
    assert upstream("570.172.08-0ubuntu0.22.04.1") == "570.172.08" and upstream("1:2.3-4") == "2.3"


def test_a_distribution_fix_installs_every_installed_binary_at_the_fixed_version():
    """The packaged driver's binaries under the driver component (its upstream version the target, so the
    driver groups' rules hold), any other package's in place under ``packages``, named by its set."""
    fix = "570.172.08-0ubuntu0.22.04.1"
    remedy = NodeRemedy(1, packages={"nvidia-graphics-drivers-570-server": fix, "openssl": "3.0.2-0ubuntu1.15",
                                     "curl": ""},
                        binaries={"nvidia-graphics-drivers-570-server": ["libnvidia-compute-570-server",
                                                                         "nvidia-driver-570-server"],
                                  "openssl": ["libssl3", "openssl"], "curl": ["curl"]})
    found = node_target(remedy, "5.15.0-91-generic")
    assert found.install == {
        "driver": {"libnvidia-compute-570-server": fix, "nvidia-driver-570-server": fix},
        "packages": {"libssl3": "3.0.2-0ubuntu1.15", "openssl": "3.0.2-0ubuntu1.15"},
    }
    assert found.target == {"driver": "570.172.08", "packages": install_label(found.install["packages"])}
    assert found.unpatched == ("curl",)  # no fixed version yet: nothing to install
    # Another set of versions is another target; the same set, the same one.
    assert install_label({"openssl": "3.0.2-0ubuntu1.16"}) != install_label({"openssl": "3.0.2-0ubuntu1.15"})
    assert install_label({"a": "1", "b": "2"}) == install_label({"b": "2", "a": "1"})
    # A livepatch and a package update: both in place.
    both = node_target(NodeRemedy(1, livepatch={"LSN-0066-1": 66}, packages={"openssl": "3.0.2-0ubuntu1.15"},
                                  binaries={"openssl": ["openssl"]}), "4.15.0-70-generic")
    assert set(both.target) == {"livepatch", "packages"} and both.kind == "livepatch+packages"
