"""countersign.webhooks.verify: what the reference implementation (`standardwebhooks`) signs, the
client accepts; a changed body, another secret, a stale or future timestamp, a missing header
are refused."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import pytest
import standardwebhooks
from countersign.webhooks import WebhookVerificationError, event_id, verify

from console.lib.standard_webhooks import headers as sign_headers
from console.lib.standard_webhooks import new_secret

SECRET = new_secret()
BODY = json.dumps({"type": "call.decided", "data": {"call_id": "c-1"}}).encode()


def reference_headers(secret: str, *, msg_id: str = "msg_1", at: float | None = None) -> dict[str, str]:
    at = time.time() if at is None else at
    signature = standardwebhooks.Webhook(secret).sign(msg_id, datetime.fromtimestamp(at, tz=UTC), BODY.decode())
    return {"Webhook-Id": msg_id, "Webhook-Timestamp": str(int(at)), "Webhook-Signature": signature}


def test_a_message_the_reference_implementation_signed_verifies():
    headers = reference_headers(SECRET)

    assert verify(headers, BODY, SECRET) == json.loads(BODY)
    assert event_id(headers) == "msg_1"


def test_the_servers_signature_equals_the_reference_implementations():
    at = int(time.time())

    ours = sign_headers(SECRET, msg_id="msg_1", timestamp=at, body=BODY)

    assert ours["webhook-signature"] == reference_headers(SECRET, at=at)["Webhook-Signature"]


def test_one_matching_signature_among_several_is_enough():
    headers = reference_headers(SECRET)
    headers["Webhook-Signature"] = "v1,AAAA v2,whatever " + headers["Webhook-Signature"]

    assert verify(headers, BODY, SECRET)["type"] == "call.decided"


@pytest.mark.parametrize(("change", "message"), [
    (lambda h, b: (h, b.replace(b"c-1", b"c-2")), "no matching signature"),
    (lambda h, b: ({**h, "Webhook-Id": "msg_2"}, b), "no matching signature"),
    (lambda h, b: (reference_headers(new_secret()), b), "no matching signature"),
    (lambda h, b: (reference_headers(SECRET, at=time.time() - 301), b), "too old or too new"),
    (lambda h, b: (reference_headers(SECRET, at=time.time() + 301), b), "too old or too new"),
    (lambda h, b: ({k: v for k, v in h.items() if k != "Webhook-Signature"}, b), "missing header webhook-signature"),
    (lambda h, b: ({**h, "Webhook-Timestamp": "soon"}, b), "not a number"),
])
def test_anything_else_is_refused(change, message):
    headers, body = change(reference_headers(SECRET), BODY)

    with pytest.raises(WebhookVerificationError, match=message):
        verify(headers, body, SECRET)
