"""A real server for the client: uvicorn, a Celery worker and the sandbox providers on the test
database (tests/stack.py), shared by a module's tests; and a reviewer deciding in the browser's
place, over HTTP, so that the decision's dispatch reaches the stack's worker (the test process's
own Celery app publishes nowhere)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from approvals.models import ApprovalRequest
from console.lib.procs import wait_until
from runs.models import Task, TaskStatus
from tests.stack import FullStack


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker):
    stack = FullStack().start()
    yield stack
    stack.stop()


def pending_approval(call_id: str) -> ApprovalRequest:
    """The approval request of a call, once the agent proposed it."""
    wait_until(lambda: ApprovalRequest.objects.filter(call_id=call_id).exists(), timeout=60,
               what=f"the approval of {call_id}")
    return ApprovalRequest.objects.get(call_id=call_id)


@contextmanager
def logged_in(stack: FullStack, username: str) -> Iterator[httpx.Client]:
    """A person's browser session on the stack, its CSRF header set for the forms it posts."""
    with httpx.Client(base_url=stack.url, follow_redirects=False, timeout=30) as browser:
        browser.get("/accounts/login/").raise_for_status()
        csrf = browser.cookies["csrftoken"]
        login = browser.post("/accounts/login/", data={"username": username, "password": "pw",
                                                       "csrfmiddlewaretoken": csrf})
        assert login.status_code == 302, login.text[:500]
        browser.headers["X-CSRFToken"] = browser.cookies["csrftoken"]
        yield browser


def decide(stack: FullStack, approval_id: str, verdict: str, *, username: str = "reviewer",
           reason: str = "") -> None:
    """A reviewer logs in and approves or rejects on the approval page's form."""
    with logged_in(stack, username) as browser:
        answer = browser.post(f"/approvals/{approval_id}/{verdict}/", data={"reason": reason})
        assert answer.status_code == 302, answer.text[:500]


def judged(task_id: str) -> Task:
    """The task once its verifier ruled on the evidence `finish()` handed it. Waiting for it also
    keeps the stack's worker from writing while the test database is flushed."""
    wait_until(lambda: Task.objects.filter(pk=task_id).exclude(status=TaskStatus.VERIFYING).exists(),
               timeout=60, what=f"the verifier's verdict on {task_id}")
    return Task.objects.get(pk=task_id)
