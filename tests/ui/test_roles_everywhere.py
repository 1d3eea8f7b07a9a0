"""Issue 28 item 4: the console needs a role for every page and download, as the API does. The test
walks the URL conf: every console URL (with example arguments) refuses a logged-in user with no role
and lets a viewer in."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from tests.api.conftest import seeded  # noqa: F401  (a fixture)

pytestmark = pytest.mark.django_db

# Not console pages: the API (DRF answers for itself, tests/foundation/test_access.py), the admin (its
# own staff check), the login session's own pages, probes, static files and the favicon (a redirect
# to a static file, open like them).
NOT_CONSOLE = ("api/", "admin/", "accounts/", "healthz", "readyz", "metrics", "static/", "favicon.ico")
EXAMPLES = {"int": "1", "str": "x", "slug": "x", "path": "x", "uuid": "00000000-0000-0000-0000-000000000000"}


def _paths(patterns: list[URLPattern | URLResolver], prefix: str = "") -> Iterator[str]:
    for entry in patterns:
        route = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            yield from _paths(entry.url_patterns, route)
        else:
            yield route


def console_urls(pks: dict[str, int] | None = None) -> list[str]:
    """Every console URL; `pks` gives the example id per first path segment (else 1)."""
    urls = set()
    for route in _paths(get_resolver().url_patterns):
        if route.startswith(NOT_CONSOLE) or route.startswith("^"):
            continue
        for fmt in ("json", "csv", "pdf") if "<str:fmt>" in route else ("",):
            example = route.replace("<str:fmt>", fmt)
            pk = str((pks or {}).get(example.split("/")[0], 1))
            urls.add("/" + re.sub(r"<(?:(\w+):)?\w+>", lambda m, pk=pk: pk if m.group(1) == "int"
                                  else EXAMPLES[m.group(1) or "str"], example))
    return sorted(urls | {"/advisories/exposures/?format=csv", "/nodes/?format=csv"})


def test_the_walk_finds_the_console():
    urls = console_urls()
    assert len(urls) > 30 and "/" in urls and "/campaigns/1/evidence.json" in urls, urls


def test_a_user_with_no_role_is_refused_every_console_url(make_user):
    client = Client()
    client.force_login(make_user("nora"))
    for url in console_urls():
        for method in (client.get, client.post):
            response = method(url)
            assert response.status_code == 403 or (response.status_code == 302 and "/login" in response["Location"]), \
                (method.__name__, url, response.status_code)


def test_a_viewer_reaches_every_console_url(seeded, make_user):  # noqa: F811
    from advisories.models import Advisory
    from inventory.models import Node

    client = Client()
    client.force_login(make_user("vera", "viewer"))
    pks = {"campaigns": seeded.campaigns["completed"], "nodes": Node.objects.values_list("pk", flat=True)[0],
           "advisories": Advisory.objects.values_list("pk", flat=True)[0]}
    answered = 0
    for url in console_urls(pks):
        response = client.get(url)
        answered += response.status_code == 200
        # Refused only for a missing example object (404) or a write a viewer may not make (403 on a POST-only
        # page is what its view says); never the role gate's answer.
        assert b"holds no role" not in response.content, url
        assert not (response.status_code == 302 and "/login" in response["Location"]), url
    assert answered >= 20, answered
