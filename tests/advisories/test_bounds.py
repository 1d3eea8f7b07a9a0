"""Issue 28 item 7: risk accepted for at most the policy's maximum; a CSAF document too deep or too big
is one rejected document, never the end of the ingest run with the good bulletins beside it."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from advisories import bounds, services
from advisories.csaf import DocumentError
from advisories.ingest import FetchedDocument, ingest_documents
from advisories.models import Advisory, DeadlinePolicy
from advisories.services import DecisionError
from tests.advisories.conftest import FIXTURES
from tests.advisories.test_decisions import presumed  # noqa: F401  (a fixture)

pytestmark = pytest.mark.django_db


def test_a_deep_document_beside_a_good_one_is_rejected_and_the_good_one_ingested():
    deep = b'{"document": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    summary = ingest_documents([FetchedDocument("deep.json", deep, "file"),
                                FetchedDocument("5582.json", (FIXTURES / "5582.json").read_bytes(), "file")])
    assert summary.new == 1 and Advisory.objects.filter(publisher_id="5582").exists()
    assert summary.errors == [f"deep.json: nested more than {bounds.MAX_DEPTH} levels deep"]


def test_a_document_too_big_is_refused_and_brackets_in_strings_do_not_count():
    with pytest.raises(DocumentError, match="allowed"):
        bounds.check(b"{}" * 10, "big.json", max_bytes=8)
    bounds.check(b'{"a": "' + b"[" * 500 + b'\\"["}', "ok.json")


def test_risk_is_accepted_for_at_most_the_policys_maximum(presumed):  # noqa: F811
    anna = User.objects.create_user("anna")
    with pytest.raises(DecisionError, match="at most 365 days"):
        services.accept_risk(presumed.id, anna, "forever", dt.datetime(9999, 12, 31, tzinfo=dt.UTC))
    assert services.accept_risk(presumed.id, anna, "a year", timezone.now() + dt.timedelta(days=364)).state \
        == "risk_accepted"
    DeadlinePolicy.objects.filter(pk=1).update(risk_max_days=30)  # the admin shortens it
    with pytest.raises(DecisionError, match="at most 30 days"):
        services.accept_risk(presumed.id, anna, "two months", timezone.now() + dt.timedelta(days=60))
