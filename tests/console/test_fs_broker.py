"""The embedded broker publishes atomically (a consumer never reads half a message) and rings
its consumers without losing a message when nobody listens. Real workers woken by it:
tests/console/test_fs_broker_wake.py."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import socket
import tempfile
import threading
import uuid
from pathlib import Path

import pytest
from kombu import Connection

from console.lib.fs_broker import WAKE_FOLDER, Transport, bell_folder
from console.lib.procs import wait_until
from tests.console.test_fs_broker_wake import waiting_on_bells


@pytest.fixture
def short_folder():
    # A socket's path holds at most 107 bytes, and pytest's tmp_path under xdist is long enough
    # to push a bell past it (the consumer then polls, with a warning, and these tests would
    # measure that fallback instead of the bell).
    folder = Path(tempfile.mkdtemp(prefix="fsb-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def connection(folder, **options) -> Connection:
    return Connection(transport=Transport, transport_options={
        "data_folder_in": str(folder), "data_folder_out": str(folder), "control_folder": str(folder), **options})


def test_a_published_message_is_consumed_whole_and_once(short_folder):
    # A queue name of its own: kombu keeps declared exchanges in class-level state, shared with
    # every other use of the transport in this process.
    with connection(short_folder) as conn:
        queue = conn.SimpleQueue(f"q{uuid.uuid4().hex}")
        queue.put({"operation_id": "op_1", "payload": "x" * 100_000})
        assert queue.get(timeout=2).payload == {"operation_id": "op_1", "payload": "x" * 100_000}
        assert not [name for name in os.listdir(short_folder) if name.endswith(".msg")]
        queue.close()


def test_a_message_still_being_written_is_invisible_to_consumers(short_folder):
    (short_folder / "1_abc.fast.msg.partial").write_bytes(b'{"half": ')
    with connection(short_folder) as conn:
        channel = conn.default_channel
        try:
            channel._get("fast")
            raise AssertionError("a partial message was consumed")
        except Exception as exc:  # noqa: BLE001 - kombu raises Empty for an empty queue
            assert type(exc).__name__ == "Empty"
    assert (short_folder / "1_abc.fast.msg.partial").exists()


def test_the_celery_app_uses_it_for_filesystem_urls():
    from kombu.transport import resolve_transport

    import console.celery  # noqa: F401 - registers the alias

    assert resolve_transport("filesystem") is Transport


def test_a_message_published_with_nobody_listening_waits_for_the_next_consumer(short_folder):
    name = f"q{uuid.uuid4().hex}"
    with connection(short_folder) as conn:
        conn.SimpleQueue(name).put({"n": 1})  # no bell bound yet: nothing to ring, nothing raised
    assert not (short_folder / WAKE_FOLDER).exists()
    with connection(short_folder) as conn:
        queue = conn.SimpleQueue(name)
        assert queue.get(timeout=5).payload == {"n": 1}
        queue.close()


def bell_of_another_consumer(folder: Path, queue: str) -> tuple[Path, socket.socket]:
    path = Path(bell_folder(str(folder), queue)) / "1-other"
    path.parent.mkdir(parents=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    return path, sock


def test_a_stale_socket_left_by_a_killed_consumer_is_removed_and_loses_nothing(short_folder):
    name = f"q{uuid.uuid4().hex}"
    path, dead = bell_of_another_consumer(short_folder, name)
    dead.close()  # as a SIGKILL leaves it: the file stays, nobody is bound
    with connection(short_folder) as conn:
        queue = conn.SimpleQueue(name)
        queue.put({"n": 1})
        assert not path.exists()
        assert queue.get(timeout=5).payload == {"n": 1}
        queue.close()


def test_a_publisher_never_blocks_on_a_consumer_that_stopped_reading(short_folder):
    name = f"q{uuid.uuid4().hex}"
    _path, busy = bell_of_another_consumer(short_folder, name)
    with busy:
        with connection(short_folder) as conn:
            queue = conn.SimpleQueue(name)
            # More datagrams than a socket's queue holds (net.unix.max_dgram_qlen, 10 or 512).
            for n in range(600):
                queue.put({"n": n})
            assert len([entry for entry in os.listdir(short_folder) if entry.endswith(f".{name}.msg")]) == 600
            queue.close()


def test_a_forked_child_closing_its_copy_of_the_consumer_keeps_the_parents_bell(short_folder):
    # A prefork pool's children inherit the consumer's sockets; they never consume, and
    # whatever they close, the parent's bell stays bound and in place.
    name = f"q{uuid.uuid4().hex}"
    with connection(short_folder, fallback_interval=60) as conn:
        queue = conn.SimpleQueue(name)
        got = []
        waiter = threading.Thread(target=lambda: got.append(queue.get(timeout=30).payload))
        waiter.start()
        wait_until(lambda: waiting_on_bells(os.getpid(), waiter.native_id), timeout=30, what="the consumer to wait")
        bell = queue.consumer.channel.bells[name]
        child = os.fork()
        if child == 0:
            try:
                queue.consumer.channel.close()
            finally:
                os._exit(0)
        assert os.waitpid(child, 0)[1] == 0
        assert os.path.exists(bell.path)
        with connection(short_folder) as publisher:
            publisher.SimpleQueue(name).put({"n": 1})
        waiter.join(timeout=40)
        assert got == [{"n": 1}]
        queue.close()


def test_a_binding_that_meets_an_exchange_file_another_process_just_created_is_kept(short_folder):
    """Kombu creates an exchange's file (truncated, empty), then locks and writes it: a second
    worker starting at that moment found the file, read nothing and died on the JSON (a chaos
    stack's second worker, twice in CI). The moment itself, as kombu's own transport leaves it:
    an empty file there."""
    exchange = f"x{uuid.uuid4().hex}"
    (short_folder / f"{exchange}.exchange").write_bytes(b"")
    with connection(short_folder) as conn:
        conn.default_channel._queue_bind(exchange, "fast", None, "fast")

    assert json.loads((short_folder / f"{exchange}.exchange").read_text()) == [["fast", "", "fast"]]


def test_workers_binding_queues_at_once_keep_every_binding(short_folder):
    """Real processes, released together, each binding its own queue to one exchange."""
    exchange = f"x{uuid.uuid4().hex}"
    queues = [f"q{index}" for index in range(6)]
    start = multiprocessing.get_context("fork").Barrier(len(queues))
    processes = [multiprocessing.get_context("fork").Process(
        target=_bind_after, args=(start, str(short_folder), exchange, queue)) for queue in queues]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=30)

    assert [process.exitcode for process in processes] == [0] * len(queues)
    bound = json.loads((short_folder / f"{exchange}.exchange").read_text())
    assert sorted(queue for _, _, queue in bound) == queues


def _bind_after(start, folder: str, exchange: str, queue: str) -> None:
    with connection(folder) as conn:
        channel = conn.default_channel
        start.wait(timeout=20)
        channel._queue_bind(exchange, queue, None, queue)
