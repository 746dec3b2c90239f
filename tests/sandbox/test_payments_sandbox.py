"""The payments sandbox, end to end over HTTP against a real provider process."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from sandbox import client
from sandbox.process import SandboxProcess

Unique = Callable[[str], str]


def refund_body(order_id: str, amount: Any = 25, currency: str = "EUR") -> dict[str, Any]:
    return {"order_id": order_id, "amount": amount, "currency": currency, "reason": "damaged"}


def post_refund(
    sandbox: SandboxProcess, key: str | None, body: dict[str, Any], *, timeout: float = 5.0
) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return httpx.post(f"{sandbox.base_url}/refunds", json=body, headers=headers, timeout=timeout)


def by_key(sandbox: SandboxProcess, key: str) -> httpx.Response:
    return httpx.get(f"{sandbox.base_url}/refunds/by-key/{key}", timeout=5.0)


def effect_count(sandbox: SandboxProcess, key: str) -> int:
    return len(client.effects(sandbox.base_url, key=key))


# -- idempotency semantics -------------------------------------------------------------------


def test_it_refuses_a_refund_without_an_idempotency_key(
    payments: SandboxProcess, unique: Unique
) -> None:
    order = unique("order")
    response = post_refund(payments, None, refund_body(order))
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "idempotency_key_missing"
    assert [e for e in client.effects(payments.base_url) if e["payload"]["order_id"] == order] == []


def test_it_refunds_once_and_replays_the_first_response(
    payments: SandboxProcess, unique: Unique
) -> None:
    key = unique("key")
    first = post_refund(payments, key, refund_body(unique("order")))
    second = post_refund(payments, key, refund_body(first.json()["order_id"]))

    assert first.status_code == 201
    assert first.json()["status"] == "succeeded"
    assert first.json()["id"].startswith("re_")
    assert first.json()["idempotency_key"] == key
    assert "Idempotent-Replayed" not in first.headers
    assert second.status_code == 201
    assert second.json() == first.json()
    assert second.headers["Idempotent-Replayed"] == "true"
    assert effect_count(payments, key) == 1


def test_it_accepts_the_drafts_quoted_key(payments: SandboxProcess, unique: Unique) -> None:
    key = unique("key")
    response = post_refund(payments, f'"{key}"', refund_body(unique("order")))
    assert response.status_code == 201
    assert response.json()["idempotency_key"] == key


def test_it_refuses_the_same_key_with_another_payload(
    payments: SandboxProcess, unique: Unique
) -> None:
    key, order = unique("key"), unique("order")
    assert post_refund(payments, key, refund_body(order, amount=10)).status_code == 201

    response = post_refund(payments, key, refund_body(order, amount=11))

    assert response.status_code == 422
    assert response.json()["error"]["code"] == "idempotency_key_reused"
    assert effect_count(payments, key) == 1


@pytest.mark.parametrize(
    "body",
    [
        refund_body("order-v", amount=0),
        refund_body("order-v", amount=-5),
        refund_body("order-v", currency="XXX"),
        {"order_id": "order-v", "amount": 5, "currency": "EUR"},
    ],
    ids=["zero-amount", "negative-amount", "unknown-currency", "missing-reason"],
)
def test_a_validation_error_is_a_known_failure_stored_for_the_key(
    payments: SandboxProcess, unique: Unique, body: dict[str, Any]
) -> None:
    key = unique("key")
    first = post_refund(payments, key, body)
    replay = post_refund(payments, key, body)

    assert first.status_code == 400
    assert first.json()["error"]["code"] == "invalid_request"
    assert replay.status_code == 400
    assert replay.json() == first.json()
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert effect_count(payments, key) == 0
    query = by_key(payments, key)
    assert query.status_code == 404
    assert query.json()["state"] == "failed"


def test_it_answers_409_while_the_first_request_is_in_flight(
    payments: SandboxProcess, unique: Unique, client_timeout: float
) -> None:
    key = unique("key")
    body = refund_body(unique("fault-timeout-before-commit"))
    first_outcome: list[BaseException] = []

    def first_request() -> None:
        try:
            post_refund(payments, key, body, timeout=client_timeout)
        except httpx.TimeoutException as exc:
            first_outcome.append(exc)

    thread = threading.Thread(target=first_request)
    thread.start()
    # The first request is held by the server: the key is known and in flight.
    client.wait_for(
        lambda: by_key(payments, key).json().get("state") == "processing",
        timeout=5,
        what="the first request to be in flight",
    )

    concurrent = post_refund(payments, key, body)
    thread.join()

    assert concurrent.status_code == 409
    assert concurrent.json()["error"]["code"] == "idempotency_key_in_use"
    assert len(first_outcome) == 1  # the client timed out: an unknown outcome for it
    # The server abandons the request after the hang: no effect, nothing in flight.
    final = client.wait_for(
        lambda: (r := by_key(payments, key)).status_code == 404 and r,
        timeout=5,
        what="the held request to be abandoned",
    )
    assert final.json() == {"found": False}
    assert effect_count(payments, key) == 0
    # Proven no effect and the old request stopped: a retry is safe and succeeds once.
    retry = post_refund(payments, key, body)
    assert retry.status_code == 201
    assert effect_count(payments, key) == 1


# -- faults on the first attempt ----------------------------------------------------------


def test_timeout_after_commit_commits_before_the_client_gives_up(
    payments: SandboxProcess, unique: Unique, client_timeout: float
) -> None:
    key = unique("key")
    body = refund_body(unique("fault-timeout-after-commit"))

    with pytest.raises(httpx.TimeoutException):
        post_refund(payments, key, body, timeout=client_timeout)

    # Committed although the client saw nothing; still held, so a concurrent retry gets 409.
    client.wait_for(lambda: effect_count(payments, key) == 1, timeout=5, what="the commit")
    assert post_refund(payments, key, body).status_code == 409
    query = by_key(payments, key)
    assert query.status_code == 200
    assert query.json()["state"] == "succeeded"
    # Retries answer 409 while the server still holds the first request, then replay it.
    retry = client.wait_for(
        lambda: (r := post_refund(payments, key, body)).status_code != 409 and r,
        timeout=5,
        what="the first request to finish",
    )
    assert retry.status_code == 201
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert retry.json() == query.json()["refund"]
    assert effect_count(payments, key) == 1


def test_429_says_when_to_retry_and_commits_nothing(
    payments: SandboxProcess, unique: Unique
) -> None:
    key = unique("key")
    body = refund_body(unique("fault-429"))

    first = post_refund(payments, key, body)

    assert first.status_code == 429
    assert first.headers["Retry-After"] == "1"
    assert effect_count(payments, key) == 0
    assert by_key(payments, key).status_code == 404
    second = post_refund(payments, key, body)
    assert second.status_code == 201
    assert "Idempotent-Replayed" not in second.headers
    assert effect_count(payments, key) == 1


def test_5xx_before_commit_commits_nothing(payments: SandboxProcess, unique: Unique) -> None:
    key = unique("key")
    body = refund_body(unique("fault-5xx-before-commit"))

    assert post_refund(payments, key, body).status_code == 503
    assert effect_count(payments, key) == 0
    assert post_refund(payments, key, body).status_code == 201
    assert effect_count(payments, key) == 1


def test_5xx_after_commit_commits_and_the_retry_replays(
    payments: SandboxProcess, unique: Unique
) -> None:
    key = unique("key")
    body = refund_body(unique("fault-5xx-after-commit"))

    assert post_refund(payments, key, body).status_code == 500
    assert effect_count(payments, key) == 1
    retry = post_refund(payments, key, body)
    assert retry.status_code == 201
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert effect_count(payments, key) == 1


def test_a_lost_reply_closes_the_connection_after_the_commit(
    payments: SandboxProcess, unique: Unique
) -> None:
    key = unique("key")
    body = refund_body(unique("fault-lost-reply"))

    with pytest.raises(httpx.RemoteProtocolError):
        post_refund(payments, key, body)

    assert effect_count(payments, key) == 1
    assert by_key(payments, key).json()["state"] == "succeeded"
    retry = post_refund(payments, key, body)
    assert retry.status_code == 201
    assert retry.headers["Idempotent-Replayed"] == "true"


def test_a_crash_kills_the_server_after_the_commit_and_it_comes_back(
    payments: SandboxProcess, unique: Unique
) -> None:
    key = unique("key")
    body = refund_body(unique("fault-crash"))
    before = client.wait_healthy(payments.base_url)

    with pytest.raises(httpx.TransportError):
        post_refund(payments, key, body)

    after = client.wait_healthy(payments.base_url)
    assert after["pid"] != before["pid"]
    assert after["supervisor_pid"] == before["supervisor_pid"] == payments.pid
    assert after["generation"] > before["generation"]
    assert effect_count(payments, key) == 1
    query = by_key(payments, key)
    assert query.status_code == 200
    assert query.json()["state"] == "succeeded"
    # "First attempt only" survived the restart: the retry is replayed, not crashed again.
    retry = post_refund(payments, key, body)
    assert retry.status_code == 201
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert retry.json()["id"] == query.json()["refund"]["id"]
    assert effect_count(payments, key) == 1


# -- faults on every attempt --------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "status", "effects"),
    [("429", 429, 0), ("5xx-before-commit", 503, 0), ("5xx-after-commit", 500, 1)],
)
def test_always_faults_strike_every_attempt(
    payments: SandboxProcess, unique: Unique, fault: str, status: int, effects: int
) -> None:
    key = unique("key")
    body = refund_body(unique(f"fault-{fault}-always"))

    statuses = [post_refund(payments, key, body).status_code for _ in range(3)]

    assert statuses == [status] * 3
    assert effect_count(payments, key) == effects


def test_crash_always_crashes_every_attempt_but_commits_once(
    payments: SandboxProcess, unique: Unique
) -> None:
    key = unique("key")
    body = refund_body(unique("fault-crash-always"))

    for _ in range(2):
        client.wait_healthy(payments.base_url)
        with pytest.raises(httpx.TransportError):
            post_refund(payments, key, body)

    client.wait_healthy(payments.base_url)
    assert effect_count(payments, key) == 1
    assert by_key(payments, key).json()["state"] == "succeeded"


def test_lost_reply_always_loses_every_reply(payments: SandboxProcess, unique: Unique) -> None:
    key = unique("key")
    body = refund_body(unique("fault-lost-reply-always"))

    for _ in range(2):
        with pytest.raises(httpx.RemoteProtocolError):
            post_refund(payments, key, body)

    assert effect_count(payments, key) == 1


def test_opaque_commits_loses_the_reply_and_every_query_fails(
    payments: SandboxProcess, unique: Unique
) -> None:
    key = unique("key")
    body = refund_body(unique("fault-opaque"))

    for _ in range(2):
        with pytest.raises(httpx.RemoteProtocolError):
            post_refund(payments, key, body)

    effects = client.effects(payments.base_url, key=key)
    assert len(effects) == 1  # the observer sees it; the provider's API never admits it
    assert by_key(payments, key).status_code == 500
    assert by_key(payments, key).status_code == 500
    refund_id = effects[0]["payload"]["id"]
    assert httpx.get(f"{payments.base_url}/refunds/{refund_id}").status_code == 500


# -- queries and lookups ------------------------------------------------------------------


def test_a_refund_can_be_found_by_key_and_by_id(payments: SandboxProcess, unique: Unique) -> None:
    key = unique("key:with/odd chars")
    refund = post_refund(payments, key, refund_body(unique("order"))).json()

    found = httpx.get(f"{payments.base_url}/refunds/by-key/{quote(key, safe='')}")
    by_id = httpx.get(f"{payments.base_url}/refunds/{refund['id']}")

    assert found.status_code == 200
    assert found.json() == {"found": True, "state": "succeeded", "refund": refund}
    assert by_id.status_code == 200
    assert by_id.json() == refund


def test_unknown_keys_and_ids_are_not_found(payments: SandboxProcess, unique: Unique) -> None:
    response = by_key(payments, unique("never-used"))
    assert response.status_code == 404
    assert response.json() == {"found": False}
    assert httpx.get(f"{payments.base_url}/refunds/re_nope").status_code == 404


def test_orders_are_deterministic_and_missing_ones_are_404(payments: SandboxProcess) -> None:
    first = httpx.get(f"{payments.base_url}/orders/ord-1001")
    again = httpx.get(f"{payments.base_url}/orders/ord-1001")
    other = httpx.get(f"{payments.base_url}/orders/ord-1002")
    missing = httpx.get(f"{payments.base_url}/orders/missing-1")

    assert first.status_code == 200
    assert first.json() == again.json()
    assert first.json() != other.json()
    assert set(first.json()) == {"order_id", "amount", "currency", "status", "customer_email"}
    assert first.json()["order_id"] == "ord-1001"
    assert first.json()["amount"] > 0
    assert missing.status_code == 404


def test_effects_are_filtered_by_key(payments: SandboxProcess, unique: Unique) -> None:
    key_a, key_b = unique("key"), unique("key")
    post_refund(payments, key_a, refund_body(unique("order")))
    post_refund(payments, key_b, refund_body(unique("order")))

    only_a = client.effects(payments.base_url, key=key_a)
    everything = client.effects(payments.base_url)

    assert [e["key"] for e in only_a] == [key_a]
    assert {key_a, key_b} <= {e["key"] for e in everything}
    assert set(only_a[0]) >= {"key", "payload", "at"}


# -- service-wide control -----------------------------------------------------------------


def test_a_service_fault_strikes_the_next_n_writes(
    payments: SandboxProcess, unique: Unique, no_service_faults: None
) -> None:
    state = client.set_fault(payments.base_url, "fault-429", count=2)
    assert state["fault"] == "fault-429"
    assert state["remaining"] == 2

    statuses = [
        post_refund(payments, unique("key"), refund_body(unique("order"))).status_code
        for _ in range(3)
    ]

    assert statuses == [429, 429, 201]
    assert client.get_faults(payments.base_url)["fault"] is None


def test_a_service_fault_can_target_reads(
    payments: SandboxProcess, unique: Unique, no_service_faults: None
) -> None:
    client.set_fault(payments.base_url, "5xx-before-commit", count=1, target="reads")

    assert httpx.get(f"{payments.base_url}/orders/ord-1").status_code == 503
    assert httpx.get(f"{payments.base_url}/orders/ord-1").status_code == 200


def test_unknown_service_faults_are_refused(payments: SandboxProcess) -> None:
    response = httpx.post(f"{payments.base_url}/_control/faults", json={"fault": "fault-nope"})
    assert response.status_code == 400


def test_latency_slows_every_business_request(
    payments: SandboxProcess, no_service_faults: None
) -> None:
    client.set_latency(payments.base_url, 300)

    started = time.monotonic()
    response = httpx.get(f"{payments.base_url}/orders/ord-1")
    elapsed = time.monotonic() - started

    assert response.status_code == 200
    assert elapsed >= 0.3
    assert client.get_faults(payments.base_url)["latency_ms"] == 300


def test_reset_forgets_everything(payments: SandboxProcess, unique: Unique) -> None:
    key = unique("key")
    post_refund(payments, key, refund_body(unique("order")))
    client.set_fault(payments.base_url, "429")

    client.reset(payments.base_url)

    assert client.effects(payments.base_url) == []
    assert client.get_faults(payments.base_url)["fault"] is None
    assert by_key(payments, key).status_code == 404


# -- its own OpenAPI document ------------------------------------------------------------------


def test_it_serves_an_openapi_document_whose_every_operation_it_answers(payments: SandboxProcess, unique: Unique):
    document = httpx.get(f"{payments.base_url}/openapi.json", timeout=5.0).json()
    assert document["openapi"].startswith("3.1")
    key = unique("oas")
    created = post_refund(payments, key, refund_body(unique("ord")))
    samples = {"key": key, "refund_id": created.json()["id"], "order_id": unique("ord")}
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method == "post":
                continue  # the refund, posted above
            url = payments.base_url + path.format(**samples)
            response = httpx.request(method.upper(), url, timeout=5.0)
            assert str(response.status_code) in operation["responses"], (operation["operationId"], response.text)
            assert response.status_code == 200, operation["operationId"]
    assert str(created.status_code) in document["paths"]["/refunds"]["post"]["responses"]
