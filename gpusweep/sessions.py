"""Sessions in the database, read through the shared cache while their table is unwritten.

Django's `cached_db` keeps a session in the cache until it expires, so a session deleted past it
(psql, `clearsessions`, a process without the cache) stays valid there. Here a cached copy is
keyed by the data generation of the session table (gpusweep.datagen), read before the database
is: any write of the table, from anywhere, sends the next request of every session to the
database once. Writes go to the database only (the next read caches them), so no copy is ever
kept under a generation read after its row was written. Without a shared cache, plain `db`.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.contrib.sessions.backends import db
from django.core.cache import caches

from gpusweep import datagen

log = logging.getLogger(__name__)


class SessionStore(db.SessionStore):
    cache_key_prefix = "gpusweep.session"

    def _cache_key(self) -> str | None:
        if not self.session_key or not datagen.enabled():
            return None
        found = datagen.current([self.model._meta.db_table])
        if found is None:
            return None
        return f"{self.cache_key_prefix}:{found.scope}:{'-'.join(map(str, found.values))}:{self.session_key}"

    def load(self) -> dict[str, Any]:
        key = self._cache_key()
        cache = caches[settings.SESSION_CACHE_ALIAS]
        try:
            data = cache.get(key) if key is not None else None
        except datagen.CACHE_ERRORS:
            log.warning("cache unreachable: session read from the database", exc_info=True)
            key = data = None
        if data is not None:
            return dict(data)
        row = self._get_session_from_db()  # type: ignore[attr-defined]  # private, not in django-stubs
        if row is None:
            return {}
        data = self.decode(row.session_data)
        if key is not None:
            try:
                cache.set(key, data, self.get_expiry_age(expiry=row.expire_date))
            except datagen.CACHE_ERRORS:
                log.warning("cache unreachable: session not kept", exc_info=True)
        return dict(data)
