"""The embedded broker publishes atomically: a consumer never reads half a message."""

from __future__ import annotations

import os
import uuid

from kombu import Connection

from console.lib.fs_broker import Transport


def connection(folder) -> Connection:
    return Connection(transport=Transport, transport_options={
        "data_folder_in": str(folder), "data_folder_out": str(folder), "control_folder": str(folder)})


def test_a_published_message_is_consumed_whole_and_once(tmp_path):
    # A queue name of its own: kombu keeps declared exchanges in class-level state, shared with
    # every other use of the transport in this process.
    with connection(tmp_path) as conn:
        queue = conn.SimpleQueue(f"q{uuid.uuid4().hex}")
        queue.put({"operation_id": "op_1", "payload": "x" * 100_000})
        assert queue.get(timeout=2).payload == {"operation_id": "op_1", "payload": "x" * 100_000}
        assert not [name for name in os.listdir(tmp_path) if name.endswith(".msg")]
        queue.close()


def test_a_message_still_being_written_is_invisible_to_consumers(tmp_path):
    (tmp_path / "1_abc.fast.msg.partial").write_bytes(b'{"half": ')
    with connection(tmp_path) as conn:
        channel = conn.default_channel
        try:
            channel._get("fast")
            raise AssertionError("a partial message was consumed")
        except Exception as exc:  # noqa: BLE001 - kombu raises Empty for an empty queue
            assert type(exc).__name__ == "Empty"
    assert (tmp_path / "1_abc.fast.msg.partial").exists()


def test_the_celery_app_uses_it_for_filesystem_urls():
    from kombu.transport import resolve_transport

    import console.celery  # noqa: F401 - registers the alias

    assert resolve_transport("filesystem") is Transport
