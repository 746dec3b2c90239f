"""The inbox's live stream over a websocket: sockets that see the same thing share one render,
and what differs per reviewer (their tier, their own approval) is never shared."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from django.test import Client

from ledger import decisions
from tests.console.test_live import (
    TIMEOUT,
    WebsocketCommunicator,
    application,
    cursor,
    session_headers,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
]


async def receive_naming(socket, approval_id: str, last_id: int | None = None) -> str:
    """The last fragment naming the request, once the cursor has reached `last_id` (if given).
    The rows come in one message, the counts and the cursor in the next."""
    naming, at = "", 0
    while not naming or (last_id is not None and at < last_id):
        html = await socket.receive_from(timeout=TIMEOUT)
        if approval_id in html:
            naming = html
        if 'id="live-cursor"' in html:
            at = cursor(html)
    return naming


def test_each_reviewer_sees_their_own_tier_and_their_own_approval(reviewer, senior, senior2, make_approval):
    from console.models import Event

    users = (reviewer, senior, senior2)
    headers = [session_headers(Client(), user) for user in users]
    start = Event.objects.order_by("-id").values_list("id", flat=True).first() or 0

    async def scenario():
        sockets = [WebsocketCommunicator(application(), "/ws/live/inbox/all/", headers=h) for h in headers]
        for socket in sockets:
            assert (await socket.connect(timeout=TIMEOUT))[0]
            await socket.send_json_to({"last_event_id": start})
        l4 = await database_sync_to_async(make_approval)(risk_tier=4)
        arrived = [await receive_naming(s, l4.approval_id) for s in sockets]
        await database_sync_to_async(decisions.approval_approve)(approval_id=l4.approval_id, reviewer=senior)
        last = await database_sync_to_async(lambda: Event.objects.order_by("-id").values_list("id", flat=True).first())()
        after_first = [await receive_naming(s, l4.approval_id, last) for s in sockets]
        for socket in sockets:
            await socket.disconnect()
        return arrived, after_first

    arrived, after_first = async_to_sync(scenario)()

    for_reviewer, for_senior, for_senior2 = arrived
    assert "needs L4 reviewer" in for_reviewer and ">Review<" not in for_reviewer
    assert "needs L4 reviewer" not in for_senior and ">Review<" in for_senior
    assert for_senior == for_senior2  # same scope: one render, the same HTML
    _, senior_sees, senior2_sees = after_first
    assert "you approved; needs another reviewer" in senior_sees
    assert "you approved" not in senior2_sees and ">Review<" in senior2_sees
