"""The dashboard's workers panel in a real browser: a tenant admin sees a stalled worker, the
due operations and the oldest one's age."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from console.models import Role
from ledger.models import Operation, OperationStatus, WorkerHeartbeat
from tests.browser.test_shell import log_in
from tests.conftest import make_user
from tests.factories import make_operation

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_tenant_admin_sees_the_stalled_worker_and_the_oldest_due_operation(live_server, page, screenshot,
                                                                            tenant, agent):
    operation = make_operation(agent, status=OperationStatus.AUTHORIZED)
    now = timezone.now()
    Operation.objects.filter(pk=operation.pk).update(updated_at=now - timedelta(seconds=300))
    WorkerHeartbeat.objects.create(name="fast@host-1", pool="thread", queues=["fast"], seen_at=now,
                                   started_at=now - timedelta(hours=1), progressed_at=now - timedelta(seconds=290),
                                   tasks_done=1234)
    WorkerHeartbeat.objects.create(name="slow@host-2", pool="thread", queues=["slow"],
                                   seen_at=now - timedelta(minutes=10), started_at=now - timedelta(hours=2))
    make_user("admin1", tenant, Role.ADMIN)

    log_in(page, live_server.url, "admin1")

    panel = page.locator("#workers")
    expect(panel.get_by_role("heading", name="Workers")).to_be_visible()
    expect(panel.get_by_role("row", name="fast@host-1")).to_contain_text("stalled")
    expect(panel.get_by_role("row", name="slow@host-2")).to_contain_text("gone")
    expect(panel).to_contain_text("Oldest due")
    panel.scroll_into_view_if_needed()
    screenshot(page, "dashboard-workers-stalled")
