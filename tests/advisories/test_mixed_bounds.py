"""Done-when 2 through the real matching path: ranges whose two bounds are written in different
forms (fixtures/test-csaf/9007: "All 12.5U1 versions prior to 12.6 Update 2", "v1.3.0 rc17 -
1.3.1", "All 1.3.0rc17 versions prior to 1.3.1", "10.24.09a through 10.24.11") are ingested, nodes
report versions in any of those forms, and recompute exposes a node exactly when its version lies
inside: rc before final (rc2 before rc17), a letter suffix after the bare release, "Update N" /
"uN" between N-1 and N+1, each bound inclusive or not as the row says.
"""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from advisories.exposure import recompute
from advisories.models import Advisory, Exposure
from inventory.models import Cluster
from tests.advisories.conftest import FIXTURES, add_node

pytestmark = pytest.mark.django_db
BULLETIN = FIXTURES.parent / "test-csaf" / "9007.json"

# (component, node version, exposed?), walking each range from below its lower bound to past its upper.
FLEET = [
    # [12.5 Update 1, 12.6 Update 2): introduced in "uN" form, fixed in "Update N" form.
    ("cuda_toolkit", "12.5", False),
    ("cuda_toolkit", "12.5.0", False),
    ("cuda_toolkit", "12.5U1", True),
    ("cuda_toolkit", "12.5 Update 1", True),
    ("cuda_toolkit", "12.5.1", True),
    ("cuda_toolkit", "12.5 Update 3", True),
    ("cuda_toolkit", "12.6", True),
    ("cuda_toolkit", "12.6u1", True),
    ("cuda_toolkit", "12.6 Update 2", False),
    ("cuda_toolkit", "12.6.2", False),
    ("cuda_toolkit", "12.6U3", False),
    ("cuda_toolkit", "12.7", False),
    # [1.3.0rc17, 1.3.1]: a release candidate to a final release, both inclusive.
    ("nemo", "1.2.9", False),
    ("nemo", "1.3.0rc16", False),
    ("nemo", "1.3.0rc17", True),
    ("nemo", "v1.3.0 rc17", True),
    ("nemo", "1.3.0", True),
    ("nemo", "1.3.0.post1", True),
    ("nemo", "1.3.1rc1", True),
    ("nemo", "1.3.1", True),
    ("nemo", "1.3.1.post1", False),
    ("nemo", "1.3.2rc1", False),
    ("nemo", "1.3.2", False),
    # [1.3.0rc17, 1.3.1): the fix's own release candidate is before the fix.
    ("tensorrt_llm", "1.3.0rc2", False),
    ("tensorrt_llm", "1.3.0rc17", True),
    ("tensorrt_llm", "1.3.0", True),
    ("tensorrt_llm", "1.3.1rc1", True),
    ("tensorrt_llm", "1.3.1", False),
    ("tensorrt_llm", "1.3.10", False),
    # [10.24.09a, 10.24.11]: a letter suffix to a bare release; fixed in 10.24.11a.
    ("base_command_manager", "10.24.09", False),
    ("base_command_manager", "10.24.09a", True),
    ("base_command_manager", "10.24.09b", True),
    ("base_command_manager", "10.24.10", True),
    ("base_command_manager", "10.24.11", True),
    ("base_command_manager", "10.24.11a", False),
    ("base_command_manager", "10.24.12", False),
]


def test_mixed_form_bounds_expose_exactly_the_nodes_inside():
    call_command("ingest_advisories", str(BULLETIN), "--no-progress", stdout=io.StringIO())
    ranges = Advisory.objects.get(publisher_id="9007").ranges.all()
    # Every row decoded to a range (nothing presumed, nothing to review): the matching alone decides.
    assert {(r.component, r.basis) for r in ranges} == {(c, "decoded") for c, _v, _e in FLEET}
    cluster = Cluster.objects.create(name="lab", kind="static")
    for i, (component, version, _exposed) in enumerate(FLEET):
        add_node(cluster, f"n{i:02d}", **{component: version})
    recompute()
    found = {(component, version): state for component, version, state in
             Exposure.objects.values_list("component", "detected_version", "state")}
    assert found == {(component, version): "open" for component, version, exposed in FLEET if exposed}
