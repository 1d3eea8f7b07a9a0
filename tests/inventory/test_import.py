from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from conftest import need
from inventory.choices import ServiceState
from inventory.importers import Mapping, import_file
from inventory.models import ChangeLog, Cluster, Node, NodeComponent
from inventory.services import InventoryError

pytestmark = pytest.mark.django_db(transaction=True)

FIXTURES = Path(__file__).parent / "fixtures"
SAMPLE = FIXTURES / "openb_gpu_nodes_sample.csv"
SHARED_GPU_NODES = settings.GPUSWEEP_SHARED_DATA_DIR / "traces" / "alibaba-openb-2023" / "openb_node_list_gpu_node.csv"

HEADER = "name,pool,gpu_model,gpu_count,driver,cuda\n"


def write(tmp_path: Path, text: str, name: str = "nodes.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_it_imports_the_alibaba_sample_with_models_counts_and_mapped_versions():
    cluster, result = import_file(SAMPLE, "openb", Mapping.load("alibaba-openb-2023"))
    assert result.added == 20
    node = Node.objects.get(cluster=cluster, name="openb-node-0000")
    assert (node.gpu_model, node.gpu_count, node.pool, node.cpu_milli, node.memory_mib) == (
        "Tesla P100-PCIE-16GB", 2, "p100", 64000, 262144,
    )
    assert node.component_versions()["driver"] == "535.247.01"
    assert node.labels == {"source": "alibaba-openb-2023"}
    assert set(Node.objects.values_list("gpu_model", flat=True)) == {
        "Tesla P100-PCIE-16GB", "Tesla T4", "Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB", "NVIDIA A10", "G2", "G3",
    }


def test_it_imports_the_full_alibaba_gpu_node_list_from_shared_data():
    """Uses ../shared/data (the full trace file); the sample above covers users without it."""
    need(SHARED_GPU_NODES.exists(), f"{SHARED_GPU_NODES} is missing: check out the shared data beside the repository")
    out = StringIO()
    call_command("import_nodes", str(SHARED_GPU_NODES), "--cluster", "openb", "--mapping", "alibaba-openb-2023",
                 "--no-progress", stdout=out)
    assert "1213 added" in out.getvalue()
    nodes = Node.objects.filter(cluster__name="openb")
    assert nodes.count() == 1213
    assert nodes.filter(gpu_model="G2", gpu_count=8).count() == 549
    assert nodes.filter(gpu_model="Tesla T4").count() == 404
    assert sum(nodes.values_list("gpu_count", flat=True)) == 6212
    again = StringIO()
    call_command("import_nodes", str(SHARED_GPU_NODES), "--cluster", "openb", "--mapping", "alibaba-openb-2023",
                 "--no-progress", stdout=again)
    assert "0 added, 0 changed, 0 removed, 1213 unchanged" in again.getvalue()


def test_it_imports_json_and_marks_nodes_missing_from_the_next_file_gone(tmp_path):
    doc = {"nodes": [
        {"name": "n1", "gpu_model": "H100", "gpu_count": 8, "components": {"driver": "570.86.15", "cuda": "12.8"}},
        {"name": "n2", "gpu_model": "H100", "gpu_count": 8, "components": {"driver": "570.86.15"}},
    ]}
    path = write(tmp_path, json.dumps(doc), "fleet.json")
    import_file(path, "lab")
    doc["nodes"].pop()
    path.write_text(json.dumps(doc))
    _cluster, result = import_file(path, "lab")
    assert result.removed == 1
    assert Node.objects.get(name="n2").service_state == ServiceState.GONE


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("pool,gpu_model\np,H100\n", "missing column 'name'"),
        (
            HEADER + "a,p,H100,8,570.86.15,12.8\nb,p,H100,8,570.86.x,12.8\n",
            "line 3 (node 'b'): driver version '570.86.x'",
        ),
        (HEADER + "a,p,H100,8,570.86.15,12.8\na,p,H100,8,570.86.15,12.8\n", "line 3 (node 'a'): duplicate node 'a'"),
        (HEADER + "a,p,H100,eight,570.86.15,12.8\n", "line 2 (node 'a'): gpu_count 'eight' is not a whole number"),
        ("name,drivr\na,570.86.15\n", "unknown column 'drivr'"),
        (HEADER + "a,p,H100,8\n", "line 2: 4 values for 6 columns"),
        # Limits (issue 15): each used to end in a traceback or in a value the column cannot hold.
        (HEADER + "a,p,H100,8,570.86.15,12.8\nb," + "p" * (128 * 1024 + 1) + ",H100,8,570.86.15,12.8\n",
         "line 3: field larger than field limit"),
        (HEADER + "a,p,H100,99999999999999999999,570.86.15,12.8\n",
         "line 2 (node 'a'): gpu_count 99999999999999999999 is outside 0..2147483647"),
        (HEADER + "a," + "p" * 100_000 + ",H100,8,570.86.15,12.8\n",
         "line 2 (node 'a'): pool is 100000 characters, longer than the 100 allowed"),
        (HEADER + "a,p,H100,8,570.86.15,12.8\nb,p,H\x00,8,570.86.15,12.8\n", "line 3: a NUL character"),
        ('{"nodes": [{"name": "a", "labels": ["x"]}]}', "nodes[0] (node 'a'): labels must be an object"),
        ('{"nodes": [{"name": "a", "gpu_count": 1e400}]}', "numbers must be finite"),
        ('{"nodes": ' + "[" * 100 + "]" * 100 + "}", "nested deeper than 32 levels"),
    ],
)
def test_it_refuses_bad_input_naming_the_row_and_imports_nothing(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(CommandError) as caught:
        call_command("import_nodes", str(path), "--cluster", "lab", "--no-progress")
    assert message in str(caught.value)
    assert "nothing imported" in str(caught.value)
    assert not Cluster.objects.filter(name="lab").exists()
    assert Node.objects.count() == NodeComponent.objects.count() == ChangeLog.objects.count() == 0


def test_it_keeps_the_previous_import_when_a_later_file_is_bad(tmp_path):
    good = write(tmp_path, HEADER + "a,p,H100,8,570.86.15,12.8\n")
    import_file(good, "lab")
    bad = write(tmp_path, HEADER + "a,p,H100,8,580.95.05,12.8\nb,p,H100,8,not-a-driver,12.8\n", "bad.csv")
    with pytest.raises(InventoryError, match="line 3"):
        import_file(bad, "lab")
    assert Node.objects.get(name="a").component_versions()["driver"] == "570.86.15"
    assert not Node.objects.filter(name="b").exists()


def test_it_refuses_a_200_mb_file_before_reading_it(tmp_path):
    path = tmp_path / "huge.csv"
    with path.open("wb") as handle:
        handle.truncate(200 * 1024 * 1024)  # sparse: costs no disk
    with pytest.raises(CommandError, match=r"huge.csv is 200.0 MiB, over the import limit of 100 MiB"):
        call_command("import_nodes", str(path), "--no-progress")
    assert Node.objects.count() == 0


def test_it_flags_unknown_formats_of_other_components(tmp_path):
    path = write(tmp_path, "name,driver,os,component:my_engine\na,570.86.15,debian 12,nightly\n")
    import_file(path, "lab")
    flagged = dict(NodeComponent.objects.filter(version_key__isnull=True).values_list("component", "version"))
    assert flagged == {"os": "debian 12", "my_engine": "nightly"}


def test_sync_inventory_points_static_clusters_to_import_nodes(tmp_path):
    import_file(write(tmp_path, HEADER + "a,p,H100,8,570.86.15,12.8\n"), "lab")
    with pytest.raises(CommandError, match=r"cluster lab is static: it is fed by files \(manage.py import_nodes\)"):
        call_command("sync_inventory", "--cluster", "lab", "--no-progress", stdout=StringIO())
    with pytest.raises(CommandError, match="no cluster named nowhere"):
        call_command("sync_inventory", "--cluster", "nowhere", "--no-progress", stdout=StringIO())
