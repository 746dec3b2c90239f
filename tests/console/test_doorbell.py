"""The live doorbell: one ring per committed transaction that wrote events, none before commit."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from console import live
from console.lib.transitions import record_event
from console.models import Event

pytestmark = pytest.mark.django_db


def test_a_transaction_with_two_events_rings_once_after_commit(monkeypatch, tenant,
                                                               django_capture_on_commit_callbacks):
    monkeypatch.setattr(live, "SERVING", True)
    with django_capture_on_commit_callbacks() as callbacks, transaction.atomic():
        for n in range(2):
            record_event(entity="task", entity_id=f"t{n}", tenant_id=tenant.id, kind=Event.Kind.CREATED,
                             to_status="queued", actor="a")
    assert [cb for cb in callbacks if cb is live._ring] == [live._ring]


def test_the_ring_reaches_a_socket_in_the_group():
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(live.DOORBELL_GROUP, channel)
    try:
        live._ring()
        assert async_to_sync(layer.receive)(channel) == {"type": "events.committed"}
    finally:
        async_to_sync(layer.group_discard)(live.DOORBELL_GROUP, channel)


def test_outside_the_server_an_in_process_layer_is_not_rung(monkeypatch, settings, tenant,
                                                            django_capture_on_commit_callbacks):
    monkeypatch.setattr(live, "SERVING", False)
    settings.CHANNEL_LAYER_URL = "memory://"
    with django_capture_on_commit_callbacks() as callbacks, transaction.atomic():
        record_event(entity="task", entity_id="t", tenant_id=tenant.id, kind=Event.Kind.CREATED, to_status="queued",
                     actor="a")
    assert live._ring not in callbacks
