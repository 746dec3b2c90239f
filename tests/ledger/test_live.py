"""The live streams' fragments: what a page receives when an operation enters, moves within or
leaves the queue, and when the provider answers on the detail page."""

from __future__ import annotations

import pytest

from console import live
from console.models import Event
from ledger import services as ledger_services
from ledger.filters import QueueFilterSet
from ledger.live import read_queue_arg, render_operation, render_unknown
from ledger.models import OperationStatus
from ledger.tasks import query_provider
from tests.fixtures.support import make_operation, make_unknown

S = OperationStatus
pytestmark = pytest.mark.django_db


def events_since(event_id: int) -> list[Event]:
    return list(Event.objects.filter(id__gt=event_id).order_by("id"))


def test_an_operation_that_becomes_unknown_is_appended_to_the_queue(agent, support_user):
    operation = make_operation(agent, status=S.AUTHORIZED)
    cursor = live.latest_event_id()
    make_unknown(operation)
    html = render_unknown(support_user, events_since(cursor), "all")
    # Any stale copy goes, then the row is appended; table fragments come before the rest.
    assert html.index(f'hx-swap-oob="delete:#op-{operation.operation_id}"') < html.index(
        'hx-swap-oob="beforeend:#unknown-rows"')
    assert f'<tr id="op-{operation.operation_id}"' in html
    assert html.index("</tbody>") < html.index('id="queue-summary"')
    assert 'hx-swap-oob="true"' in html  # the counts and figures


def test_an_operation_that_leaves_the_queue_is_deleted(agent, support_user):
    operation = make_operation(agent)
    cursor = live.latest_event_id()
    ledger_services.operation_require_compensation(operation_id=operation.operation_id, actor="system:test",
                                                   reason="x")
    moved = render_unknown(support_user, events_since(cursor), "all")
    assert f'id="op-{operation.operation_id}-status" class="queue-row__status" hx-swap-oob="true"' in moved
    assert "delete:" not in moved  # still in the queue: updated in place

    other = make_operation(agent)
    cursor = live.latest_event_id()
    ledger_services.operation_confirm(operation_id=other.operation_id, receipt={"remote_id": "re_1"},
                                      actor="system:reconciler", reason="found")
    html = render_unknown(support_user, events_since(cursor), "all")
    assert f'<tbody hx-swap-oob="delete:#op-{other.operation_id}"></tbody>' in html
    assert "<tr" not in html


def test_a_new_operation_outside_the_pages_filters_or_tenants_is_not_inserted(agent, outsider_agent, support_user):
    operation = make_operation(agent, status=S.AUTHORIZED)
    theirs = make_operation(outsider_agent, status=S.AUTHORIZED)
    cursor = live.latest_event_id()
    make_unknown(operation)
    make_unknown(theirs)
    events = events_since(cursor)
    filtered = render_unknown(support_user, events, QueueFilterSet.of(tool="mail.send").live_arg())
    assert "<tr" not in filtered
    not_last_page = render_unknown(support_user, events, QueueFilterSet.of().live_arg(more="1"))
    assert "<tr" not in not_last_page
    html = render_unknown(support_user, events, "all")
    assert theirs.operation_id not in html


def test_the_queue_arg_round_trips_filters():
    values = {"status": "manual", "tool": "mail.send", "q": "call 1/2"}
    arg = QueueFilterSet.of(**values).live_arg(more="1")
    assert "/" not in arg and "?" not in arg and "%" not in arg
    filters, last_page = read_queue_arg(arg)
    assert (filters.active(), last_page) == (values, False)
    for unreadable in ("all", "", "%%%", "bm90IGEgcXVlcnk", "//8"):
        filters, last_page = read_queue_arg(unreadable)
        assert (filters.active(), last_page) == ({}, True)


def test_a_queue_arg_with_an_invalid_value_is_no_filter_at_all():
    # As on the page: a value that does not validate (here a status outside the queue) drops
    # every filter rather than show a page filtered by half of them.
    from base64 import urlsafe_b64encode

    arg = urlsafe_b64encode(b"status=confirmed&tool=mail.send").decode().rstrip("=")
    filters, _ = read_queue_arg(arg)
    assert filters.active() == {}
    filters, _ = read_queue_arg(urlsafe_b64encode(b"status=manual&tool=mail.send").decode().rstrip("="))
    assert filters.active() == {"status": "manual", "tool": "mail.send"}


def test_the_detail_stream_shows_the_providers_answer(agent, support_user, payments):
    operation = make_operation(agent)
    cursor = live.latest_event_id()
    query_provider(operation.operation_id, "user:support")
    html = render_operation(support_user, events_since(cursor), operation.operation_id)
    assert '<div id="op-provider" hx-swap-oob="true">' in html
    assert "answer__state" in html and ">absent<" in html
    assert 'id="op-evidence"' in html
    assert render_operation(support_user, events_since(cursor), "op_other") == ""


def test_the_detail_stream_tells_an_outsider_nothing(agent, outsider):
    operation = make_operation(agent)
    events = list(Event.objects.filter(entity_id=operation.operation_id))
    assert render_operation(outsider, events, operation.operation_id) == ""
