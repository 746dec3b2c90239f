"""The latency benchmark's pipeline floor (bench/pipeline_floor.py) stands for the product's
path at its least: a call is answered only after every hop the product makes — committed,
handed through the broker to a worker process, read from the provider, its receipt committed,
rung back — or the floor would be cheaper than the path it is read against. Its dispatch in the
request (`/call-here`) commits the call already claimed, then its receipt, around the provider's read."""

from __future__ import annotations

import json
import os

import httpx
import pytest
from django.db import connection

from bench.pipeline_floor import TABLE, Pipeline

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql" or not os.environ.get("CELERY_BROKER_URL", "").startswith("redis"),
                       reason="the pipeline floor runs on PostgreSQL and Redis"),
]


def database_url() -> str:
    s = connection.settings_dict
    return f"postgresql://{s['USER']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def test_a_call_through_the_floor_is_answered_after_its_receipt_with_the_providers_answer(payments_sandbox):
    pipeline = Pipeline(database_url(), os.environ["CELERY_BROKER_URL"], payments_sandbox.base_url).start()
    try:
        answers = [httpx.post(f"{pipeline.url}/call", json={"order_id": f"ord-floor-{i}"}, timeout=30).json()
                   for i in range(3)]
    finally:
        pipeline.stop()

    direct = httpx.get(f"{payments_sandbox.base_url}/orders/ord-floor-0", timeout=5).text
    assert [answer["status"] for answer in answers] == ["confirmed"] * 3
    assert answers[0]["result"] == direct  # the worker's provider read, carried back
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT status, count(*) FROM {TABLE} GROUP BY status")
        assert cursor.fetchall() == [("confirmed", 3)]


def test_a_call_dispatched_in_the_floors_request_commits_every_step_and_carries_the_answer(payments_sandbox):
    pipeline = Pipeline(database_url(), os.environ["CELERY_BROKER_URL"], payments_sandbox.base_url).start()
    try:
        answer = httpx.post(f"{pipeline.url}/call-here", json={"order_id": "ord-floor-here"}, timeout=30).json()
    finally:
        pipeline.stop()

    assert answer["status"] == "confirmed"
    assert answer["result"] == httpx.get(f"{payments_sandbox.base_url}/orders/ord-floor-here", timeout=5).text
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT status, result FROM {TABLE} WHERE order_id = 'ord-floor-here'")
        assert cursor.fetchall() == [("confirmed", answer["result"])]


def test_a_refund_dispatched_in_the_floors_request_pays_once_and_commits_its_receipt(payments_sandbox):
    # The whole-system bench's floor (bench/system.py): the write an agent's call stands for, with
    # the order as its idempotency key, so the sandbox's effect count checks it as the product's.
    from sandbox.client import effects

    pipeline = Pipeline(database_url(), os.environ["CELERY_BROKER_URL"], payments_sandbox.base_url).start()
    try:
        answer = httpx.post(f"{pipeline.url}/refund-here",
                            json={"order_id": "ord-floor-refund", "amount": 1.0, "currency": "EUR", "reason": "bench"},
                            timeout=30).json()
    finally:
        pipeline.stop()

    assert answer["status"] == "confirmed"
    paid = effects(payments_sandbox.base_url, key="ord-floor-refund", timeout=10)
    assert len(paid) == 1
    assert json.loads(answer["result"])["id"] == paid[0]["payload"]["id"]  # the provider's answer, carried back
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT status FROM {TABLE} WHERE order_id = 'ord-floor-refund'")
        assert cursor.fetchall() == [("confirmed",)]
