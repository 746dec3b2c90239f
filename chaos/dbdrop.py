"""Scenario 6: the PostgreSQL connection drops, or the server restarts, mid-commit.

The workers and the API server of this stack reach PostgreSQL through chaos/pgproxy.py.
Each trial arms one rule there for one operation and one commit of the protocol:

- `claim`: the dispatcher's `authorized → dispatched` transaction (it inserts the attempt);
- `receipt`: the worker recording the provider's success (`known_success`);
- `reconcile`: the reconciler confirming from a provider query (after a timeout after commit);
- `proposal`: the agent API creating the operation (POST /api/v1/tasks/{id}/calls).

Alternating by trial, the proxy either cuts the connection instead of forwarding COMMIT (nothing
committed) or forwards it, throws the server's answer away and cuts (committed, and nobody who
asked knows). Then, as a restarting server, it cuts every other connection (3 times in 4) and
refuses new ones for 0, 0.5 or 2 s. The harness itself talks to PostgreSQL directly, as the observer.

Expected: nothing acknowledged is lost and nothing is duplicated. A committed receipt stays
(confirmed with the worker's own receipt); a lost one is found by reconciliation; a committed
claim whose worker never got to the provider goes unknown → retry-safe → attempt 2; the agent,
retrying the same call after a 500, gets 201 only if its first request did not commit, and one
operation, one call and one budget charge in any case. 1 effect, confirmed, every time.

SQLite has no connection to drop: the scenario needs PostgreSQL (see docs/reliability.md).
"""

from __future__ import annotations

import random
import time
import uuid

import httpx

from chaos import invariants
from chaos.invariants import Expect, Finding
from chaos.stack import ChaosStack
from chaos.world import REFUND, Trial, World, order, propose, refund_arguments, start_task
from console.lib.procs import wait_until
from ledger.models import Attempt, Call, Operation, OperationStatus
from runs.models import Task

DROP_SEAMS = ("claim", "receipt", "reconcile", "proposal")
MODES = ("reply", "before")  # commit applied and the answer lost / commit never reached the server
AGENT_RETRY_SECONDS = 30.0


def needles(seam: str, operation_id: str) -> list[str]:
    """What the one transaction to cut contains (SQL text with Django's inlined literals)."""
    return {
        "claim": [operation_id, 'INSERT INTO "ledger_attempt"'],
        "receipt": [operation_id, "known_success"],
        "reconcile": [operation_id, "system:reconciler", "the provider has the effect"],
        "proposal": [operation_id, 'INSERT INTO "ledger_operation"'],
    }[seam]


def connection_drop(stack: ChaosStack, world: World, rng: random.Random, index: int) -> Trial:
    """6. See the module's docstring."""
    if stack.proxy is None:
        raise RuntimeError("scenario 6 needs the stack's database proxy (db_proxy=True, PostgreSQL)")
    seam = DROP_SEAMS[index % len(DROP_SEAMS)]
    mode = MODES[(index // len(DROP_SEAMS)) % len(MODES)]
    rule = f"{seam}-{mode}-{uuid.uuid4().hex[:8]}"
    sever_all = rng.random() < 0.75
    refuse = rng.choice((0.0, 0.5, 2.0))

    def arm(operation_id: str) -> None:
        stack.proxy.arm(rule, needles(seam, operation_id), mode=mode, sever_all=sever_all, refuse_seconds=refuse)

    if seam == "proposal":
        trial, operation_id = _propose_through_api(stack, world, arm, mode)
    else:
        fault = "fault-timeout-after-commit" if seam == "reconcile" else "ok"
        p = propose(world, tool=REFUND, order_id=order(fault), before=arm)
        operation_id = p.operation_id
        # A committed claim whose worker died before the provider: unknown → retry-safe → attempt 2.
        attempts = 2 if (seam, mode) == ("claim", "reply") else 1
        extra = _receipt_kept if (seam, mode) == ("receipt", "reply") else None
        trial = Trial({operation_id: Expect(frozenset({OperationStatus.CONFIRMED}), effects=1, attempts=attempts, extra=extra)})
    _expect_fired(stack, rule, operation_id, trial)
    return trial


def _expect_fired(stack: ChaosStack, rule: str, operation_id: str, trial: Trial) -> None:
    """A trial whose fault never fired tested nothing: a violation, not a pass."""
    try:
        wait_until(lambda: stack.proxy.fired(rule) is not None, timeout=30, what=f"proxy rule {rule}")
    except TimeoutError:
        trial.findings.append(Finding(invariants.VIOLATION, operation_id, f"the proxy rule {rule} never fired"))
        stack.proxy.reset()


def _receipt_kept(operation: Operation, attempts: list[Attempt]) -> list[str]:
    """The worker's receipt committed (only its answer was lost): it must be the one kept, not
    one rebuilt by reconciliation."""
    if (operation.receipt or {}).get("via") == "query":
        return ["the committed receipt was lost: confirmed again by reconciliation"]
    return []


def _propose_through_api(stack: ChaosStack, world: World, arm, mode: str) -> tuple[Trial, str]:
    """The agent proposes over HTTP and, on a 5xx or a broken connection, sends the same call
    again, as an agent should: a repeat of a call ID is answered from the ledger."""
    run = start_task(world, goal="chaos refund through the API")
    operation_id = run.operation_id(world, REFUND)
    arm(operation_id)
    body = {"call_id": f"call-{uuid.uuid4().hex[:12]}", "step_id": run.step_id, "tool": REFUND,
            "arguments": refund_arguments(order()), "expected_version": run.version,
            "fencing_token": run.lease_token}
    answers = _post_until_answered(stack, world, run.task_id, body)
    trial = Trial({operation_id: Expect(frozenset({OperationStatus.CONFIRMED}), effects=1, attempts=1)})

    def bad(message: str) -> None:
        trial.findings.append(Finding(invariants.VIOLATION, operation_id, message))

    codes = [code for code, _ in answers]
    final_code, final = answers[-1]
    if final_code not in (200, 201):
        bad(f"the agent got no answer in {AGENT_RETRY_SECONDS:.0f}s of retries: {codes}")
        return trial, operation_id
    if final.get("operation_id") != operation_id:
        bad(f"answered operation {final.get('operation_id')}, not {operation_id}")
    # The first request's commit reached the server only in `reply` mode: then the retry must
    # find it (200), and creating it again would be a duplicate; otherwise the retry creates it.
    created = codes.count(201)
    if created != (0 if mode == "reply" else 1):
        bad(f"{created} answers 201 in mode {mode}: {codes}")
    operations = Operation.objects.filter(task_id=run.task_id).count()
    calls = Call.objects.filter(task_id=run.task_id).count()
    charged = Task.objects.values_list("calls_used", flat=True).get(pk=run.task_id)
    if (operations, calls, charged) != (1, 1, 1):
        bad(f"{operations} operations, {calls} calls, {charged} budget charges for one call")
    return trial, operation_id


def _post_until_answered(stack: ChaosStack, world: World, task_id: str, body: dict) -> list[tuple[int, dict]]:
    answers: list[tuple[int, dict]] = []
    headers = {"Authorization": f"Bearer {world.api_token}"}
    deadline = time.monotonic() + AGENT_RETRY_SECONDS
    with httpx.Client(base_url=stack.api_url, headers=headers, timeout=15) as client:
        while True:
            try:
                response = client.post(f"/api/v1/tasks/{task_id}/calls", json=body)
                payload = response.json() if "json" in response.headers.get("content-type", "") else {}
                answers.append((response.status_code, payload))
                if response.status_code < 500:
                    return answers
            except httpx.HTTPError as exc:
                answers.append((0, {"transport": type(exc).__name__}))
            if time.monotonic() > deadline:
                return answers
            time.sleep(0.2)
