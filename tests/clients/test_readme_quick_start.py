"""The README's agent quick start, run as written (its URL and token swapped for the test
server's) against a real server: it waits for the reviewer, refunds once, finishes the task."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from countersign._core import call_id_for

from console.lib.procs import wait_until
from ledger.models import Operation
from runs.models import Task
from sandbox import client as sandbox
from tests.asgi import REPO
from tests.clients.conftest import decide, judged, pending_approval
from tests.conftest import AGENT_TOKEN

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


def quick_start() -> str:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Agent quick start", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_quick_start_refunds_once_after_a_reviewer_approves(stack, agent, reviewer):
    code = quick_start().replace("http://127.0.0.1:8000", stack.url).replace("demo-agent-token", AGENT_TOKEN)
    assert len(code.strip().splitlines()) <= 12

    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(exec, code, {})
        task = pending_task("refund-ord-42")
        decide(stack, pending_approval_of(task).approval_id, "approve", reason="ok")
        running.result(timeout=120)

    [operation] = Operation.objects.filter(task_id=task.task_id)
    assert operation.status == "confirmed"
    assert len(sandbox.effects(stack.payments.base_url, key=operation.idempotency_key)) == 1
    judged(task.task_id)


def pending_task(key: str) -> Task:
    wait_until(lambda: Task.objects.filter(idempotency_key=key).exists(), timeout=60, what=f"the task {key}")
    return Task.objects.get(idempotency_key=key)


def pending_approval_of(task: Task):
    return pending_approval(call_id_for(task.task_id, "refund", "payments.refund"))
