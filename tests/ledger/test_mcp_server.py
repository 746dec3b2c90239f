"""ledger/mcp_server.py's pure parts: names, call IDs, and how a call's answer becomes a tool
result. The server itself is tested end to end with the SDK's client (tests/e2e/test_mcp_server.py)."""

from __future__ import annotations

from ledger.mcp_server import WAIT_TOOL, _call_id, _result, mcp_name
from ledger.proposals import MAX_CALL_ID


def answer(**fields) -> dict:
    return {"call_id": "mcp-1", "status": "planned", "final": False, "reasons": [], "result": None,
            "receipt": None, "last_error": "", "approval": None,
            "decision": {"outcome": "awaiting_approval", "reason": None, "url": "http://x/approvals/a-1/"}, **fields}


def test_a_dot_in_a_tools_name_becomes_an_underscore():
    assert mcp_name("payments.refund") == "payments_refund"
    assert mcp_name("a.b.c") == "a_b_c"


def test_the_call_id_is_the_json_rpc_request_id_and_fits_the_ledger():
    assert _call_id(7) == "mcp-7"
    assert _call_id("req-7") == "mcp-req-7"
    long = _call_id("x" * 200)
    assert len(long) <= MAX_CALL_ID and long == _call_id("x" * 200) and long != _call_id("x" * 201)
    assert _call_id("a\nb").isprintable()


def test_a_confirmed_call_is_its_result():
    result = _result(answer(status="confirmed", final=True, result={"ok": 1}, decision={"outcome": "dispatched"}))
    assert not result.is_error and result.structured_content["result"] == {"ok": 1}


def test_a_final_call_that_is_not_confirmed_is_an_error_with_its_reason():
    result = _result(answer(status="rejected", final=True, decision={"outcome": "rejected", "reason": "no"}))
    assert result.is_error and result.content[0].text.endswith(": no")
    refused = _result(answer(status="refused", final=True, reasons=["budget spent"], decision={"outcome": "refused"}))
    assert refused.is_error and "budget spent" in refused.content[0].text


def test_a_held_call_is_awaiting_approval_with_its_page_and_the_wait_tool():
    result = _result(answer(approval={"approval_id": "a-1"}))
    assert not result.is_error
    assert result.structured_content["awaiting_approval"] is True
    assert result.structured_content["approval_id"] == "a-1"
    assert result.structured_content["approval_url"] == "http://x/approvals/a-1/"
    assert WAIT_TOOL in result.content[0].text


def test_a_call_still_running_is_pending_not_an_error():
    result = _result(answer(status="unknown", decision={"outcome": "dispatched"}))
    assert not result.is_error and result.structured_content["pending"] is True
