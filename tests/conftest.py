"""Fixtures for the service's tests (the suite-wide rules are in the root conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _own_digest_store(settings, tmp_path_factory):  # type: ignore[no-untyped-def]
    """Each test its own evidence digest store: ids restart when a test's database is rolled back."""
    settings.GPUSWEEP_EVIDENCE_DIGEST_DIR = tmp_path_factory.mktemp("digests")
