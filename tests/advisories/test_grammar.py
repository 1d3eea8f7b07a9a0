"""The version grammar on product names as NVIDIA writes them (the product's `name` in a
product_version leaf): each row is (product, name, listed as known_affected, expected). Expected
is None for a text the grammar must refuse, else (kind, form, [(lower, lower inclusive, upper,
upper inclusive, condition)], fixed version, vGPU labels). Rows are written from the forms (the
driver tables, the vGPU and Cloud Gaming labels, the forms of issue 29: ranges written "X-Y",
release candidates, letter suffixes, "Update N"/"uN", "prior to <product> vN", lists, compound
versions, architecture lists ending "are affected", two bounds in one text: "from X prior to Y",
"X up to Y", "X and later, prior to Y", comparison pairs ">= X, < Y"), not from one file.
"""

from __future__ import annotations

import pytest

from advisories.csaf import decode_version_text
from inventory.versions import parse_version

NAMES = [
    (
        "Tesla",
        "All driver versions prior to 580.95.05",
        True,
        ("affected", "prior to X", [(None, False, "580.95.05", False, ())], "", ()),
    ),
    (
        "GeForce",
        "All drivers versions prior to 510.47.03",
        True,
        ("affected", "prior to X", [(None, False, "510.47.03", False, ())], "", ()),
    ),
    (
        "Tesla",
        "All driver version prior to 570.172.08",
        True,
        ("affected", "prior to X", [(None, False, "570.172.08", False, ())], "", ()),
    ),
    (
        "GeForce",
        "All versions prior to 511.65",
        True,
        ("affected", "prior to X", [(None, False, "511.65", False, ())], "", ()),
    ),
    (
        "GeForce",
        "All drivers versions prior to 472.98 for support of GeForce Kepler desktop",
        True,
        ("affected", "prior to X", [(None, False, "472.98", False, ())], "", ()),
    ),
    (
        "GeForce",
        "All driver versions prior to 473.81 for support of desktop Kepler-series GPUs",
        True,
        ("affected", "prior to X", [(None, False, "473.81", False, ())], "", ()),
    ),
    ("Tesla", "580.95.05", False, ("fixed", "X (<vGPU or release label>)", [], "580.95.05", ())),
    (
        "vGPU software (guest driver)",
        "470.82.00(All versions prior to and including vGPU 13.1)",
        True,
        (
            "affected",
            "X (up to and including <vGPU or release label>)",
            [(None, False, "470.82.00", True, ())],
            "",
            ("13.1",),
        ),
    ),
    (
        "vGPU software (guest driver)",
        "470.103.01(vGPU 13.2)",
        False,
        ("fixed", "X (<vGPU or release label>)", [], "470.103.01", ("13.2",)),
    ),
    (
        "Guest driver",
        "581.15(All versions prior to and including vGPU19.1)",
        True,
        (
            "affected",
            "X (up to and including <vGPU or release label>)",
            [(None, False, "581.15", True, ())],
            "",
            ("19.1",),
        ),
    ),
    (
        "Guest driver",
        "539.28(All versions prior to and including vGPU 16.10)(All versions prior to and including vGPU 18.3)",
        True,
        (
            "affected",
            "X (up to and including <vGPU or release label>)",
            [(None, False, "539.28", True, ())],
            "",
            ("16.10", "18.3"),
        ),
    ),
    (
        "Virtual GPU Manager",
        "510.73.06\t(All versions prior to and including vGPU 14.1)",
        True,
        (
            "affected",
            "X (up to and including <vGPU or release label>)",
            [(None, False, "510.73.06", True, ())],
            "",
            ("14.1",),
        ),
    ),
    (
        "Cloud Gaming Guest Driver",
        "495.50(All versions prior to and including the November 2021 Cloud Gaming Release)",
        True,
        ("affected", "X (up to and including <vGPU or release label>)", [(None, False, "495.50", True, ())], "", ()),
    ),
    (
        "Cloud Gaming Guest Driver",
        "510.47.03(January 2022 Cloud Gaming Release)",
        False,
        ("fixed", "X (<vGPU or release label>)", [], "510.47.03", ()),
    ),
    (
        "Cloud Gaming Guest Driver",
        "512.59(\tAll versions prior to and including the April 2022 Cloud Gaming Release)",
        True,
        ("affected", "X (up to and including <vGPU or release label>)", [(None, False, "512.59", True, ())], "", ()),
    ),
    (
        "NVIDIA Cloud Gaming (guest driver)",
        "All versions prior to 515.65.01(All versions prior to the August 2022 release)",
        True,
        ("affected", "prior to X / prior to the <month> release", [(None, False, "515.65.01", False, ())], "", ()),
    ),
    (
        "NVIDIA Cloud Gaming (guest driver)",
        "All versions prior to 525.89.02(All versions prior to and including February 2023 release)",
        True,
        ("affected", "prior to X / prior to the <month> release", [(None, False, "525.89.02", True, ())], "", ()),
    ),
    (
        "NVIDIA Cloud Gaming (Virtual GPU Manager",
        "All versions prior to 530.51(All versions prior to and including May 2023 release\t)",
        True,
        ("affected", "prior to X / prior to the <month> release", [(None, False, "530.51", True, ())], "", ()),
    ),
    (
        "Guest driver",
        "546.65(All versions up to and including the January 2024 release)",
        True,
        ("affected", "X (up to and including <vGPU or release label>)", [(None, False, "546.65", True, ())], "", ()),
    ),
    (
        "Guest driver",
        "551.61(February 2024 release)",
        False,
        ("fixed", "X (<vGPU or release label>)", [], "551.61", ()),
    ),
    (
        "Guest driver",
        "580.95.05(September 2025 Release)",
        False,
        ("fixed", "X (<vGPU or release label>)", [], "580.95.05", ()),
    ),
    (
        "Guest driver",
        "550.54.15(All versions up to and including vGPU17.1)",
        True,
        (
            "affected",
            "X (up to and including <vGPU or release label>)",
            [(None, False, "550.54.15", True, ())],
            "",
            ("17.1",),
        ),
    ),
    ("Studio", "All driver versions", True, ("affected", "all versions", [(None, False, None, False, ())], "", ())),
    (
        "DCGM",
        "All versions prior to 2.3.4",
        True,
        ("affected", "prior to X", [(None, False, "2.3.4", False, ())], "", ()),
    ),
    ("DCGM", "2.3.4 and 2.3.5 (latest)", False, ("fixed", "X and Y (latest)", [], "2.3.4", ())),
    (
        "NVIDIA Triton Inference Server",
        "22.09 to 24.03",
        True,
        ("affected", "X to Y", [("22.09", True, "24.03", True, ())], "", ()),
    ),
    (
        "NVIDIA Container Toolkit",
        "All versions up to and including v1.16.1",
        True,
        ("affected", "up to and including X", [(None, False, "1.16.1", True, ())], "", ()),
    ),
    ("NVIDIA GPU Operator", "v24.6.2", False, ("fixed", "X (<vGPU or release label>)", [], "24.6.2", ())),
    ("NVIDIA Container Toolkit", "v1.17", False, ("fixed", "X (<vGPU or release label>)", [], "1.17", ())),
    ("NVIDIA Dynamo", "0.0-26.05", True, ("affected", "X to Y", [("0.0", True, "26.05", True, ())], "", ())),
    ("NVIDIA Dynamo", "0.1.0 - 0.3.2", True, ("affected", "X to Y", [("0.1.0", True, "0.3.2", True, ())], "", ())),
    (
        "TensorRT-LLM",
        "v1.3.0 rc17",
        True,
        ("affected", "bare affected release X", [("1.3.0rc17", True, "1.3.0rc17", True, ())], "", ()),
    ),
    (
        "TensorRT-LLM",
        "1.3.0rc17",
        True,
        ("affected", "bare affected release X", [("1.3.0rc17", True, "1.3.0rc17", True, ())], "", ()),
    ),
    (
        "TensorRT-LLM",
        "All versions prior to 1.3.0rc17",
        True,
        ("affected", "prior to X", [(None, False, "1.3.0rc17", False, ())], "", ()),
    ),
    ("TensorRT-LLM", "1.3.0rc18", False, ("fixed", "X (<vGPU or release label>)", [], "1.3.0rc18", ())),
    (
        "TensorRT-LLM",
        "All versions prior to v1.0.0-rc.3",
        True,
        ("affected", "prior to X", [(None, False, "1.0.0rc3", False, ())], "", ()),
    ),
    (
        "NVIDIA NeMo Framework",
        "All versions prior to 2.1.0b2",
        True,
        ("affected", "prior to X", [(None, False, "2.1.0b2", False, ())], "", ()),
    ),
    ("Base Command Manager", "10.24.09a", False, ("fixed", "X (<vGPU or release label>)", [], "10.24.09a", ())),
    (
        "Base Command Manager",
        "All versions prior to 10.24.09a",
        True,
        ("affected", "prior to X", [(None, False, "10.24.09a", False, ())], "", ()),
    ),
    (
        "Base Command Manager",
        "All versions up to and including 10.24.09",
        True,
        ("affected", "up to and including X", [(None, False, "10.24.09", True, ())], "", ()),
    ),
    ("CUDA Toolkit", "12.6 Update 2", False, ("fixed", "X (<vGPU or release label>)", [], "12.6.2", ())),
    (
        "CUDA Toolkit",
        "All versions prior to 12.6 Update 2",
        True,
        ("affected", "prior to X", [(None, False, "12.6.2", False, ())], "", ()),
    ),
    (
        "CUDA Toolkit",
        "12.5U1",
        True,
        ("affected", "bare affected release X", [("12.5.1", True, "12.5.1", True, ())], "", ()),
    ),
    (
        "CUDA Toolkit",
        "All versions up to and including 12.5U1",
        True,
        ("affected", "up to and including X", [(None, False, "12.5.1", True, ())], "", ()),
    ),
    (
        "CUDA Toolkit",
        "All versions prior to CUDA Toolkit v12.2",
        True,
        ("affected", "prior to X", [(None, False, "12.2", False, ())], "", ()),
    ),
    (
        "NVIDIA CUDA Toolkit",
        "All versions prior to CUDA Toolkit 12.8 Update 1",
        True,
        ("affected", "prior to X", [(None, False, "12.8.1", False, ())], "", ()),
    ),
    (
        "Base Command Manager",
        "Base Command Manager 3, Base Command Manager 10",
        True,
        ("affected", "list of releases X, Y", [("3", True, "3", True, ()), ("10", True, "10", True, ())], "", ()),
    ),
    (
        "NVIDIA DOCA",
        "DOCA 2.9, DOCA 2.10",
        True,
        (
            "affected",
            "list of releases X, Y",
            [("2.9", True, "2.9", True, ()), ("2.10", True, "2.10", True, ())],
            "",
            (),
        ),
    ),
    (
        "MLNX_OFED",
        "24.04, 24.07 and 24.10",
        True,
        (
            "affected",
            "list of releases X, Y",
            [
                ("24.04", True, "24.04", True, ()),
                ("24.07", True, "24.07", True, ()),
                ("24.10", True, "24.10", True, ()),
            ],
            "",
            (),
        ),
    ),
    (
        "Base Command Manager",
        "Base Command Manager 10.25.03 and later",
        False,
        ("fixed", "X or newer", [], "10.25.03", ()),
    ),
    (
        "Tesla",
        "All driver versions prior to 582.53 (only GPUs based on the Maxwell, Volta, and Pascal architectures "
        "are affected)",
        True,
        (
            "affected",
            "prior to X",
            [(None, False, "582.53", False, (("gpu_architecture", ("maxwell", "volta", "pascal")),))],
            "",
            (),
        ),
    ),
    (
        "Tesla",
        "All driver versions prior to 582.53 only GPUs based on the Maxwell and Pascal architectures",
        True,
        (
            "affected",
            "prior to X",
            [(None, False, "582.53", False, (("gpu_architecture", ("maxwell", "pascal")),))],
            "",
            (),
        ),
    ),
    (
        "NVIDIA GPU Operator",
        "All versions up to and including 25.3.0 (only when CDI is enabled)",
        True,
        (
            "affected",
            "up to and including X",
            [(None, False, "25.3.0", True, (("container_toolkit_mode", ("cdi",)),))],
            "",
            (),
        ),
    ),
    (
        "NVIDIA Container Toolkit",
        "All versions up to and including 1.17.7 (CDI mode only for versions prior to 1.17.5)",
        True,
        (
            "affected",
            "up to and including X (CDI mode only below Y)",
            [
                ("1.17.5", True, "1.17.7", True, ()),
                (None, False, "1.17.5", False, (("container_toolkit_mode", ("cdi",)),)),
            ],
            "",
            (),
        ),
    ),
    (
        "DCGM Exporter",
        "All versions prior to 4.1.1-4.0.4",
        True,
        ("affected", "prior to X", [(None, False, "4.1.1-4.0.4", False, ())], "", ()),
    ),
    (
        "NVIDIA NeMo Framework",
        "Versions prior to 2.3.1",
        True,
        ("affected", "prior to X", [(None, False, "2.3.1", False, ())], "", ()),
    ),
    ("NVIDIA NeMo Framework", "2.3.1 or later", False, ("fixed", "X or newer", [], "2.3.1", ())),
    ("NVIDIA NeMo Framework", "r2.3.1", False, ("fixed", "X (<vGPU or release label>)", [], "2.3.1", ())),
    (
        "MLNX_OFED",
        "All versions before 24.10-1.1.4.0",
        True,
        ("affected", "prior to X", [(None, False, "24.10-1.1.4.0", False, ())], "", ()),
    ),
    (
        "NVIDIA DOCA",
        "All versions up to 2.9.1",
        True,
        ("affected", "up to and including X", [(None, False, "2.9.1", True, ())], "", ()),
    ),
    (
        "DCGM",
        "All 3.3 versions prior to 3.3.9",
        True,
        ("affected", "all X.Y versions prior to Z", [("3.3", True, "3.3.9", False, ())], "", ()),
    ),
    ("DCGM", "All 3.x versions", True, ("affected", "all X.Y versions", [("3", True, "4", False, ())], "", ())),
    (
        "NVIDIA NVSwitch Firmware",
        "35.2014.1520 and earlier",
        True,
        ("affected", "X and earlier", [(None, False, "35.2014.1520", True, ())], "", ()),
    ),
    ("NVIDIA HGX H100 8-GPU", "1.6.0 or newer", False, ("fixed", "X or newer", [], "1.6.0", ())),
    (
        "NVIDIA A100 VBIOS",
        "All versions prior to and including 92.00.45.00.03",
        True,
        ("affected", "prior to and including X", [(None, False, "92.00.45.00.03", True, ())], "", ()),
    ),
    (
        "Triton Inference Server",
        "24.11",
        True,
        ("affected", "bare affected release X", [("24.11", True, "24.11", True, ())], "", ()),
    ),
    (
        "Triton Inference Server",
        "24.11 only",
        True,
        ("affected", "only release X", [("24.11", True, "24.11", True, ())], "", ()),
    ),
    ("Virtual GPU Manager", "vGPU software 19.2", False, ("fixed", "vGPU software X", [], "", ("19.2",))),
    (
        "Virtual GPU Manager",
        "570.195.02 vGPU software 18.5",
        False,
        ("fixed", "X (<vGPU or release label>)", [], "570.195.02", ("18.5",)),
    ),
    (
        "TensorRT-LLM",
        "All versions before release 0.18.2",
        True,
        ("affected", "prior to X", [(None, False, "0.18.2", False, ())], "", ()),
    ),
    (
        "NVIDIA NIM for LLMs",
        "All versions prior to 1.10.1.",
        True,
        ("affected", "prior to X", [(None, False, "1.10.1", False, ())], "", ()),
    ),
    (
        "NVIDIA Dynamo",
        "All versions prior to 0.4.0 are affected",
        True,
        ("affected", "prior to X", [(None, False, "0.4.0", False, ())], "", ()),
    ),
    ("Studio", "Available the week of June 29, 2023", False, None),
    ("GeForce", "All driver versions prior 475.06 to for support of GeForce Kepler desktop", True, None),
    ("Guest driver", "570.172.08(All versions through the next maintenance release)", True, None),
    ("DCGM Exporter", "4.1.1-4.0.4", False, ("fixed", "X (<vGPU or release label>)", [], "4.1.1-4.0.4", ())),
    ("MLNX_OFED", "24.10-1.1.4.0", False, ("fixed", "X (<vGPU or release label>)", [], "24.10-1.1.4.0", ())),
    (
        "NVIDIA DOCA",
        "DOCA 2.9.1 and earlier",
        True,
        ("affected", "X and earlier", [(None, False, "2.9.1", True, ())], "", ()),
    ),
    (
        "NVIDIA Dynamo",
        "All versions prior to Dynamo v0.4.0",
        True,
        ("affected", "prior to X", [(None, False, "0.4.0", False, ())], "", ()),
    ),
    # Comparison signs, "All X.x releases", "(latest)", the product's own name around the version.
    ("NVIDIA NeMo Framework", "< 2.3.1", True, ("affected", "prior to X", [(None, False, "2.3.1", False, ())], "", ())),
    ("NVIDIA NeMo Framework", "<= 2.3.0", True,
     ("affected", "up to and including X", [(None, False, "2.3.0", True, ())], "", ())),
    ("NVIDIA NeMo Framework", ">= 2.3.1", False, ("fixed", "X or newer", [], "2.3.1", ())),
    ("Triton Inference Server", "All 24.x releases", True,
     ("affected", "all X.Y versions", [("24", True, "25", False, ())], "", ())),
    ("Triton Inference Server", "25.01 (latest)", False, ("fixed", "X (<vGPU or release label>)", [], "25.01", ())),
    ("NIM", "All versions prior to 1.10.1 (NIM)", True,
     ("affected", "prior to X", [(None, False, "1.10.1", False, ())], "", ())),
    ("NVIDIA NIM for LLMs", "NVIDIA NIM for LLMs 1.10.1", False,
     ("fixed", "X (<vGPU or release label>)", [], "1.10.1", ())),
    # A release channel after the version is not part of it.
    ("NVIDIA DOCA", "2.9.1 LTS", False, ("fixed", "X (<vGPU or release label>)", [], "2.9.1", ())),
    ("NVIDIA DOCA", "DOCA 2.9.1 LTS and earlier", True,
     ("affected", "X and earlier", [(None, False, "2.9.1", True, ())], "", ())),
    ("MLNX_OFED", "24.10-1.1.4.0-LTS", False, ("fixed", "X (<vGPU or release label>)", [], "24.10-1.1.4.0", ())),
    # Two bounds in one text, either order, joined by a comma or "and". "Prior to"/"before" exclude
    # the upper bound; "up to", "through" and "until" include it (as "All versions up to X" does);
    # "from X", "X and later" and ">= X" include the lower bound, "later than X" and "> X" exclude it.
    ("Triton Inference Server", "From 24.01 prior to 24.12", True,
     ("affected", "from X prior to Y", [("24.01", True, "24.12", False, ())], "", ())),
    ("NVIDIA NeMo Framework", "All versions from 2.0.0 prior to 2.3.1", True,
     ("affected", "from X prior to Y", [("2.0.0", True, "2.3.1", False, ())], "", ())),
    ("NVIDIA DOCA", "Versions starting with 2.5, before 2.9.1", True,
     ("affected", "from X prior to Y", [("2.5", True, "2.9.1", False, ())], "", ())),
    ("NVIDIA DOCA", "2.5 up to 2.9.1", True, ("affected", "X up to Y", [("2.5", True, "2.9.1", True, ())], "", ())),
    ("Triton Inference Server", "All versions from 24.01 up to 24.12", True,
     ("affected", "X up to Y", [("24.01", True, "24.12", True, ())], "", ())),
    ("NVIDIA NeMo Framework", "NeMo 2.0 up to and including NeMo 2.3.0", True,
     ("affected", "X up to Y", [("2.0", True, "2.3.0", True, ())], "", ())),
    ("CUDA Toolkit", "12.0 and later, prior to 12.6 Update 2", True,
     ("affected", "X and later, prior to Y", [("12.0", True, "12.6.2", False, ())], "", ())),
    ("Base Command Manager", "Base Command Manager 10.24.09 and later, prior to 10.25.03", True,
     ("affected", "X and later, prior to Y", [("10.24.09", True, "10.25.03", False, ())], "", ())),
    ("NVIDIA Dynamo", "0.2.0 or later, before 0.4.0", True,
     ("affected", "X and later, prior to Y", [("0.2.0", True, "0.4.0", False, ())], "", ())),
    ("DCGM", "3.3.0 and later up to and including 3.3.8", True,
     ("affected", "X and later, prior to Y", [("3.3.0", True, "3.3.8", True, ())], "", ())),
    ("NVIDIA Container Toolkit", ">= 1.16.0, < 1.17.8", True,
     ("affected", "X and later, prior to Y", [("1.16.0", True, "1.17.8", False, ())], "", ())),
    ("NVIDIA Container Toolkit", ">=1.16.0 <1.17.8", True,
     ("affected", "X and later, prior to Y", [("1.16.0", True, "1.17.8", False, ())], "", ())),
    ("NVIDIA NeMo Framework", "2.0.0 <= version < 2.3.1", True,
     ("affected", "X and later, prior to Y", [("2.0.0", True, "2.3.1", False, ())], "", ())),
    ("NVIDIA GPU Operator", "> 24.3.0, <= 24.9.1", True,
     ("affected", "later than X, prior to Y", [("24.3.0", False, "24.9.1", True, ())], "", ())),
    ("NVIDIA GPU Operator", "All versions after 24.3.0 and before 24.9.1", True,
     ("affected", "later than X, prior to Y", [("24.3.0", False, "24.9.1", False, ())], "", ())),
    ("NVIDIA NeMo Framework", "< 2.3.1, >= 2.0.0", True,
     ("affected", "prior to Y, from X", [("2.0.0", True, "2.3.1", False, ())], "", ())),
    ("Triton Inference Server", "Prior to 24.12, from 24.01", True,
     ("affected", "prior to Y, from X", [("24.01", True, "24.12", False, ())], "", ())),
    # An empty or inverted range is a misreading, and a lower bound alone names no release: review.
    ("NVIDIA NeMo Framework", "From 2.3.1 prior to 2.0.0", True, None),
    ("NVIDIA NeMo Framework", "From 2.3.1 prior to 2.3.1", True, None),
    ("NVIDIA NeMo Framework", "Prior to 2.3.1, 2.0.0", True, None),
    ("NVIDIA NeMo Framework", "> 2.3.1", True, None),
]


@pytest.mark.parametrize(("product", "name", "listed", "expected"), NAMES, ids=[n[1][:60] for n in NAMES])
def test_it_decodes_product_names(product, name, listed, expected):
    decoded = decode_version_text(name, listed, product)
    if expected is None:
        assert decoded is None
        return
    assert decoded is not None
    assert (
        decoded.kind,
        decoded.form,
        [(p.lower, p.lower_inclusive, p.upper, p.upper_inclusive, p.condition) for p in decoded.parts],
        decoded.fixed,
        decoded.labels,
    ) == expected


def test_the_table_is_wide():
    assert len(NAMES) >= 60
    assert len({expected[1] for *_rest, expected in NAMES if expected}) >= 15


@pytest.mark.parametrize(("product", "name", "listed", "expected"), NAMES, ids=[n[1][:60] for n in NAMES])
def test_every_bound_is_a_version_the_inventory_orders(product, name, listed, expected):
    for version in [v for p in (expected[2] if expected else []) for v in (p[0], p[2]) if v] + (
        [expected[3]] if expected and expected[3] else []
    ):
        assert not parse_version(product.lower().replace(" ", "_")[:60] or "x", version).flagged, version


def test_a_range_read_from_the_name_is_not_the_ids_single_version():
    # The id of "0.0-26.05" ends "0_026_05": read from it, one version, 0.026.05; the name is a range.
    decoded = decode_version_text("0.0-26.05", True, "NVIDIA Dynamo")
    assert decoded is not None and [(p.lower, p.upper) for p in decoded.parts] == [("0.0", "26.05")]
    key = parse_version("dynamo", "25.11").key
    assert parse_version("dynamo", "0.0").key < key <= parse_version("dynamo", "26.05").key


@pytest.mark.parametrize(("name", "bounds"), [
    ("From 24.01 prior to 24.12", ("24.01", True, "24.12", False)),
    ("24.01 up to 24.11", ("24.01", True, "24.11", True)),
    (">= 24.01, < 24.12", ("24.01", True, "24.12", False)),
    ("24.01 and later, prior to 24.12", ("24.01", True, "24.12", False)),
])
def test_a_row_with_two_bounds_is_a_decoded_range_not_a_review_item(name, bounds):
    # Before these forms, such a row was a review item and every node of the product presumed.
    import json
    from pathlib import Path

    from advisories import coverage
    from advisories.csaf import parse

    data = json.loads((Path(__file__).parent / "fixtures" / "test-csaf" / "9002.json").read_bytes())
    leaf = data["product_tree"]["branches"][0]["branches"][1]["branches"][0]
    assert leaf["product"]["product_id"] == "linux_triton_inference_server_24_11"
    leaf["product"]["name"] = name
    parsed = parse(json.dumps(data).encode(), "9002-two-bounds.json")
    ranges = [r for r in parsed.ranges if r.product_id.startswith("linux_triton_inference_server_24_11")]
    assert [(r.basis, r.lower, r.lower_inclusive, r.upper, r.upper_inclusive, r.fixed_version) for r in ranges] == [
        ("decoded", *bounds, "24.12")]
    assert not [n for n in parsed.review if n.key.startswith("linux_triton_inference_server_24_11")]
    assert coverage.of_parsed(parsed).classes["linux_triton_inference_server_24_11"] == "decoded"
