"""Done-when 2: one node per component, inside and outside each range of the test bulletins.

The fleet meets the test bulletins 9001-9005 (fixtures/test-csaf, in NVIDIA's CSAF form) and
NVIDIA's real DGX A100 firmware bulletin 5367, and gets exactly the exposures listed here:
`presumed` for a driver branch a bulletin skips and for a row that does not decode, and no
firmware of one product matching another's.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from advisories import components
from advisories.exposure import recompute
from advisories.models import Exposure
from inventory.models import Cluster, Node
from tests.advisories.conftest import FIXTURES, add_node

pytestmark = pytest.mark.django_db
TEST_CSAF = FIXTURES.parent / "test-csaf"
DOCUMENTS = [TEST_CSAF / f"{n}.json" for n in ("9001", "9002", "9003", "9004", "9005", "9006")] + [
    FIXTURES / "5367.json"]

H100, A100, V100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB"
# (node, component, version, node fields, {(bulletin, state), ...} expected)
FLEET: list[tuple[str, str, str, dict[str, Any], set[tuple[str, str]]]] = [
    # 9001: up to and including 1.17.7, CDI mode only below 1.17.5; an unknown mode counts as CDI.
    ("ctk-cdi-old", "container_toolkit", "1.17.3", {"facts": {"container_toolkit_mode": "cdi"}}, {("9001", "open")}),
    ("ctk-legacy-old", "container_toolkit", "1.17.3", {"facts": {"container_toolkit_mode": "legacy"}}, set()),
    ("ctk-mode-unknown", "container_toolkit", "1.17.3", {}, {("9001", "open")}),
    ("ctk-legacy-mid", "container_toolkit", "1.17.6", {"facts": {"container_toolkit_mode": "legacy"}},
     {("9001", "open")}),
    ("ctk-fixed", "container_toolkit", "1.17.8", {}, set()),
    ("op-cdi", "gpu_operator", "25.3.0", {"facts": {"container_toolkit_mode": "cdi"}}, {("9001", "open")}),
    ("op-legacy", "gpu_operator", "25.3.0", {"facts": {"container_toolkit_mode": "legacy"}}, set()),
    # 9002: Triton's row is the bare affected release 24.11; its notes say nothing of earlier
    # releases, so those are presumed (and a review item), never silently safe.
    ("triton-24.11", "triton", "24.11", {}, {("9002", "open")}),
    ("triton-24.10", "triton", "24.10", {}, {("9002", "presumed")}),
    ("triton-24.12", "triton", "24.12", {}, set()),
    ("nim-old", "nim", "1.10.0", {}, {("9002", "open")}),
    ("nim-fixed", "nim", "1.10.1", {}, set()),
    ("trtllm-old", "tensorrt_llm", "0.18.1", {}, {("9002", "open")}),
    ("trtllm-fixed", "tensorrt_llm", "0.18.2", {}, set()),
    # 9003: VBIOS per GPU model, firmware and BMC per platform; 5367 is DGX A100's firmware.
    ("vbios-h100-old", "vbios", "96.00.74.00.11", {"gpu_model": H100}, {("9003", "open")}),
    ("vbios-h100-fixed", "vbios", "96.00.99.00.01", {"gpu_model": H100}, set()),
    ("vbios-a100-old", "vbios", "92.00.45.00.03", {"gpu_model": A100}, {("9003", "open")}),
    ("vbios-a100-h100-version", "vbios", "96.00.74.00.11", {"gpu_model": A100}, set()),
    # A VBIOS version below DGX A100's firmware fix, on a DGX A100: the firmware bulletin is not its.
    ("vbios-on-dgx-a100", "vbios", "92.00.81.00.01", {"gpu_model": A100, "facts": {"platform": "DGX A100"}}, set()),
    ("vbios-model-unknown", "vbios", "90.00.10.00.01", {"gpu_model": ""}, {("9003", "presumed")}),
    ("fw-dgx-h100-old", "system_firmware", "1.5.0", {"facts": {"platform": "NVIDIA DGX H100"}}, {("9003", "open")}),
    ("fw-dgx-h100-fixed", "system_firmware", "1.5.1", {"facts": {"platform": "dgx_h100"}}, set()),
    ("fw-hgx-h100-in", "system_firmware", "1.4.0", {"facts": {"platform": "HGX H100"}}, {("9003", "open")}),
    ("fw-dgx-a100-old", "system_firmware", "22.4.0", {"facts": {"platform": "DGX A100"}}, {("5367", "open")}),
    ("fw-dgx-a100-fixed", "system_firmware", "22.5.5", {"facts": {"platform": "DGX A100"}}, set()),
    ("fw-platform-unknown", "system_firmware", "1.4.0", {}, {("9003", "presumed"), ("5367", "presumed")}),
    ("bmc-dgx-h100-old", "bmc", "25.06.26", {"facts": {"platform": "DGX H100"}}, {("9003", "open")}),
    ("bmc-dgx-a100", "bmc", "25.06.26", {"facts": {"platform": "DGX A100"}}, set()),
    ("nvswitch-old", "nvswitch_firmware", "35.2014.1520", {}, {("9003", "open")}),
    ("nvswitch-fixed", "nvswitch_firmware", "35.2014.1580", {}, set()),
    # 9004: names R580 and R535 for Linux Tesla: R550 and R570 in between are presumed.
    ("drv-r580-old", "driver", "580.82.07", {}, {("9004", "open")}),
    ("drv-r580-fixed", "driver", "580.95.05", {}, set()),
    ("drv-r535-old", "driver", "535.261.03", {}, {("9004", "open")}),
    ("drv-r550-skipped", "driver", "550.163.01", {}, {("9004", "presumed")}),
    ("drv-r570-skipped", "driver", "570.195.03", {}, {("9004", "presumed")}),
    ("drv-win-volta", "driver", "581.15", {"os_family": "windows", "gpu_model": V100}, {("9004", "open")}),
    ("drv-win-hopper", "driver", "581.15", {"os_family": "windows", "gpu_model": H100}, set()),
    ("vgpu-mgr-r570-old", "driver", "570.172.07", {"os_family": "hypervisor", "product_line": "vgpu_manager"},
     {("9004", "open")}),
    ("vgpu-mgr-r570-fixed", "driver", "570.195.02", {"os_family": "hypervisor", "product_line": "vgpu_manager"},
     set()),
    ("vgpu-mgr-r575-skipped", "driver", "575.51.01", {"os_family": "hypervisor", "product_line": "vgpu_manager"},
     {("9004", "presumed")}),
    # The R570 vGPU guest row does not decode: every R570 guest is presumed exposed.
    ("vgpu-guest-undecoded", "driver", "570.195.03", {"product_line": "vgpu_guest"}, {("9004", "presumed")}),
    ("vgpu-guest-r580", "driver", "580.95.05", {"product_line": "vgpu_guest"}, set()),
    # 9005: the data-center software.
    ("dcgm-old", "dcgm", "3.3.8", {}, {("9005", "open")}),
    ("dcgm-older-line", "dcgm", "3.2.9", {}, set()),
    ("fm-old", "fabric_manager", "570.172.08", {}, {("9005", "open")}),
    ("fm-fixed", "fabric_manager", "570.195.03", {}, set()),
    # 9006's Windows row (prior to 12.9 Update 2) is not a Linux node's.
    ("cuda-toolkit-old", "cuda_toolkit", "12.8.1", {}, {("9005", "open")}),
    ("cuda-toolkit-12.6u1", "cuda_toolkit", "12.6.1", {}, {("9005", "open"), ("9006", "open")}),
    ("cuda-toolkit-fixed", "cuda_toolkit", "12.9.1", {}, set()),
    ("cuda-driver-api", "cuda", "12.8", {}, set()),  # the driver's CUDA version is not the toolkit
    ("bcm-old", "base_command_manager", "10.25.03", {}, {("9005", "open")}),
    ("bcm-fixed", "base_command_manager", "10.25.05", {}, set()),
    # 9006: the forms of issue 29 (pre-releases, letter suffixes, compound versions, "X-Y").
    ("bcm-10.24.09", "base_command_manager", "10.24.09", {}, {("9005", "open"), ("9006", "open")}),
    ("bcm-10.24.09a", "base_command_manager", "10.24.09a", {}, {("9005", "open")}),
    ("nemo-rc1", "nemo", "2.3.0rc1", {}, {("9006", "open")}),
    ("nemo-rc2", "nemo", "2.3.0rc2", {}, set()),
    ("nemo-final", "nemo", "2.3.0", {}, set()),
    ("dynamo-old", "dynamo", "0.3.0", {}, {("9006", "open")}),
    ("dynamo-fixed", "dynamo", "0.4.2", {}, set()),
    ("doca-old", "doca", "2.9.1", {}, {("9006", "open")}),
    ("doca-fixed", "doca", "2.9.2", {}, set()),
    ("ofed-old", "mlnx_ofed", "24.10-0.7.0.0", {}, {("9006", "open")}),
    ("ofed-fixed", "mlnx_ofed", "24.10-1.1.4.0", {}, set()),
    ("exporter-old", "dcgm_exporter", "4.1.1-4.0.3", {}, {("9006", "open")}),
    ("exporter-fixed", "dcgm_exporter", "4.1.1-4.0.4", {}, set()),
    # DCGM Exporter rows are not DCGM's: a DCGM 4.1.1 is not in them.
    ("dcgm-4", "dcgm", "4.1.1", {}, set()),
]


def _make_node(cluster: Cluster, name: str, component: str, version: str, fields: dict[str, Any]) -> Node:
    node = add_node(cluster, name, **{component: version})
    for field, value in {"gpu_model": H100, **fields}.items():
        setattr(node, field, value)
    node.save()
    return node


@pytest.fixture
def fleet(tmp_path: Path) -> dict[str, set[tuple[str, str]]]:
    for document in DOCUMENTS:
        call_command("ingest_advisories", str(document), "--no-progress", stdout=io.StringIO())
    cluster = Cluster.objects.create(name="lab", kind="static")
    for name, component, version, fields, _expected in FLEET:
        _make_node(cluster, name, component, version, fields)
    recompute()
    found: dict[str, set[tuple[str, str]]] = {name: set() for name, *_ in FLEET}
    for node, bulletin, state in Exposure.objects.values_list("node__name", "advisory__publisher_id", "state"):
        found[node].add((bulletin, state))
    return found


def test_the_fleet_gets_exactly_the_expected_exposures(fleet):
    assert fleet == {name: expected for name, _c, _v, _f, expected in FLEET}


COMPONENTS = sorted({c.name for c in components.REGISTRY})


@pytest.mark.parametrize("component", COMPONENTS)
def test_each_component_has_an_exposed_node_and_one_that_is_not(component, fleet):
    rows = [(name, expected) for name, c, _v, _f, expected in FLEET if c == component]
    exposed = [name for name, expected in rows if any(state == "open" for _b, state in expected)]
    not_exposed = [name for name, expected in rows if not expected]
    assert exposed and not_exposed, f"the fleet needs both for {component}"
    for name, expected in rows:
        assert fleet[name] == expected, name


def test_a_fact_reported_later_moves_a_presumed_exposure_to_open_or_out():
    for document in DOCUMENTS:
        call_command("ingest_advisories", str(document), "--no-progress", stdout=io.StringIO())
    cluster = Cluster.objects.create(name="lab", kind="static")
    known = _make_node(cluster, "becomes-dgx-h100", "system_firmware", "1.4.0", {})
    other = _make_node(cluster, "becomes-dgx-a100", "system_firmware", "23.0.0", {})
    recompute()
    assert set(Exposure.objects.filter(node=known).values_list("advisory__publisher_id", "state")) == {
        ("9003", "presumed"), ("5367", "presumed")}
    for node, platform in ((known, "DGX H100"), (other, "DGX A100")):
        node.facts = {"platform": platform}
        node.save()
    recompute(node_ids=[known.id, other.id])
    # Now known: 9003's DGX H100 row applies (open); its HGX row and DGX A100's 5367 do not, and
    # as nothing was patched those presumed rows are withdrawn, not remediated.
    assert list(Exposure.objects.filter(node=known).values_list("advisory__publisher_id", "state",
                                                                "affected_range__scope")) == [
        ("9003", "open", {"platform": "dgx_h100"})]
    assert not Exposure.objects.filter(node=other).exists()
