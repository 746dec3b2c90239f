"""Faults at random moments, not at the protocol's seams (13–15): while a sustained load of
refunds with mixed provider faults (timeouts before and after commit, lost replies, 429, 5xx,
crashes) is proposed — some call IDs proposed twice, as retrying agents do — a killer thread
picks a random worker at random intervals and

- 13 `random-kill-pool-child`: SIGKILLs one of its prefork pool children (the pool deadlock this
  finds is recovered by the supervisor's progress check);
- 14 `random-kill-worker`: SIGKILLs its main process (the product's pool: threads); the
  supervisor starts it again;
- 15 `random-stop-worker`: SIGSTOPs its whole process group, then SIGCONTs it a moment later.

A kill may land anywhere: in the broker client, inside billiard's queue lock, mid-commit, mid
provider call. Every operation must settle (terminal or `manual`) within the quiet period with
the invariants intact, and — checked for every scenario by `run_trial` — the oldest due
operation must stay under DUE_AGE_LIMIT_SECONDS while a worker lives.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time

from chaos.invariants import SETTLED, Expect
from chaos.stack import ChaosStack, pool_pids
from chaos.world import REFUND, Trial, World, kill, order, propose, refund_arguments
from console.lib.procs import wait_until
from ledger.models import Call
from ledger.proposals import call_propose

# The sandbox faults the first request for a key whose order ID names one (sandbox/faults.py).
FAULT_MIX = ("ok", "ok", "ok", "ok", "fault-timeout-after-commit", "fault-timeout-before-commit",
             "fault-lost-reply", "fault-429", "fault-5xx-before-commit", "fault-5xx-after-commit", "fault-crash")
CALLS_PER_TRIAL = 16
MIN_FAULTS = 2  # the killer goes on after the load until it struck this often
KILL_INTERVAL = (0.3, 2.0)  # seconds between faults, uniform
STOP_FOR = (0.5, 4.0)  # seconds a stopped worker stays stopped


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _strike(stack: ChaosStack, rng: random.Random, mode: str, notes: list[str]) -> None:
    live = [child for child in stack.worker_children if child.alive]
    if not live:
        return
    worker = rng.choice(live)
    if mode == "pool-child":
        children = pool_pids(worker)
        if children:
            kill(rng.choice(children), signal.SIGKILL)
            notes.append(f"killed a pool child of {worker.name}")
    elif mode == "worker":
        kill(worker.popen.pid, signal.SIGKILL)
        notes.append(f"killed {worker.name}")
    else:
        _signal_group(worker.popen.pid, signal.SIGSTOP)
        time.sleep(rng.uniform(*STOP_FOR))
        _signal_group(worker.popen.pid, signal.SIGCONT)
        notes.append(f"stopped and continued {worker.name}")


def _killer(stack: ChaosStack, rng: random.Random, mode: str, stop: threading.Event, notes: list[str]) -> None:
    while not stop.wait(rng.uniform(*KILL_INTERVAL)):
        _strike(stack, rng, mode, notes)


def _load(world: World, rng: random.Random) -> list[str]:
    ids = []
    for _ in range(CALLS_PER_TRIAL):
        proposed = propose(world, tool=REFUND, order_id=order(rng.choice(FAULT_MIX)))
        ids.append(proposed.operation_id)
        if rng.random() < 0.3:
            # A retrying agent proposes the same call ID again: answered from the ledger.
            call = Call.objects.select_related("operation").get(operation_id=proposed.operation_id)
            again = call_propose(principal=world.agent, task_id=proposed.task_id, call_id=call.call_id,
                                 step_id=call.operation.step.step_id, tool_name=REFUND,
                                 arguments=refund_arguments(call.operation.arguments["order_id"]),
                                 expected_version=0, fencing_token=proposed.lease_token)
            if again.operation_id != proposed.operation_id:
                raise AssertionError(f"a repeated call made a second operation {again.operation_id}")
        time.sleep(rng.uniform(0, 0.25))
    return ids


def random_faults(mode: str):
    def run(stack: ChaosStack, world: World, rng: random.Random, index: int) -> Trial:
        trial = Trial()
        stop = threading.Event()
        killer = threading.Thread(target=_killer, args=(stack, random.Random(rng.random()), mode, stop, trial.notes),
                                  name="chaos-killer", daemon=True)
        killer.start()
        try:
            ids = _load(world, rng)
            wait_until(lambda: len(trial.notes) >= MIN_FAULTS, timeout=60, what=f"{MIN_FAULTS} faults")
        finally:
            stop.set()
            killer.join()
        trial.expectations = {operation_id: Expect(SETTLED) for operation_id in ids}
        trial.notes[:] = [f"trial {index}: {len(trial.notes)} fault(s) ({mode})"]
        return trial

    return run
