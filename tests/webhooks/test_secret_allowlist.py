"""Issue 28 item 1: a webhook or a cluster names only set-aside environment variables, never one of
the service's own settings (which an admin-group user could otherwise have sent to a URL of theirs)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from django.test import Client
from django.utils import timezone

from inventory.models import Cluster
from webhooks import services
from webhooks.models import Delivery, Event, Subscription

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
READERS = {"env_str", "env_bool", "env_int", "env_list", "env_url", "persistent_secret"}


def own_setting_names() -> list[str]:
    """Every environment variable gpusweep/settings.py reads, found by walking its calls."""
    tree = ast.parse((ROOT / "gpusweep" / "settings.py").read_text())
    names = {node.args[0].value for node in ast.walk(tree)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in READERS
             and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)}
    # Read elsewhere (the signing key, the fleet secret, the secret key's generator, Django itself).
    names |= {"SECRET_KEY", "DATABASE_URL", "GPUSWEEP_EVIDENCE_KEY", "GPUSWEEP_AGENT_FLEET_SECRET",
              "DJANGO_SETTINGS_MODULE", "CELERY_BROKER_URL"}
    assert len(names) > 40, "the walk found the settings"
    return sorted(names)


def _admin(make_user) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(make_user("ada", "admin"))
    return client


def test_every_own_setting_is_refused_as_a_webhook_or_cluster_secret(make_user, settings):
    settings.GPUSWEEP_SECRET_ENV_PREFIXES = ["GPUSWEEP_SECRET_", "GPUSWEEP_", ""]  # even a broad prefix
    admin = _admin(make_user)
    for i, name in enumerate(own_setting_names()):
        hook = admin.post("/api/v1/webhooks/subscriptions/", {"name": f"h{i}", "url": "https://evil.example/",
                          "secret": "a-secret-of-sixteen+", "authorization_env": name},
                          content_type="application/json")
        assert hook.status_code == 400, name
        assert "service's own settings" in str(hook.json()), name
        cluster = admin.post("/api/v1/inventory/clusters/", {"name": f"c{i}", "kind": "kubernetes",
                             "connection": {"host": "https://evil.example"}, "secret_env": {"token": name}},
                             content_type="application/json")
        assert cluster.status_code == 400 and "service's own settings" in str(cluster.json()), name
    assert not Subscription.objects.exists() and not Cluster.objects.exists()


def test_only_the_deployments_prefix_is_allowed_and_the_400_says_so(make_user):
    admin = _admin(make_user)
    body = {"name": "jira", "url": "https://jira.example/", "secret": "a-secret-of-sixteen+",
            "authorization_env": "JIRA_AUTHORIZATION"}
    refused = admin.post("/api/v1/webhooks/subscriptions/", body, content_type="application/json")
    assert refused.status_code == 400 and "GPUSWEEP_SECRET_" in str(refused.json())
    body["authorization_env"] = "GPUSWEEP_SECRET_JIRA"
    assert admin.post("/api/v1/webhooks/subscriptions/", body, content_type="application/json").status_code == 201


def test_a_stored_own_name_is_never_sent(monkeypatch):
    monkeypatch.setenv("GPUSWEEP_EVIDENCE_KEY", "the-real-key")
    subscription = Subscription.objects.create(name="old", url="https://evil.example/", secret="a-secret-of-sixteen+",
                                               authorization_env="GPUSWEEP_EVIDENCE_KEY")
    event = Event.objects.create(kind="node.failed", key="k", subject="s", summary="s", data={},
                                 at=timezone.now())
    sent: list[object] = []
    monkeypatch.setattr(services.urllib.request, "urlopen", lambda *a, **k: sent.append(a))
    status, _, error = services._post(subscription, Delivery.objects.create(subscription=subscription, event=event))
    assert status is None and "own settings" in error and not sent
