"""The run page's live stream (runs/live.py): a page that was away catches up on what its run
did, in order, and never receives another run's changes."""

from __future__ import annotations

import re

import pytest
from asgiref.sync import async_to_sync

from console.models import Event
from ledger.decisions import lease_acquire
from runs.services import task_create, task_transition
from tests.console.test_live import (
    WebsocketCommunicator,
    application,
    receive_until,
    session_headers,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
]


def run_events(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'id="run-event-(\d+)"', html)]


def test_a_reconnecting_run_page_gets_the_transitions_it_missed_and_no_other_runs(client, reviewer, agent):
    headers = session_headers(client, reviewer)
    task = task_create(principal=agent, task_type="refund", goal="g")
    other = task_create(principal=agent, task_type="refund", goal="other")
    seen = Event.objects.order_by("-id").values_list("id", flat=True).first()
    # While the page is away: the run moves twice, and another run moves too.
    token = lease_acquire(task_id=task.task_id, owner="w", ttl_seconds=60).fencing_token
    version = task_transition(task_id=task.task_id, to="planning", expected_version=1, fencing_token=token,
                              actor="agent").version
    task_transition(task_id=task.task_id, to="running", expected_version=version, fencing_token=token, actor="agent")
    other_token = lease_acquire(task_id=other.task_id, owner="w", ttl_seconds=60).fencing_token
    task_transition(task_id=other.task_id, to="planning", expected_version=1, fencing_token=other_token, actor="agent")
    last = Event.objects.order_by("-id").values_list("id", flat=True).first()
    mine = list(Event.objects.filter(entity="task", entity_id=task.task_id, id__gt=seen).order_by("id")
                .values_list("id", flat=True))

    async def scenario():
        page = WebsocketCommunicator(application(), f"/ws/live/run/{task.task_id}/", headers=headers)
        assert (await page.connect(timeout=10))[0]
        await page.send_json_to({"last_event_id": seen})
        fragments = await receive_until(page, last)
        await page.disconnect()
        return fragments

    fragments = async_to_sync(scenario)()
    received = [i for html in fragments for i in run_events(html)]
    assert received == mine  # the lease events and both transitions, in commit order; not the other run's
    assert "running" in fragments[-1] and "version 3" in fragments[-1]
