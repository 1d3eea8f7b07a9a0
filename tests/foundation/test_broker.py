"""Issue 28 item 8: the embedded broker writes each message atomically and survives a bad one."""

from __future__ import annotations

from pathlib import Path

from kombu import Connection

import gpusweep.celery  # noqa: F401  (registers the transport)
from gpusweep import broker


def _connection(folder: Path) -> Connection:
    return Connection("filesystem://", transport_options={"data_folder_in": str(folder),
                                                          "data_folder_out": str(folder),
                                                          "control_folder": str(folder / "control")})


def test_filesystem_names_the_atomic_transport_and_a_half_written_message_is_skipped(tmp_path):
    with _connection(tmp_path) as connection:
        assert isinstance(connection.transport, broker.Transport)
        queue = connection.SimpleQueue("q")
        (tmp_path / "1_torn.q.msg").write_bytes(b'{"body": "eyJ')  # what a torn write left behind
        queue.put({"n": 1})
        assert not list(tmp_path.glob("*.part"))  # written under another name, then renamed whole
        message = queue.get(timeout=2)  # the torn one is dropped and logged, never fatal
        assert message.payload == {"n": 1}
        message.ack()
        queue.close()
