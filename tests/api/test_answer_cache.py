"""The answer cache (gpusweep.responses) on a shared Redis cache: a hit is byte for byte the answer
the view renders, a write of any kind shows in the next GET, nothing is served across roles or to
a caller the server now refuses, and a clock-dependent answer expires when its rows change by
themselves. Committing tests (transaction=True): generations rise only on commit."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts import services as tokens
from conftest import need
from gpusweep import datagen
from gpusweep.roles import Role

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]

NODES = "/api/v1/inventory/nodes/?limit=100"
EXPOSURES = "/api/v1/advisories/exposures/?state=open&ordering=-deadline&limit=100"


@pytest.fixture
def shared_cache(settings) -> Iterator[None]:  # type: ignore[no-untyped-def]
    broker = settings.CELERY_BROKER_URL
    if not broker.startswith("redis"):
        pytest.skip("needs Redis (CELERY_BROKER_URL=redis://...) as the shared cache")
    settings.CACHES = {"default": {"BACKEND": "gpusweep.cache.RedisCache", "LOCATION": broker,
                                   "KEY_PREFIX": f"test-answers-{time.time_ns()}"}}
    settings.GPUSWEEP_RESPONSE_CACHE_S = 300
    assert datagen.enabled()
    yield


@pytest.fixture
def fleet(shared_cache):  # type: ignore[no-untyped-def]
    from advisories.models import CVE, Advisory, AffectedRange, Exposure
    from inventory.models import Cluster, Node, NodeComponent

    cluster = Cluster.objects.create(name="c1", kind="static")
    nodes = [Node.objects.create(cluster=cluster, name=f"gpu{i:02}") for i in range(3)]
    for node in nodes:
        NodeComponent.objects.create(node=node, component="driver", version="570.86.15", branch="R570")
    advisory = Advisory.objects.create(publisher_id="5703", title="GPU Display Driver", source_kind="file",
                                       source="5703.json")
    rng = AffectedRange.objects.create(advisory=advisory, product_id="linuxR570", component="driver",
                                       branch="R570", raw="prior to 570.195.03", fixed_version="570.195.03")
    rng.cves.add(CVE.objects.create(cve_id="CVE-2025-0001"))
    now = timezone.now()
    for i, node in enumerate(nodes):
        Exposure.objects.create(node=node, advisory=advisory, affected_range=rng, component="driver",
                                detected_version="570.86.15", first_seen=now, deadline=now + dt.timedelta(days=i + 1))
    return {"cluster": cluster, "nodes": nodes, "advisory": advisory, "range": rng}


def _user(name: str, *roles: Role) -> User:
    user = User.objects.create_user(name, password="x-" + name)
    for role in roles:
        user.groups.add(Group.objects.get(name=role.value))
    return user


def _token_client(user: User) -> tuple[Client, int]:
    token, key = tokens.issue(user, "t")
    return Client(HTTP_AUTHORIZATION=f"Bearer {key}", HTTP_ACCEPT="application/json"), token.pk


def _get(client: Client, url: str) -> tuple[bytes, int]:
    """The body and how many statements the request ran beyond authentication (0: served from the cache)."""
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200, response.content
    beyond = [q for q in queries.captured_queries if "accounts_apitoken" not in q["sql"]
              and "auth_group" not in q["sql"]]
    return response.content, len(beyond)


@pytest.mark.parametrize("url", [NODES, EXPOSURES])
def test_a_hit_is_the_answer_the_view_renders(fleet, settings, url):
    client, _ = _token_client(_user("viewer", Role.VIEWER))
    first, ran = _get(client, url)
    assert ran > 0
    again, ran = _get(client, url)
    assert ran == 0 and again == first
    settings.GPUSWEEP_RESPONSE_CACHE_S = 0
    uncached = client.get(url)
    assert uncached.content == again
    hit_headers = client.get(url)  # uncached again; compare the headers a hit repeats
    settings.GPUSWEEP_RESPONSE_CACHE_S = 300
    hit = client.get(url)
    for name in ("Content-Type", "Vary", "Allow"):
        assert hit.headers.get(name) == hit_headers.headers.get(name), name


def test_every_kind_of_write_shows_in_the_next_get(fleet):
    from gpusweep.db.bulk import insert_rows
    from inventory.models import Node, NodeComponent

    client, _ = _token_client(_user("viewer", Role.VIEWER))
    node = fleet["nodes"][0]

    def pool() -> str:
        rows = client.get(NODES).json()["results"]
        return next(r["pool"] for r in rows if r["id"] == node.pk)

    assert pool() == "" and _get(client, NODES)[1] == 0
    Node.objects.filter(pk=node.pk).update(pool="orm-update")  # no signals
    assert pool() == "orm-update"
    node.pool = "save"
    node.save()
    assert pool() == "save"
    with connection.cursor() as cursor:
        cursor.execute("UPDATE inventory_node SET pool = %s WHERE id = %s", ["raw-sql", node.pk])
    assert pool() == "raw-sql"
    with transaction.atomic():
        Node.objects.filter(pk=node.pk).update(pool="in-a-transaction")
        with transaction.atomic():  # a savepoint that commits with it
            Node.objects.filter(pk=node.pk).update(pool="in-a-savepoint")
    assert pool() == "in-a-savepoint"
    # A table the node list reads only through its serializer: the components (COPY on PostgreSQL
    # beyond bulk.FEW rows, one INSERT below).
    from gpusweep.db.bulk import FEW

    for names in (["cuda"], [f"extra{i}" for i in range(FEW + 1)]):
        before = client.get(NODES).json()["results"]
        with transaction.atomic():
            insert_rows(NodeComponent, ["node", "component", "version", "branch", "source", "updated_at"],
                        [(node.pk, name, "12.8", "", "", timezone.now()) for name in names])
        after = client.get(NODES).json()["results"]
        assert after != before
    assert {"cuda", f"extra{FEW}"} <= {c["component"] for r in after if r["id"] == node.pk for c in r["components"]}
    assert "cuda" in [c["component"] for r in after if r["id"] == node.pk for c in r["components"]]
    # A joined table of the exposure list: the CVEs of its range, through the m2m table.
    from advisories.models import CVE

    assert client.get(EXPOSURES).json()["results"][0]["cves"] == ["CVE-2025-0001"]
    fleet["range"].cves.add(CVE.objects.create(cve_id="CVE-2025-0002"))
    assert client.get(EXPOSURES).json()["results"][0]["cves"] == ["CVE-2025-0001", "CVE-2025-0002"]
    fleet["cluster"].name = "renamed"
    fleet["cluster"].save()
    assert {r["cluster"] for r in client.get(EXPOSURES).json()["results"]} == {"renamed"}


def test_a_rolled_back_write_is_never_served_and_an_open_transaction_reads_its_own(fleet):
    from inventory.models import Node

    client, _ = _token_client(_user("viewer", Role.VIEWER))
    committed, _ = _get(client, NODES)
    with pytest.raises(RuntimeError), transaction.atomic():
        Node.objects.filter(pk=fleet["nodes"][0].pk).update(pool="never")
        inside, ran = _get(client, NODES)
        assert ran > 0 and b"never" in inside  # its own write, not the cached answer
        raise RuntimeError("roll back")
    after, ran = _get(client, NODES)
    assert after == committed and b"never" not in after


def test_nothing_is_served_to_a_caller_refused_now_nor_across_roles(fleet):
    viewer = _user("viewer", Role.VIEWER)
    client, token_id = _token_client(viewer)
    _get(client, NODES)
    assert _get(client, NODES)[1] == 0  # cached
    nobody, _ = _token_client(_user("nobody"))
    assert nobody.get(NODES).status_code == 403
    assert Client().get(NODES, HTTP_ACCEPT="application/json").status_code in (401, 403)
    # The answer is keyed by roles: an admin's first request is its own miss.
    admin, _ = _token_client(_user("admin", Role.ADMIN))
    assert _get(admin, NODES)[1] > 0
    viewer.groups.clear()
    assert client.get(NODES).status_code == 403  # a role taken away counts at once
    viewer.groups.add(Group.objects.get(name=Role.VIEWER.value))
    assert client.get(NODES).status_code == 200
    viewer.is_active = False
    viewer.save()
    assert client.get(NODES).status_code == 401  # so does a user deactivated
    viewer.is_active = True
    viewer.save()
    assert client.get(NODES).status_code == 200
    tokens.revoke(viewer, token_id)
    assert client.get(NODES).status_code == 401  # and a revocation


def test_an_exposure_list_expires_when_a_deadline_it_shows_passes(fleet):
    from advisories.models import Exposure

    client, _ = _token_client(_user("viewer", Role.VIEWER))
    soon = timezone.now() + dt.timedelta(seconds=2.5)
    Exposure.objects.filter(node=fleet["nodes"][0]).update(deadline=soon)
    url = "/api/v1/advisories/exposures/?ordering=deadline&limit=100"

    def overdue() -> bool:
        return bool(client.get(url).json()["results"][0]["overdue"])

    assert overdue() is False and _get(client, url)[1] == 0
    time.sleep(max(0.0, (soon - timezone.now()).total_seconds()) + 0.3)
    assert overdue() is True
    # `overdue=` selects rows by the clock: never cached.
    assert _get(client, "/api/v1/advisories/exposures/?overdue=true")[1] > 0
    assert _get(client, "/api/v1/advisories/exposures/?overdue=true")[1] > 0


def test_the_overview_shows_a_write_at_once_and_each_user_their_roles(fleet, settings):
    from inventory.models import Node

    settings.GPUSWEEP_CONSOLE_FIGURES_S = 30  # its sections cached, as in production
    admin, viewer = _user("admin", Role.ADMIN), _user("viewer", Role.VIEWER)
    pages = {}
    for user in (admin, viewer):
        client = Client()
        client.force_login(user)
        pages[user.username] = client
    first = pages["admin"].get("/").content.decode()
    assert "Your roles: admin " in first and " 3 nodes " in first
    assert "Your roles: viewer " in pages["viewer"].get("/").content.decode()
    assert "Your roles: admin" in pages["admin"].get("/").content.decode()
    Node.objects.create(cluster=fleet["cluster"], name="gpu99")
    assert " 4 nodes " in pages["viewer"].get("/").content.decode()
    from campaigns.choices import CampaignStatus
    from campaigns.models import Campaign

    assert "night sweep" not in pages["viewer"].get("/").content.decode()
    Campaign.objects.create(name="night sweep", requested_by=admin, status=CampaignStatus.APPROVED)
    assert "night sweep" in pages["viewer"].get("/").content.decode()  # the active list too
    assert settings.GPUSWEEP_RESPONSE_CACHE_S == 300


# The statements of the old classifier's test, now counted by the database: (SQL, the tables it
# writes, PostgreSQL only). The fleet's rows exist, so every write touches rows (SQLite's triggers
# are per row). Maintenance statements write nothing.
STATEMENTS = [
    ('SELECT "inventory_node"."id" FROM "inventory_node" WHERE "id" > %s FOR UPDATE', set(), True),
    ("WITH x AS (SELECT 1) SELECT * FROM x", set(), False),
    ('SELECT * FROM (SELECT "id" FROM "inventory_node" LIMIT 1) a UNION SELECT * FROM '
     '(SELECT "id" FROM "inventory_cluster" LIMIT 1) b', set(), False),
    ("EXPLAIN ANALYZE UPDATE inventory_node SET pool = 'explained'", {"inventory_node"}, True),
    ("UPDATE advisories_exposure SET detected_version = detected_version WHERE node_id IN "
     "(SELECT id FROM inventory_node)", {"advisories_exposure"}, False),
    ("WITH moved AS (UPDATE inventory_node SET pool = 'a' RETURNING id) SELECT count(*) FROM moved",
     {"inventory_node"}, True),
    ("UPDATE inventory_node SET pool = 'b'; UPDATE inventory_cluster SET name = name", {"inventory_node",
                                                                                       "inventory_cluster"}, True),
    ('TRUNCATE "advisories_exposure" CASCADE', {"advisories_exposure"}, True),
    ("ANALYZE", set(), False),
    ("VACUUM", set(), False),
    ("SET work_mem = '8MB'", set(), True),
    ("RESET ALL", set(), True),
]
WATCHED = ["inventory_node", "inventory_cluster", "advisories_exposure"]


def _statements() -> list[tuple[str, set[str]]]:
    """STATEMENTS the configured database speaks (SQLite has no FOR UPDATE, SET, TRUNCATE or writable WITH)."""
    from django.conf import settings

    postgres = "postgresql" in settings.DATABASES["default"]["ENGINE"]
    return [(sql, written) for sql, written, postgres_only in STATEMENTS if postgres or not postgres_only]


@pytest.mark.parametrize("sql,written", _statements())
def test_a_statement_raises_the_generations_of_the_tables_it_writes_only(fleet, sql, written):
    before = datagen.current(WATCHED)
    with connection.cursor() as cursor:
        cursor.execute(sql, [0] if "%s" in sql else None)
    after = datagen.current(WATCHED)
    assert before is not None and after is not None and before.scope == after.scope
    raised = {name for name, old, new in zip([*WATCHED, datagen.ALL], before.values, after.values, strict=True)
              if new != old}
    assert raised == written


def test_a_rolled_back_write_raises_nothing_and_a_writing_transaction_reads_uncached(fleet):
    before = datagen.current(WATCHED)
    with pytest.raises(RuntimeError), transaction.atomic():
        if connection.vendor == "postgresql":  # it can tell that nothing is written yet (SQLite cannot)
            assert datagen.current(WATCHED) is not None
        with connection.cursor() as cursor:
            cursor.execute("UPDATE inventory_node SET pool = 'never'")
        assert datagen.current(WATCHED) is None
        raise RuntimeError("roll back")
    assert datagen.current(WATCHED) == before


def test_the_declared_tables_cover_every_table_a_list_reads(fleet, settings):
    """Each cached list names the tables it reads; a new join the list does not declare fails here,
    and so does a list reading a column beyond those of a part it declares (datagen.part)."""
    import re

    from advisories.api import ExposureViewSet
    from inventory.api import NodeViewSet

    client, _ = _token_client(_user("viewer", Role.VIEWER))
    read = re.compile(r'\b(?:FROM|JOIN)\s+"?(\w+)"?', re.I)
    for view, url in ((NodeViewSet, NODES + "&search=gpu&ordering=cluster__name&component=driver&branch=R570"),
                      (ExposureViewSet, EXPOSURES + "&search=5703&cluster=c1&severity=critical&advisory=nvidia-5703")):
        settings.GPUSWEEP_RESPONSE_CACHE_S = 0
        with CaptureQueriesContext(connection) as queries:
            assert client.get(url).status_code == 200
        listed = [q["sql"] for q in queries.captured_queries  # but authentication's
                  if "accounts_apitoken" not in q["sql"] and "auth_group" not in q["sql"]]
        tables = {t for sql in listed for t in read.findall(sql)}
        declared = {datagen.table_of(name) for name in view.cache_tables}
        assert tables <= declared, tables - declared
        for name in view.cache_tables:
            counted = datagen.columns_of(name)
            if counted is None:
                continue
            column = re.compile(rf'"{datagen.table_of(name)}"\."(\w+)"')
            read_columns = {c for sql in listed for c in column.findall(sql)}
            assert read_columns <= counted, (view, read_columns - counted)


def test_an_unreachable_cache_answers_uncached_and_writes_still_commit(fleet, settings, caplog):
    from inventory.models import Node

    client, _ = _token_client(_user("viewer", Role.VIEWER))
    settings.CACHES = {"default": {"BACKEND": "gpusweep.cache.RedisCache", "LOCATION": "redis://127.0.0.1:1/0"}}
    Node.objects.filter(pk=fleet["nodes"][0].pk).update(pool="while-away")  # commits (the database counts it)
    body, ran = _get(client, NODES)
    assert ran > 0 and b"while-away" in body


def test_a_token_check_is_kept_until_a_table_it_reads_is_written(shared_cache):
    from django.db import connection

    user = _user("viewer", Role.VIEWER)
    token, key = tokens.issue(user, "kept")
    assert tokens.user_for_key(key) is not None  # stamps last use: a write, so read again next time
    assert tokens.user_for_key(key) is not None
    with CaptureQueriesContext(connection) as queries:
        found = tokens.user_for_key(key)
    assert found is not None and found[0].pk == user.pk and queries.captured_queries == []
    assert "password" not in found[0].__dict__  # the password hash never goes to the cache
    assert tokens.user_for_key(key[:-1] + ("A" if key[-1] != "A" else "B")) is None
    tokens.revoke(user, token.pk)
    assert tokens.user_for_key(key) is None


def test_a_connection_without_an_alias_is_counted_too(shared_cache):
    """Django creates a test database through a temporary connection named nowhere ('__no_db__')."""
    from inventory.models import Cluster

    Cluster.objects.create(name="c1", kind="static")
    temporary = connection.copy(alias="__no_db__")
    before = datagen.current(["inventory_cluster"])
    try:
        with temporary.cursor() as cursor:
            cursor.execute("UPDATE inventory_cluster SET description = 'through a temporary connection'")
    finally:
        temporary.close()
    after = datagen.current(["inventory_cluster"])
    assert before is not None and after is not None and after.values[0] > before.values[0]


def test_the_overview_from_cached_sections_is_the_page_rendered_afresh(fleet, settings):
    import re

    settings.GPUSWEEP_CONSOLE_FIGURES_S = 30
    client = Client()
    client.force_login(_user("viewer", Role.VIEWER))
    token = re.compile(r'(csrfmiddlewaretoken" value="|"X-CSRFToken": ")[^"]+')

    def page() -> str:
        return token.sub(r"\1-", client.get("/").content.decode())

    fresh = page()  # renders and keeps the sections
    with CaptureQueriesContext(connection) as queries:
        again = page()
    assert again == fresh
    assert not [q for q in queries.captured_queries if "inventory_node" in q["sql"]]  # counts from the cache


# The rules of issue 24: whoever writes, however it reaches the database, the next cached request
# sees it. A process configured without the cache, psql and a second connection string are real.

def _need_postgres() -> None:
    need(connection.vendor == "postgresql", "needs PostgreSQL (a second process and psql reach the test "
         "database): DATABASE_URL=postgres://root@127.0.0.1:5432/<name> and CELERY_BROKER_URL=redis://...")


def _url(host: str | None = None) -> str:
    """The test database's URL (through `host` when given)."""
    s = connection.settings_dict
    login = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    return f"postgres://{login}@{host or s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def test_a_write_from_a_process_without_the_cache_shows_in_the_next_cached_request(fleet):
    from tests.helpers import clean_env, manage

    _need_postgres()
    client, _ = _token_client(_user("viewer", Role.VIEWER))
    revoked, revoked_id = _token_client(_user("leaver", Role.VIEWER))
    for each in (client, revoked):
        _get(each, NODES)
        assert _get(each, NODES)[1] == 0  # kept, and so is each token's check
    env = clean_env(DATABASE_URL=_url(), CELERY_BROKER_URL="memory://")
    env.pop("GPUSWEEP_CACHE_URL", None)  # a worker or command started without the cache
    node = fleet["nodes"][0]
    done = manage("shell", "-c", "from django.utils import timezone; from accounts.models import ApiToken; "
                  "from inventory.models import Node; "
                  f"Node.objects.filter(pk={node.pk}).update(pool='from-elsewhere'); "
                  f"ApiToken.objects.filter(pk={revoked_id}).update(revoked_at=timezone.now())", env=env)
    assert done.returncode == 0, done.stderr
    body, ran = _get(client, NODES)
    assert ran > 0 and b"from-elsewhere" in body
    assert revoked.get(NODES).status_code == 401


def test_a_token_revoked_or_a_role_taken_away_in_sql_is_refused_within_5_s(fleet):
    import psycopg

    from accounts.models import ApiToken
    from tests.helpers import wait_for

    _need_postgres()
    client, token_id = _token_client(_user("viewer", Role.VIEWER))
    demoted = _user("demoted", Role.VIEWER)
    other, _ = _token_client(demoted)
    for each in (client, other):
        _get(each, NODES)
        assert _get(each, NODES)[1] == 0
    with psycopg.connect(_url(), autocommit=True) as psql:  # as psql would, past every gpusweep process
        psql.execute(f"UPDATE {ApiToken._meta.db_table} SET revoked_at = now() WHERE id = %s", [token_id])
        psql.execute(f"DELETE FROM {User.groups.through._meta.db_table} WHERE user_id = %s", [demoted.pk])
    started = time.monotonic()
    assert wait_for(lambda: client.get(NODES).status_code == 401, timeout=5, interval=0.2)
    assert wait_for(lambda: other.get(NODES).status_code == 403, timeout=5, interval=0.2)
    assert time.monotonic() - started < 5


def test_two_connection_strings_to_one_database_share_invalidation(fleet):
    from django.db import connections

    _need_postgres()
    client, _ = _token_client(_user("viewer", Role.VIEWER))
    _get(client, NODES)
    assert _get(client, NODES)[1] == 0
    host = connection.settings_dict["HOST"] or "127.0.0.1"
    other = connection.copy(alias="by-another-name")
    other.settings_dict.update(HOST="localhost" if host != "localhost" else "127.0.0.1",
                               OPTIONS={**other.settings_dict.get("OPTIONS", {}), "application_name": "other"})
    try:
        assert datagen.scope(other) == datagen.scope(connections["default"])
        with other.cursor() as cursor:
            cursor.execute("UPDATE inventory_node SET pool = 'through-localhost' WHERE id = %s", [fleet["nodes"][0].pk])
    finally:
        other.close()
    body, ran = _get(client, NODES)
    assert ran > 0 and b"through-localhost" in body


def test_analyze_and_other_maintenance_invalidate_nothing(fleet):
    client, _ = _token_client(_user("viewer", Role.VIEWER))
    first, _ = _get(client, NODES)
    assert _get(client, NODES)[1] == 0
    maintenance = ["ANALYZE", "VACUUM"]
    if connection.vendor == "postgresql":
        maintenance += ["VACUUM ANALYZE inventory_node", "SET work_mem = '8MB'", "RESET ALL"]
    with connection.cursor() as cursor:
        for sql in maintenance:
            cursor.execute(sql)
    again, ran = _get(client, NODES)
    assert ran == 0 and again == first


def test_writers_of_one_table_never_wait_for_each_other_and_count_on_commit(fleet):
    import psycopg

    _need_postgres()
    first, second = (fleet["nodes"][0].pk, fleet["nodes"][1].pk)
    before = datagen.current(["inventory_node"])
    with psycopg.connect(_url()) as a, psycopg.connect(_url()) as b:
        a.execute("UPDATE inventory_node SET pool = 'a' WHERE id = %s", [first])  # open, not committed
        b.execute("SET lock_timeout = '2s'")
        b.execute("UPDATE inventory_node SET pool = 'b' WHERE id = %s", [second])  # would time out on one counter row
        b.commit()
        after_b = datagen.current(["inventory_node"])
        a.commit()
    after_a = datagen.current(["inventory_node"])
    assert before is not None and after_b is not None and after_a is not None
    assert before.values[0] < after_b.values[0] < after_a.values[0]


def test_a_session_is_read_from_the_cache_until_its_table_is_written_and_one_deleted_in_sql_ends(shared_cache):
    import psycopg
    from django.contrib.sessions.models import Session

    _need_postgres()
    client = Client()
    client.force_login(_user("viewer", Role.VIEWER))
    assert client.get("/").status_code == 200  # read from the database, then kept
    with CaptureQueriesContext(connection) as queries:
        assert client.get("/").status_code == 200
    assert not [q for q in queries.captured_queries if Session._meta.db_table in q["sql"]]
    with psycopg.connect(_url(), autocommit=True) as psql:
        psql.execute(f"DELETE FROM {Session._meta.db_table}")
    assert client.get("/").status_code == 302  # to the login page, at once


def test_threads_that_miss_one_answer_compute_it_once(fleet, monkeypatch):
    """Issue 33: gthread workers' threads all missed after a write and each computed the same list
    (the GIL shared 24 ways). Now one computes it and the others of the process wait and read it."""
    import threading

    from inventory.api import NodeViewSet

    _user_with_token = _user("reader", Role.VIEWER)
    _token, key = tokens.issue(_user_with_token, "threads")
    built: list[int] = []
    real = NodeViewSet.narrow_rows

    def slow(self, ids):  # type: ignore[no-untyped-def]
        built.append(len(ids))
        time.sleep(0.3)  # long enough for every thread to miss before the first one keeps it
        return real(self, ids)

    monkeypatch.setattr(NodeViewSet, "narrow_rows", slow)
    answers: list[tuple[int, bytes]] = []

    def read() -> None:
        client = Client(HTTP_AUTHORIZATION=f"Bearer {key}", HTTP_ACCEPT="application/json")
        response = client.get(NODES)
        answers.append((response.status_code, response.content))
        connection.close()

    threads = [threading.Thread(target=read) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [status for status, _body in answers] == [200] * 6 and len({body for _status, body in answers}) == 1
    assert len(built) == 1


@pytest.mark.parametrize("batched", [False, True], ids=["written-at-once", "flushed-from-redis"])
def test_heartbeats_and_campaign_steps_keep_the_exposure_answer_and_a_node_renamed_does_not(fleet, settings,
                                                                                            batched):
    """The exposure list reads of a node only its id, name and cluster (datagen.part NODE_IDENTITY).
    A short heartbeat (last_seen, heartbeat_at, its counter) and a campaign step's service state
    leave its answer cached, while the node list, which shows both, shows each at the next request;
    a node renamed (psql, here) counts for both."""
    from inventory import heartbeats, services
    from inventory.choices import ChangeSource, ServiceState

    settings.GPUSWEEP_HEARTBEAT_REDIS_URL = settings.CELERY_BROKER_URL if batched else ""
    client, _ = _token_client(_user("viewer", Role.VIEWER))
    node = fleet["nodes"][0]
    exposures, _ran = _get(client, EXPOSURES)
    _get(client, NODES)
    assert _get(client, EXPOSURES) == (exposures, 0)

    def shown(field: str) -> str:
        return next(r[field] for r in client.get(NODES).json()["results"] if r["id"] == node.pk)

    seen = timezone.now().replace(microsecond=0) + dt.timedelta(minutes=5)
    heartbeats.record_short(node.pk, time.time_ns() // 1000, 0, seen)  # above any counter kept in Redis
    heartbeats.flush()
    assert _get(client, EXPOSURES) == (exposures, 0)
    assert _get(client, NODES)[1] > 0
    assert dt.datetime.fromisoformat(shown("last_seen").replace("Z", "+00:00")) == seen
    services.set_service_state([node.pk], ServiceState.DRAINING, ChangeSource.CAMPAIGN)
    assert _get(client, EXPOSURES) == (exposures, 0)
    assert shown("service_state") == ServiceState.DRAINING
    with connection.cursor() as cursor:
        cursor.execute("UPDATE inventory_node SET name = 'renamed01' WHERE id = %s", [node.pk])
    body, ran = _get(client, EXPOSURES)
    assert ran > 0 and b"renamed01" in body
    assert shown("name") == "renamed01"


def test_a_part_counts_its_columns_and_rows_coming_and_going_only(fleet):
    """A part's trigger names its columns: an UPDATE of others (a column a migration adds later
    among them) leaves it, rows inserted or deleted raise it; the triggers dropped before every
    migrate and made again after it (datagen.drop_parts, ensure) count as before."""
    from inventory.models import NODE_IDENTITY, Node

    watched = [NODE_IDENTITY, "inventory_node"]

    def raised(sql: str, params: list[object] | None = None) -> set[str]:
        before = datagen.current(watched)
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
        after = datagen.current(watched)
        assert before is not None and after is not None
        return {name for name, old, new in zip(watched, before.values, after.values, strict=False) if new != old}

    node = fleet["nodes"][0]
    assert raised("UPDATE inventory_node SET last_seen = heartbeat_at, heartbeat_counter = 3, service_state = "
                  "'draining', pool = 'p'") == {"inventory_node"}
    assert raised("UPDATE inventory_node SET cluster_id = cluster_id") == {NODE_IDENTITY, "inventory_node"}
    before = datagen.current(watched)
    new = Node.objects.create(cluster=fleet["cluster"], name="new")
    after = datagen.current(watched)
    assert before is not None and after is not None
    assert all(a != b for a, b in zip(before.values[:2], after.values[:2], strict=True))  # not ALL, the last
    assert raised("DELETE FROM inventory_node WHERE id = %s", [new.pk]) == {NODE_IDENTITY, "inventory_node"}
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE inventory_node ADD COLUMN later_fact integer")
    try:
        datagen.drop_parts(connection)
        datagen.ensure(connection)
        assert raised("UPDATE inventory_node SET later_fact = 1") == {"inventory_node"}
        assert raised("UPDATE inventory_node SET name = name WHERE id = %s", [node.pk]) == {NODE_IDENTITY,
                                                                                            "inventory_node"}
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE inventory_node DROP COLUMN later_fact")


def test_a_stale_answer_is_served_within_the_bound_while_one_request_refreshes_it(fleet, settings, monkeypatch):
    """GPUSWEEP_ANSWER_STALE_S = 10: after a write the kept answer is still served (with its Age)
    until it is 5 s old, then the first request recomputes it while the others (another process
    holding the refresh marker, here) are served the kept one; past 10 s it is never served."""
    from gpusweep import responses
    from inventory.models import Node

    settings.GPUSWEEP_ANSWER_STALE_S = 10
    clock = [time.time()]
    monkeypatch.setattr(responses, "_clock", lambda: clock[0])
    client, _ = _token_client(_user("viewer", Role.VIEWER))
    node = fleet["nodes"][0]

    def pool() -> tuple[str, int, str | None]:
        with CaptureQueriesContext(connection) as queries:
            response = client.get(NODES)
        ran = [q for q in queries.captured_queries if "accounts_apitoken" not in q["sql"]
               and "auth_group" not in q["sql"]]
        row = next(r for r in response.json()["results"] if r["id"] == node.pk)
        return row["pool"], len(ran), response.headers.get("Age")

    assert pool()[:2] != ("", 0)
    started = time.time()  # just after the answer's computation began
    Node.objects.filter(pk=node.pk).update(pool="written")
    clock[0] = started + 3
    assert pool() == ("", 0, "3")  # stale, within the first half of the bound
    clock[0] = started + 7
    with monkeypatch.context() as held:  # another request holds the refresh marker
        held.setattr(responses.cache, "add", lambda *args, **kwargs: False)
        assert pool() == ("", 0, "7")
    shown, ran, age = pool()  # this one takes the marker and recomputes
    assert shown == "written" and ran > 0 and age is None
    Node.objects.filter(pk=node.pk).update(pool="later")
    clock[0] = time.time() + 10.5  # the answer just kept is past the bound
    shown, ran, age = pool()
    assert shown == "later" and ran > 0 and age is None
    settings.GPUSWEEP_ANSWER_STALE_S = 0  # the default: the next request shows a write
    Node.objects.filter(pk=node.pk).update(pool="at-once")
    assert pool()[0] == "at-once"
