"""`manage.py worker_health` (exit code for a probe), `/healthz/workers` (the same verdict as
JSON, with METRICS_TOKEN as /metrics) and the dashboard's workers panel (staff and tenant admins)."""

from __future__ import annotations

import json
import re
import socket
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from console.models import Role
from ledger.models import Operation, OperationStatus, WorkerHeartbeat
from tests.conftest import make_user
from tests.factories import make_operation

pytestmark = pytest.mark.django_db
TOKEN = "s3cret"
AUTH = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}


@pytest.fixture(autouse=True)
def clocks(settings):
    settings.WORKER_HEARTBEAT_SECONDS = 5
    settings.WORKER_STALL_SECONDS = 30
    settings.METRICS_TOKEN = TOKEN


def heartbeat(name: str, *, progressed: float | None, seen: float = 1) -> None:
    now = timezone.now()
    WorkerHeartbeat.objects.create(name=name, pool="thread", queues=["fast", "slow"],
                                   started_at=now - timedelta(seconds=600), seen_at=now - timedelta(seconds=seen),
                                   progressed_at=None if progressed is None else now - timedelta(seconds=progressed))


@pytest.fixture
def waiting(agent) -> Operation:
    operation = make_operation(agent, status=OperationStatus.AUTHORIZED)
    Operation.objects.filter(pk=operation.pk).update(updated_at=timezone.now() - timedelta(seconds=90))
    return operation


def health(*args: str, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exited:
        call_command("worker_health", *args)
    return exited.value.code, capsys.readouterr().out


def test_it_exits_0_when_a_worker_progresses(waiting, capsys):
    heartbeat("w1@host", progressed=2)

    code, out = health(capsys=capsys)

    assert code == 0 and out.startswith("healthy: 1 due, oldest 90 s")
    assert "w1@host [thread; fast,slow] alive, last progress 2 s ago" in out


def test_it_exits_1_when_due_work_waits_and_no_worker_progresses(waiting, capsys):
    heartbeat("w1@host", progressed=120)

    code, out = health("--json", capsys=capsys)

    report = json.loads(out)
    assert code == 1 and report["stalled"] and report["exit_code"] == 1
    assert report["workers"][0]["name"] == "w1@host" and report["workers"][0]["stalled"]


def test_it_exits_2_when_no_worker_is_alive(db, capsys):
    heartbeat("w1@host", progressed=2, seen=120)

    assert health(capsys=capsys)[0] == 2


def test_one_named_worker_is_judged_alone_with_the_host_name_expanded(waiting, capsys):
    heartbeat(f"stuck@{socket.gethostname()}", progressed=None)
    heartbeat("busy@other", progressed=1)

    assert health(capsys=capsys)[0] == 0  # the product moves
    assert health("--worker", "stuck@%h", capsys=capsys)[0] == 1
    assert health("--worker", "busy@other", capsys=capsys)[0] == 0
    assert health("--worker", "nobody@host", capsys=capsys)[0] == 2


def test_the_json_endpoint_says_the_same_with_503_when_stalled(client, waiting):
    heartbeat("w1@host", progressed=120)

    response = client.get("/healthz/workers", **AUTH)

    assert response.status_code == 503
    body = response.json()
    assert body["stalled"] and not body["healthy"] and body["due_operations"] == 1


def test_the_json_endpoint_answers_200_when_moving(client, waiting):
    heartbeat("w1@host", progressed=1)

    response = client.get("/healthz/workers", **AUTH)

    assert response.status_code == 200 and response.json()["healthy"]


def test_without_a_token_set_the_json_endpoint_is_off_even_on_loopback(client, settings, db):
    settings.METRICS_TOKEN = ""

    response = client.get("/healthz/workers")

    assert response.status_code == 403
    assert response.json()["error"]["code"] == "forbidden"


def test_the_json_endpoint_needs_the_token_even_on_loopback(client, db):
    refused = client.get("/healthz/workers")
    allowed = client.get("/healthz/workers", **AUTH)

    assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthenticated"
    assert allowed.status_code == 503  # no worker at all


def test_the_json_endpoint_is_read_only(client, db):
    response = client.post("/healthz/workers")

    assert response.status_code == 405 and response.json()["error"]["code"] == "method_not_allowed"


def test_the_metrics_carry_the_oldest_due_operation_and_the_stall(client, waiting):
    heartbeat("w1@host", progressed=120)

    body = client.get("/metrics", **AUTH).content.decode()

    assert 'countersign_worker_progress_age_seconds{worker="w1@host"}' in body
    assert "countersign_stalled 1.0" in body
    assert "countersign_oldest_due_operation_seconds 9" in body  # 90 s and a little


def test_the_dashboard_shows_tenant_admins_the_workers_panel(client, tenant, waiting):
    heartbeat("w1@host", progressed=120)
    client.force_login(make_user("tenant-admin", tenant, Role.ADMIN))

    body = client.get("/dashboard/").content.decode()

    assert 'id="workers"' in body and "w1@host" in body and "stalled" in body
    assert re.search(r"Oldest due</dt><dd>9\d s", body)  # 90 s, and the page's own time


def test_the_dashboard_hides_the_workers_from_reviewers(client, tenant, waiting):
    heartbeat("w1@host", progressed=120)
    client.force_login(make_user("viewer", tenant, Role.REVIEWER, max_tier=3))

    body = client.get("/dashboard/").content.decode()

    assert 'id="workers"' not in body and "w1@host" not in body
