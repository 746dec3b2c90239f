"""19. The API server killed (SIGKILL) in the middle of a dispatch it runs itself.

An agent that waits for its call's outcome has it dispatched by the server that took the
proposal (ledger/request_dispatch.py): the server holds the claim, calls the provider and
records the receipt, and nothing was published to the broker. The trial freezes the server at
one of the dispatcher's seams (chaos/server.py installs the hook), kills it there, and the rest
of the system settles the operation with no server's help:

- before the claim commits: the claim commits with the proposal, so both roll back and the
  ledger has nothing of the call; the agent's framework proposes it again (here without a wait,
  so a worker runs it): 1 attempt;
- before the provider call: `dispatched` with nothing sent; at its deadline the sweeper marks it
  `unknown` and reconciliation asks the provider (nothing there: dispatched again by a worker);
- after the provider call: the effect exists, its receipt does not; reconciliation finds it.

Whichever: one effect at the provider, `confirmed`. The agent's request dies with the server;
its framework proposes the call again: a new proposal after the first seam, a repeat answered
from the ledger after the others (the races of repeated proposals are scenarios 4 and 6). The
stack's watchdog restarts the server.
"""

from __future__ import annotations

import random
import threading
import uuid

import httpx

from chaos.invariants import VIOLATION, Expect, Finding
from chaos.stack import ChaosStack
from chaos.world import REFUND, Trial, World, kill, order, refund_arguments, start_task
from console.lib.procs import http_ok, wait_until
from ledger.models import Operation, OperationStatus
from ledger.seams import SEAMS


def kill_server_mid_dispatch(stack: ChaosStack, world: World, rng: random.Random, index: int) -> Trial:
    seam = SEAMS[index % len(SEAMS)]
    run = start_task(world, goal=f"chaos server killed at {seam}")
    operation_id = run.operation_id(world, REFUND)
    stack.arm(seam, operation_id)
    body = {"call_id": f"call-{uuid.uuid4().hex[:12]}", "step_id": run.step_id, "tool": REFUND,
            "arguments": refund_arguments(order()), "expected_version": run.version,
            "fencing_token": run.lease_token}
    answers: list[str] = []
    agent = threading.Thread(target=_propose_and_wait, args=(stack, world, run.task_id, body, answers),
                             name="chaos-agent", daemon=True)
    agent.start()
    pid = stack.wait_blocked(seam, operation_id)
    server = stack.server_child.popen.pid
    findings = []
    if pid != server:
        findings.append(Finding(VIOLATION, operation_id,
                                f"blocked at {seam} in process {pid}, not the server ({server}) the agent waits on"))
    kill(pid)
    agent.join(timeout=30)
    if answers != ["no answer"]:
        findings.append(Finding(VIOLATION, operation_id, f"the agent was answered by a killed server: {answers}"))
    # The watchdog starts a new server: the agent's second proposal, and the next trial, talk to it.
    wait_until(http_ok(f"{stack.api_url}/healthz"), timeout=60, what="the API server restarted")
    committed = Operation.objects.filter(pk=operation_id).exists()
    if committed == (seam == "before_dispatch_commit"):
        findings.append(Finding(VIOLATION, operation_id, f"killed at {seam}, the ledger {'has' if committed else 'lacks'}"
                                                         " the call"))
    again = httpx.post(f"{stack.api_url}/api/v1/tasks/{run.task_id}/calls", json=body, timeout=30,
                       headers={"Authorization": f"Bearer {world.api_token}"})
    if again.status_code != (200 if committed else 201):
        findings.append(Finding(VIOLATION, operation_id,
                                f"the agent's second proposal was answered {again.status_code} {again.text[:200]}"))
    expected = Expect(frozenset({OperationStatus.CONFIRMED}), effects=1, max_attempts=2,
                      attempts=1 if seam != "before_provider_call" else None)
    return Trial({operation_id: expected}, findings=findings)


def _propose_and_wait(stack: ChaosStack, world: World, task_id: str, body: dict, answers: list[str]) -> None:
    headers = {"Authorization": f"Bearer {world.api_token}"}
    try:
        response = httpx.post(f"{stack.api_url}/api/v1/tasks/{task_id}/calls", params={"wait": 20}, json=body,
                              headers=headers, timeout=60)
        answers.append(f"{response.status_code} {response.text[:200]}")
    except httpx.HTTPError:
        answers.append("no answer")
