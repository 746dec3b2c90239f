"""Dispatch in the request: a call the gate runs at once, whose agent waits for its outcome, is
dispatched by the server thread that proposed it, right after the proposal commits.

Through the broker, such a call crosses four hops before its agent hears of it: the server
publishes, a worker picks the message up, the worker rings the server's doorbell when the
receipt commits, and the server reads the outcome back. The agent is waiting on this server
anyway, so the server runs the dispatch itself (Temporal calls the same idea eager dispatch).

It is the worker's protocol, not a second one: the same fencing token, provider call and
receipt, and the claim's checks at the moment of effect. The claim runs in the proposal's own
transaction, where the gate has just judged the call on the agent and the configuration that
the write finds unchanged and share-locks until the commit, so only its load guards are left to
check, before the write: the call is
inserted `dispatched`, with its first attempt. One commit fewer than a worker's dispatch, no
update of the row before the provider call, and no moment where the call is `authorized` with
nothing on its way. Nothing is published for it.

A server that dies (or a claim that fails) before that commit leaves nothing at all: the
agent's request gets no answer (or a 503), and its framework proposes the call again. One that
dies after it leaves the operation `dispatched`, and the sweeper marks it `unknown` at its
deadline for reconciliation, as it does for a lost worker.

Only tools on the fast queue (a server thread does not wait on slow ones), only with
DISPATCH_IN_REQUEST on (a deployment whose web servers must not reach providers turns it off),
and at most DISPATCH_IN_REQUEST_SLOTS at once per server process: a provider that hangs must not
pile up the server's threads, and past that many the calls go to the workers, as before.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings
from django.db import close_old_connections

from approvals.models import Tool
from console.models import Event
from ledger import dispatcher, tasks
from ledger.models import Attempt, Operation

logger = logging.getLogger(__name__)

_slots_lock = threading.Lock()
_slots_taken = 0


@contextmanager
def slot() -> Iterator[bool]:
    """One of this process's DISPATCH_IN_REQUEST_SLOTS for the body of the `with`, if one is
    free (yields True; it is given back at the end), else yields False at once: never waits."""
    global _slots_taken
    with _slots_lock:
        taken = _slots_taken < settings.DISPATCH_IN_REQUEST_SLOTS
        if taken:
            _slots_taken += 1
    try:
        yield taken
    finally:
        if taken:
            with _slots_lock:
                _slots_taken -= 1


def applies(tool: Tool) -> bool:
    return settings.DISPATCH_IN_REQUEST and tool.queue == Tool.Queue.FAST


def server_name() -> str:
    """The attempt's `worker`: which server ran it."""
    return _server_name(os.getpid())


@functools.lru_cache(maxsize=1)
def _server_name(pid: int) -> str:
    # By process: a forked child names itself. The host's name is asked once, not per dispatch.
    return f"server:{socket.gethostname()}:{pid}"


def claim(operation: Operation, *, circuit_until, in_flight: int,
          created: dict) -> dispatcher.Deferred | tuple[Attempt, list[Event]]:
    """The claim of a call the proposal's request dispatches, in the proposal's transaction and
    before its write (`dispatcher.claim_new`), on what the proposal's statements read for it
    (`ledger.proposals._lock_task`): the call is inserted `dispatched`, and a claim that fails
    takes the proposal with it (nothing committed, nothing sent; the agent proposes again)."""
    return dispatcher.claim_new(operation, worker=server_name(), circuit_until=circuit_until, in_flight=in_flight,
                                created=created)


def dispatch(operation_id: str, claimed: dispatcher.Claim) -> Operation | None:
    """The rest of the operation's dispatch in this thread (`dispatcher.settle`), after its
    proposal and claim committed, outside any transaction. Returns the operation as its receipt
    left it (its status and result, which the agent's answer carries without reading them
    again), or None when the dispatch recorded no receipt.

    Any failure is handed to the broker: after a claim, the message is a no-op (the ledger says
    `dispatched`) and the sweeper settles the operation at its deadline; after a deferred claim,
    the message runs the dispatch. The proposal has committed, so its agent gets an answer
    either way, never an error for a call that will still run."""
    try:
        return dispatcher.settle(operation_id, claimed, let_go=close_old_connections)[1]
    except Exception:  # noqa: BLE001 - the broker takes over whatever went wrong here
        logger.warning("dispatch of %s in the request failed; handed to the broker", operation_id, exc_info=True)
        tasks.enqueue_dispatch(operation_id, queue=Tool.Queue.FAST)
        return None
