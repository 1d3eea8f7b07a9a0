"""Pages made of the sections apps register (gpusweep.registry), and the registries that let a lower
layer show or accept what an upper one defines (docs/architecture.md, Layers)."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from console import overview
from executors import portability
from gpusweep import registry
from inventory.choices import CheckpointEngine


def test_two_sections_of_a_page_giving_one_name_are_refused():
    assert registry.merged([{"a": 1}, {"b": 2}]) == {"a": 1, "b": 2}
    with pytest.raises(ImproperlyConfigured, match="nodes"):
        registry.merged([{"nodes": 1}, {"nodes": 2}])


def test_two_half_sections_in_a_row_share_a_line_and_a_section_without_a_block_takes_none():
    full, half1, half2, half3, headline = (
        registry.OverviewSection("full", 1, template="t"), registry.OverviewSection("h1", 2, template="t", half=True),
        registry.OverviewSection("h2", 3, template="t", half=True),
        registry.OverviewSection("h3", 4, template="t", half=True), registry.OverviewSection("n", 5, headline="t"))
    live = registry.OverviewSection("live", 6, template="t", live=dict)
    assert overview.rows([full, half1, half2, half3, headline, live]) == [
        (False, [overview.Block(full, True)]), (True, [overview.Block(half1, True), overview.Block(half2, True)]),
        (True, [overview.Block(half3, True)]), (False, [overview.Block(live, False)])]


def test_every_installed_app_contributes_its_sections_in_order():
    assert [s.name for s in registry.overview] == ["nodes", "advisories", "compliance", "campaigns", "review"]
    assert [s.name for s in registry.settings_page] == ["deadline-policy", "clusters"]
    assert [s.name for s in registry.node_page] == ["exposures", "campaigns"]
    assert overview.tables(registry.overview) == (
        "inventory_node", "advisories_advisory", "advisories_exposure", "campaigns_campaign")


def test_registering_again_replaces_a_section():
    sections: registry.Sections[registry.Link] = registry.Sections()
    sections.add(registry.Link("b", 2, "/b/"), registry.Link("a", 1, "/a/"))
    sections.add(registry.Link("b", 0, "/b2/"))
    assert [(link.name, link.path) for link in sections] == [("b", "/b2/"), ("a", "/a/")]


def test_a_checkpoint_engine_registered_by_executors_is_one_a_workload_may_name():
    assert CheckpointEngine.values() == list(portability.ENGINES)
    before = list(CheckpointEngine.CHOICES)
    try:
        portability.register(portability.EngineRule("test-engine", label="Test engine"))
        assert ("test-engine", "Test engine") in CheckpointEngine.choices()
    finally:
        portability.ENGINES.pop("test-engine")
        CheckpointEngine.CHOICES = before
