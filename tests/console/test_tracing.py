"""The console's own spans carry the task, step, call and operation IDs."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from approvals.services import approval_approve
from ledger.dispatcher import run_dispatch
from ledger.proposals import call_propose
from runs.services import lease_acquire, task_create, task_transition

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def exported():
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # the global provider can be set once per process
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


def test_gate_and_approval_wait_and_dispatch_spans_are_linked(exported, agent, reviewer):
    exported.clear()
    task = task_create(principal=agent, task_type="refund", goal="g")
    token = lease_acquire(task_id=task.task_id, owner="w", ttl_seconds=60).fencing_token
    version = task.version
    for to in ("planning", "running"):
        version = task_transition(task_id=task.task_id, to=to, expected_version=version, fencing_token=token,
                                  actor="agent").version
    proposal = call_propose(principal=agent, task_id=task.task_id, call_id="call-1", step_id="refund",
                            tool_name="payments.refund",
                            arguments={"order_id": "o1", "amount": 120, "currency": "EUR", "reason": "r"},
                            expected_version=version, fencing_token=token)
    approval_approve(approval_id=proposal.approval_id, reviewer=reviewer)
    run_dispatch("op_missing", worker="test")
    spans = {span.name: span for span in exported.get_finished_spans()}
    assert spans["gate"].attributes["countersign.operation_id"] == proposal.operation_id
    assert spans["gate"].attributes["gen_ai.tool.call.id"] == "call-1"
    assert spans["gate"].attributes["countersign.risk_tier"] == 3
    wait = spans["approval.wait"]
    assert wait.attributes["countersign.approval.outcome"] == "approved"
    assert wait.attributes["countersign.task_id"] == task.task_id
    assert wait.end_time >= wait.start_time
    assert spans["dispatch"].attributes["countersign.operation_id"] == "op_missing"
