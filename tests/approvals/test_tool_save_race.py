"""A tool's configuration saved while a proposal of that tool commits, with real threads (one
connection each) against PostgreSQL, where row locks and deadlock detection are real.

A dispatching proposal holds the configuration generation share-locked until it commits, and its
commit checks the new operation's foreign key to the tool (a KEY SHARE lock on the tool's row).
Saving the tool changes the generation (a trigger), so it waits for the proposal; it must not
hold a lock on the tool's row that the proposal's commit then waits for."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections

from approvals.models import Tool
from approvals.tools import tool_save
from console.lib import sql
from ledger.proposals import call_propose
from tests.fixtures.api import refund, start_task

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="needs PostgreSQL row locks"),
    pytest.mark.timeout(60),
]


def waiting_for_a_lock(backends_before: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND wait_event_type = 'Lock'")
        return cursor.fetchone()[0] > backends_before


def test_saving_a_tool_while_a_proposal_of_it_commits_fails_neither(agent, monkeypatch):
    run = start_task(agent)
    written, commit = threading.Event(), threading.Event()
    original = sql.update_then_write

    def written_then_held(*args, **kwargs):
        result = original(*args, **kwargs)
        if threading.current_thread().name == "proposal":
            written.set()
            commit.wait(20)  # the transaction stays open, its locks held
        return result

    monkeypatch.setattr(sql, "update_then_write", written_then_held)
    errors: list[BaseException] = []

    def propose() -> None:
        call_propose(principal=agent, task_id=run.task_id, call_id="call-1", step_id="step-1",
                     tool_name="payments.refund", arguments=refund(), expected_version=run.version,
                     fencing_token=run.fencing_token, dispatch_here=True)

    def save() -> None:
        written.wait(20)
        tool = Tool.objects.get(name="payments.refund")
        tool.description = "Refunds, edited while a call of it was proposed."
        tool_save(tool=tool)

    def on_its_own_connection(body):
        def run() -> None:
            try:
                body()
            except BaseException as exc:  # noqa: BLE001 - asserted below
                errors.append(exc)
            finally:
                connections.close_all()
        return run

    threads = [threading.Thread(target=on_its_own_connection(propose), name="proposal"),
               threading.Thread(target=on_its_own_connection(save), name="save")]
    for thread in threads:
        thread.start()
    assert written.wait(20)
    deadline = time.monotonic() + 10
    while not waiting_for_a_lock(0) and time.monotonic() < deadline:  # the save waits for the proposal
        time.sleep(0.02)
    commit.set()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert Tool.objects.get(name="payments.refund").description.endswith("proposed.")
