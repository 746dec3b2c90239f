"""Each kind of success criterion, judged from the ledger: met, not yet, contradicted."""

from __future__ import annotations

import pytest

from ledger.models import Call, Fact
from ledger.models import OperationStatus as S
from runs import verifiers
from runs.models import Task, TaskStatus
from runs.verification import run_verification
from runs.verifiers import Verdict
from tests.factories import make_operation, make_task, record_outcome

pytestmark = pytest.mark.django_db

REFUND = {"order_id": "ord-7", "amount": 30, "currency": "EUR", "reason": "damaged"}


def verifying(agent, criteria, task_type="support") -> Task:
    task = make_task(agent, task_type=task_type, success_criteria=criteria)
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.VERIFYING)
    return task


def confirmed(agent, task, *, tool="payments.refund", arguments=None, result=None, call_id=None, step_id=None):
    operation = make_operation(agent, tool, task=task, status=S.DISPATCHED, arguments=arguments or REFUND,
                               call_id=call_id, step_id=step_id)
    record_outcome(operation, fact=Fact.KNOWN_SUCCESS, receipt={"remote_id": "re_1", "amount": 30}, result=result)
    operation.refresh_from_db()
    return operation


def judged(task) -> tuple[str, list[dict]]:
    result = run_verification(task.task_id)
    task.refresh_from_db()
    return result, task.verdicts


# --- operation_confirmed -------------------------------------------------------------------


def test_a_confirmed_operation_whose_arguments_contain_the_subset_meets_operation_confirmed(agent):
    task = verifying(agent, [{"kind": "operation_confirmed", "tool": "payments.refund",
                              "arguments": {"order_id": "ord-7", "amount": 30.0}}])
    operation = confirmed(agent, task)
    result, verdicts = judged(task)
    assert result == "met" and task.status == TaskStatus.SUCCEEDED
    assert verdicts[0]["evidence"]["operation_id"] == operation.operation_id


def test_a_confirmed_operation_for_another_order_does_not_meet_operation_confirmed(agent):
    task = verifying(agent, [{"kind": "operation_confirmed", "tool": "payments.refund",
                              "arguments": {"order_id": "ord-8"}}])
    confirmed(agent, task)
    result, verdicts = judged(task)
    assert result == "failed" and task.status == TaskStatus.FAILED
    assert verdicts[0]["evidence"]["reason"] == "no operation on this tool with these arguments"


def test_an_operation_still_in_doubt_sends_the_task_back_to_the_agent(agent):
    task = verifying(agent, [{"kind": "operation_confirmed", "tool": "payments.refund"}])
    make_operation(agent, "payments.refund", task=task, status=S.UNKNOWN, arguments=REFUND)
    result, _ = judged(task)
    assert result == "pending" and task.status == TaskStatus.RUNNING


def test_a_failed_operation_does_not_meet_operation_confirmed(agent):
    task = verifying(agent, [{"kind": "operation_confirmed", "tool": "payments.refund"}])
    make_operation(agent, "payments.refund", task=task, status=S.FAILED, arguments=REFUND)
    assert judged(task)[0] == "failed"


def test_another_tasks_confirmed_operation_counts_for_nothing(agent):
    other = make_task(agent)
    confirmed(agent, other)
    task = verifying(agent, [{"kind": "operation_confirmed", "tool": "payments.refund"}])
    assert judged(task)[0] == "failed"


# --- result_matches ------------------------------------------------------------------------


def test_a_result_field_found_by_call_id_and_json_pointer_equals_the_value(agent):
    task = verifying(agent, [{"kind": "result_matches", "call_id": "call-a", "path": "/refund/status",
                              "equals": "succeeded"}])
    confirmed(agent, task, call_id="call-a", result={"refund": {"status": "succeeded", "id": "re_9"}})
    result, verdicts = judged(task)
    assert result == "met"
    assert verdicts[0]["evidence"]["found"] == "succeeded"


def test_a_result_field_that_differs_fails_result_matches_and_quotes_what_was_found(agent):
    task = verifying(agent, [{"kind": "result_matches", "call_id": "call-a", "path": "refund.status",
                              "equals": "succeeded"}])
    confirmed(agent, task, call_id="call-a", result={"refund": {"status": "pending"}})
    result, verdicts = judged(task)
    assert result == "failed"
    assert verdicts[0]["evidence"]["checked"][0]["found"] == "pending"


def test_any_call_of_the_tool_may_contain_the_value_along_a_dotted_path(agent):
    task = verifying(agent, [{"kind": "result_matches", "tool": "payments.refund", "path": "items.1.sku",
                              "contains": "BLUE"}])
    confirmed(agent, task, step_id="s1", result={"items": [{"sku": "red-1"}]})
    confirmed(agent, task, step_id="s2", arguments={**REFUND, "order_id": "ord-9"},
              result={"items": [{"sku": "x"}, {"sku": "SKU-BLUE-2"}]})
    assert judged(task)[0] == "met"


def test_a_path_that_leads_nowhere_fails_result_matches(agent):
    task = verifying(agent, [{"kind": "result_matches", "tool": "payments.refund", "path": "/items/5",
                              "equals": None}])
    confirmed(agent, task, result={"items": []})
    result, verdicts = judged(task)
    assert result == "failed"
    assert verdicts[0]["evidence"]["checked"][0]["missing"] is True


def test_a_call_the_gate_refused_fails_result_matches(agent):
    task = verifying(agent, [{"kind": "result_matches", "call_id": "refused-1", "path": "", "equals": {}}])
    Call.objects.create(task=task, call_id="refused-1", arguments_hash="x", refusal={"reasons": ["no"]})
    result, verdicts = judged(task)
    assert result == "failed" and verdicts[0]["evidence"]["reason"] == "the gate refused this call"


def test_a_call_not_confirmed_yet_leaves_result_matches_pending(agent):
    task = verifying(agent, [{"kind": "result_matches", "call_id": "call-b", "path": "id", "equals": "x"}])
    make_operation(agent, "payments.refund", task=task, status=S.DISPATCHED, arguments=REFUND, call_id="call-b")
    assert judged(task)[0] == "pending"


# --- human -----------------------------------------------------------------------------------


def test_a_human_criterion_makes_the_task_wait_for_a_success_review(agent):
    task = verifying(agent, [{"kind": "human", "description": "The customer confirmed by phone"}])
    result, verdicts = judged(task)
    assert result == "review" and task.status == TaskStatus.WAITING_REVIEW
    assert verdicts[0]["result"] == "review"


def test_free_text_stored_by_an_older_contract_is_read_as_a_human_criterion(agent):
    task = verifying(agent, ["the customer is happy"])
    result, verdicts = judged(task)
    assert result == "review"
    assert verdicts[0]["criterion"] == {"kind": "human", "description": "the customer is happy"}


def test_a_human_criterion_waits_only_once_the_ledgers_checks_passed(agent):
    task = verifying(agent, ["the customer is happy",
                             {"kind": "operation_confirmed", "tool": "payments.refund"}])
    make_operation(agent, "payments.refund", task=task, status=S.UNKNOWN, arguments=REFUND)
    result, verdicts = judged(task)
    assert result == "pending" and task.status == TaskStatus.RUNNING
    assert [v["result"] for v in verdicts] == ["pending", "pending"]


# --- verifier (code-defined) -----------------------------------------------------------------


@pytest.fixture
def registered_check():
    seen = []

    @verifiers.register("test_always")
    def check(task, params):
        seen.append(params)
        return Verdict(params["answer"], {"said": params["answer"]})

    yield seen
    del verifiers.VERIFIERS["test_always"]


@pytest.mark.parametrize("answer", ["met", "failed"])
def test_a_registered_verifier_is_named_by_data_and_decides(agent, registered_check, answer):
    task = verifying(agent, [{"kind": "verifier", "name": "test_always", "params": {"answer": answer}}])
    result, verdicts = judged(task)
    assert result == answer and registered_check == [{"answer": answer}]
    assert verdicts[0]["evidence"] == {"said": answer}


def test_a_registered_verifiers_name_as_kind_is_shorthand_for_it(agent, registered_check):
    task = verifying(agent, [{"kind": "test_always", "answer": "met"}])
    assert judged(task)[0] == "met"


def test_a_check_may_not_be_registered_under_a_kinds_name():
    with pytest.raises(ValueError):
        verifiers.register("human")


def test_a_verifier_nobody_registered_fails(agent):
    task = verifying(agent, [{"kind": "verifier", "name": "nobody"}])
    assert judged(task)[0] == "failed"


def test_an_unknown_kind_left_by_an_older_contract_fails(agent):
    task = verifying(agent, [{"check": "receipt"}])
    result, verdicts = judged(task)
    assert result == "failed" and "no verifier" in verdicts[0]["evidence"]["reason"]


def test_a_task_without_any_criterion_fails(agent):
    task = verifying(agent, [])
    assert judged(task)[0] == "failed"
