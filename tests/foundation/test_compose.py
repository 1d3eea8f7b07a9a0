"""docker-compose.yml is not run here (no Docker engine), so its structure is checked instead."""

from __future__ import annotations

import yaml

from tests.helpers import REPO


def _compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def test_it_defines_the_five_services_with_health_checks():
    services = _compose()["services"]
    for name in ("postgres", "redis", "web", "worker", "beat"):
        assert name in services, name
        assert "healthcheck" in services[name], f"{name} has no health check"
        assert "image" in services[name] or "build" in services[name]


def test_app_services_use_postgres_and_redis_and_wait_for_them():
    services = _compose()["services"]
    for name in ("web", "worker", "beat"):
        env = services[name]["environment"]
        assert env["DATABASE_URL"].startswith("postgres://")
        assert env["CELERY_BROKER_URL"].startswith("redis://")
        assert env["DEBUG"] == "false"
        assert "SECRET_KEY" in env
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy"
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_state_lives_on_volumes():
    compose = _compose()
    assert {"postgres-data", "redis-data"} <= set(compose["volumes"])
    assert any(v.startswith("postgres-data:") for v in compose["services"]["postgres"]["volumes"])


def test_the_dockerfile_serves_with_gunicorn_as_a_non_root_user():
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "gunicorn" in dockerfile
    assert "USER gpusweep" in dockerfile
