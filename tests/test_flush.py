"""What a transactional test leaves behind. On PostgreSQL the suite empties the tables by DELETE
instead of TRUNCATE (tests/conftest.py); this holds it to what TRUNCATE did — every table empty,
the append-only event table and the counted approvals included, but for Django's post-migrate
rows and the policy generation's one row, with a new token (the gate's caches key on it, in this process and in the servers a test
starts) — and holds the tables' triggers in force afterwards."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction

from approvals.models import ApprovalRequest, PendingCount, PolicyGeneration
from console.models import Event
from tests.fixtures.api import call_body, refund

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's flush (SQLite's is Django's)")]


def propose_a_held_refund(api, task) -> None:
    held = api.post(f"/api/v1/tasks/{task.task_id}/calls", call_body(task, arguments=refund(250)), format="json")
    assert held.status_code == 201 and held.json()["status"] == "planned", held.content


def flush_as_after_a_test() -> None:
    """What a transactional test's teardown runs (django.test.TransactionTestCase)."""
    call_command("flush", verbosity=0, interactive=False, reset_sequences=False, allow_cascade=False,
                 inhibit_post_migrate=False)


def nonempty_tables() -> list[str]:
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    with connection.cursor() as cursor:
        found = []
        for table in tables:
            cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {connection.ops.quote_name(table)})")
            if cursor.fetchone()[0]:
                found.append(table)
    return found


def test_the_flush_empties_every_table_but_gives_the_policy_a_new_generation(api, running_task):
    propose_a_held_refund(api, running_task)
    assert Event.objects.exists() and ApprovalRequest.objects.exists() and PendingCount.objects.exists()
    generation = PolicyGeneration.objects.get().token
    content_types = sorted(ContentType.objects.values_list("app_label", "model"))
    permissions = Permission.objects.count()

    flush_as_after_a_test()

    # The content types and permissions are Django's post-migrate rows, written (or kept) the same.
    assert sorted(nonempty_tables()) == ["approvals_policygeneration", "auth_permission", "django_content_type"]
    assert sorted(ContentType.objects.values_list("app_label", "model")) == content_types
    assert Permission.objects.count() == permissions
    assert PolicyGeneration.objects.get().token != generation


def test_after_the_flush_the_event_table_is_append_only_again(api, running_task):
    propose_a_held_refund(api, running_task)
    event = Event.objects.values().order_by("id").first()

    flush_as_after_a_test()

    with connection.cursor() as cursor:
        cursor.execute("SHOW session_replication_role")
        assert cursor.fetchone()[0] == "origin"
    # The event written again (in a transaction rolled back: its tenant is gone) cannot be deleted.
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        Event.objects.bulk_create([Event(**event)])
        Event.objects.filter(pk=event["id"]).delete()


def test_the_flush_waits_for_a_sealer_instead_of_deadlocking_with_it():
    # Found by CI: a stack's beat ran the event log's sealer while a test's teardown flushed. The
    # sealer locks the chain heads in the chains' order; the flush deleted them in the table's
    # order: each waited for a head the other held, and PostgreSQL killed one.
    import threading

    from django.db import connections

    from console.lib.audit import SEAL_LOCK
    from console.lib.procs import wait_until
    from console.models import EventChainHead

    EventChainHead.objects.create(chain="tenant:2")  # first in the table, second in the chains' order
    EventChainHead.objects.create(chain="tenant:1")
    first_locked, flush_waits = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def sealer() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [SEAL_LOCK])
                lock_head = "SELECT chain FROM console_eventchainhead WHERE chain = %s FOR UPDATE"
                cursor.execute(lock_head, ["tenant:1"])
                first_locked.set()
                flush_waits.wait(30)
                cursor.execute(lock_head, ["tenant:2"])
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)
        finally:
            connections.close_all()

    def flusher() -> None:
        try:
            flush_as_after_a_test()
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=sealer)]
    threads[0].start()
    assert first_locked.wait(30)
    threads.append(threading.Thread(target=flusher))
    threads[1].start()

    def flush_is_waiting() -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()")
            return cursor.fetchone()[0] > 0

    wait_until(flush_is_waiting, timeout=30, what="the flush waiting for the sealer")
    flush_waits.set()
    for thread in threads:
        thread.join(60)
    assert failures == []
    assert not EventChainHead.objects.exists()
