"""The embedded default broker: kombu's filesystem transport, with messages written atomically.

kombu's own ``_put`` opens the final file name and writes into it, so a worker listing the folder
can read a message half written and die on the JSONDecodeError (issue 28; kombu issue #1802).
Here a message is written under a name no reader takes (``...msg.part``), fsynced, then renamed
into place: a reader sees a whole message or none. ``register()`` makes ``filesystem://`` name
this transport; gpusweep.celery calls it before Celery reads its settings.
"""

from __future__ import annotations

import logging
import os
import uuid
from queue import Empty
from time import monotonic
from typing import Any

import kombu.transport
from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

log = logging.getLogger(__name__)


class Channel(filesystem.Channel):
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = final + ".part"  # its suffix is not "<queue>.msg": _get skips it
        try:
            with open(partial, "wb", buffering=0) as handle:
                handle.write(str_to_bytes(dumps(payload)))
                os.fsync(handle.fileno())
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc

    def _get(self, queue: str, timeout: float | None = None) -> Any:
        try:
            return super()._get(queue)
        except ValueError as exc:  # a message left half written by an older writer: skipped, never fatal
            log.error("broker: dropped an unreadable message on queue %s: %s", queue, exc)
            raise Empty() from exc


class Transport(filesystem.Transport):
    Channel = Channel


def register() -> None:
    kombu.transport.TRANSPORT_ALIASES["filesystem"] = "gpusweep.broker:Transport"
