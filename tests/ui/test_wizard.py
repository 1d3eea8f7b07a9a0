"""The campaign wizard: real lists, a live count of matched nodes, windows and blackouts, and a plan
preview that keeps nothing."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.test import Client

from advisories.exposure import recompute
from advisories.models import Advisory
from campaigns.models import Campaign, EvidenceEvent
from tests.advisories.conftest import FIXTURES
from tests.campaigns.fleet import make_fleet, user

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator() -> Client:
    call_command("ingest_advisories", str(FIXTURES), verbosity=0)
    make_fleet(nodes=3, spares=2)
    recompute()
    client = Client()
    client.force_login(user("otto", "operator"))
    return client


def _body(advisory: Advisory, **extra: object) -> dict[str, object]:
    return {"name": "Patch 5703", "advisories": [advisory.public_id], "clusters": ["local"],
            "node_names": "gpu00,gpu01,gpu02", "parallelism_per_cluster": "1", "error_budget": "1",
            "workload_policy": "checkpoint", "canary": "0", "soak_s": "0", "approvals_required": "1", **extra}


def test_it_starts_from_the_advisory_with_real_lists(operator: Client):
    advisory = Advisory.objects.get(publisher_id="5703")
    page = operator.get(f"/campaigns/new/?advisories={advisory.public_id}").content.decode()
    assert f'value="{advisory.public_id}" id="adv-{advisory.public_id}" checked' in page
    assert 'value="Patch 5703"' in page
    assert 'name="clusters" value="local"' in page and 'name="pools" value="a"' in page and "a (5 nodes)" in page
    assert "integrity mismatch" in page  # 5703's hash does not match
    row = page[page.index(f'id="adv-{advisory.public_id}"'):][:600]
    assert '<td class="num">5</td>' in row  # every node, spares too, runs the old driver


def test_the_live_count_follows_the_scope(operator: Client):
    advisory = Advisory.objects.get(publisher_id="5703")
    everyone = operator.get("/campaigns/new/match/?clusters=local").content.decode()
    assert 'data-nodes="5"' in everyone
    some = operator.get(f"/campaigns/new/match/?clusters=local&node_names=gpu00,gpu01&advisories={advisory.public_id}")
    assert 'data-nodes="2"' in some.content.decode() and "<strong>2</strong> of them exposed" in some.content.decode()


def test_the_preview_shows_waves_destinations_and_warnings_and_keeps_nothing(operator: Client):
    advisory = Advisory.objects.get(publisher_id="5703")
    page = operator.post("/campaigns/new/preview/", _body(advisory)).content.decode()
    assert "Wave 1" in page and "Wave 3" in page and "moves to spare" in page
    assert "Integrity mismatch: NVIDIA 5703" in page and advisory.published_sha256 in page
    assert Campaign.objects.count() == 0 and EvidenceEvent.objects.count() == 0


def test_windows_and_blackouts_become_the_campaigns_and_bad_ones_write_nothing(operator: Client):
    advisory = Advisory.objects.get(publisher_id="5703")
    bad = operator.post("/campaigns/new/", _body(advisory, win_start_0="22:00", win_end_0="nonsense"))
    assert bad.status_code == 200 and Campaign.objects.count() == 0
    assert "windows" in bad.content.decode()
    response = operator.post("/campaigns/new/", _body(
        advisory, win_days_0=["0", "1", "2", "3", "4"], win_start_0="22:00", win_end_0="06:00",
        win_tz_0="Europe/Berlin", bo_start_0="2026-12-24T00:00", bo_end_0="2026-12-27T00:00", then="plan"))
    assert response.status_code == 302
    campaign = Campaign.objects.get()
    assert campaign.windows == [{"days": [0, 1, 2, 3, 4], "start": "22:00", "end": "06:00", "tz": "Europe/Berlin"}]
    assert campaign.blackouts == [{"start": "2026-12-24T00:00:00+00:00", "end": "2026-12-27T00:00:00+00:00"}]
    assert campaign.node_selector == {"names": ["gpu00", "gpu01", "gpu02"]}
    assert campaign.plans.count() == 1 and campaign.status == "planned"
    page = operator.get(f"/campaigns/{campaign.pk}/").content.decode()
    assert "Mon-Fri 22:00-06:00 Europe/Berlin" in page and "2026-12-24 00:00 UTC to 2026-12-27 00:00 UTC" in page


def test_advisories_affecting_the_fleet_come_first_the_rest_behind_a_toggle(operator: Client):
    """Issue 31: the exposed advisories with their node counts, a search box, the others in a
    <details> closed unless one of them is chosen; every checkbox value a public id."""
    import re

    from advisories import counts

    page = operator.get("/campaigns/new/").content.decode()
    exposed = {a.public_id for a in Advisory.objects.all()
               if counts.per_advisory().get(a.pk, counts.Counts()).exposed_nodes
               + counts.per_advisory().get(a.pk, counts.Counts()).presumed_nodes}
    assert exposed and len(exposed) < Advisory.objects.count()
    first, toggle = page.index('id="advisories-exposing"'), page.index('<details id="advisories-others">')
    assert '<input type="search" id="advisory-search"' in page and page.index('id="advisory-search"') < first
    listed = re.findall(r'name="advisories" value="([^"]+)"', page)
    assert sorted(listed) == sorted(a.public_id for a in Advisory.objects.all())  # public ids, never a pk
    shown_first = set(re.findall(r'name="advisories" value="([^"]+)"', page[first:toggle]))
    assert shown_first == exposed
    assert f"{Advisory.objects.count() - len(exposed)} advisories with no exposed node" in page
    # A chosen advisory with no exposed node opens the toggle; its row carries the text the search matches.
    quiet = Advisory.objects.exclude(publisher_id__in=[e.split("-", 1)[1] for e in exposed]).prefetch_related(
        "cves").first()
    page = operator.get(f"/campaigns/new/?advisories={quiet.public_id}").content.decode()
    assert '<details id="advisories-others" open>' in page
    row = page[:page.index(f'id="adv-{quiet.public_id}"')].rsplit("<tr", 1)[1]
    assert quiet.public_id in row and all(c.cve_id.lower() in row for c in quiet.cves.all())
    assert 'src="/static/campaigns/wizard.js"' in page


def test_the_wizard_takes_public_ids_and_refuses_a_database_id(operator: Client):
    advisory = Advisory.objects.get(publisher_id="5703")
    response = operator.post("/campaigns/new/", _body(advisory, then="draft"))
    assert response.status_code == 302
    assert list(Campaign.objects.get().advisories.all()) == [advisory]
    refused = operator.post("/campaigns/new/", {**_body(advisory), "advisories": [str(advisory.pk)]})
    assert refused.status_code == 200 and Campaign.objects.count() == 1
    assert "is not one of the available choices" in refused.content.decode()


def test_labels_are_written_for_people_and_the_preview_sits_above_the_buttons(operator: Client):
    import re

    page = operator.get("/campaigns/new/").content.decode()
    labels = [re.sub(r"<[^>]+>", "", label).strip() for label in re.findall(r"<label[^>]*>(.*?)</label>", page, re.S)]
    assert "Soak after the canary (seconds)" in labels and "DCGM diagnostic level" in labels
    assert "Soak s:" not in labels and "Dcgm level:" not in labels
    assert not [label for label in labels if label.endswith(":") or "_" in label], labels
    # The preview is swapped in just above the buttons and scrolled into view.
    preview, buttons = page.index('<section id="preview"'), page.index('id="preview-button"')
    assert preview < buttons < page.rindex("</form>")
    assert 'hx-swap="innerHTML show:top"' in page[buttons - 300:buttons + 300]
