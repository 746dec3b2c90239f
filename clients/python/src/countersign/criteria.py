"""Success criteria for a task contract, as the API takes them (`success_criteria` of
`start_task`). Each is judged by Countersign from its ledger when the task finishes, never from
the agent's word; `succeeded` needs every one to pass, and a `human` one waits for a reviewer.

    from countersign import criteria
    client.start_task(key=…, task_type="refund", goal=…, success_criteria=[
        criteria.operation_confirmed("payments.refund", order_id="ord-42"),
        criteria.result_matches("/status", tool="payments.refund", equals="succeeded"),
        criteria.human("The customer was told by email"),
    ])
"""

from __future__ import annotations

from typing import Any

_ABSENT = object()


def operation_confirmed(tool: str, *, description: str = "", **arguments: Any) -> dict[str, Any]:
    """Some operation of the task on `tool`, whose arguments contain these, is confirmed."""
    criterion: dict[str, Any] = {"kind": "operation_confirmed", "tool": tool}
    if arguments:
        criterion["arguments"] = arguments
    return _described(criterion, description)


def result_matches(path: str = "", *, call_id: str | None = None, tool: str | None = None, equals: Any = _ABSENT,
                   contains: Any = _ABSENT, description: str = "") -> dict[str, Any]:
    """A confirmed call's result (the call `call_id`, or any call of `tool`) at `path` (a JSON
    pointer `/a/0/b` or a dotted path `a.0.b`; empty: the whole result) equals or contains a
    value. Name exactly one of `call_id` and `tool`, and one of `equals` and `contains`."""
    if (call_id is None) == (tool is None):
        raise ValueError("Name exactly one of call_id and tool.")
    if (equals is _ABSENT) == (contains is _ABSENT):
        raise ValueError("Give exactly one of equals and contains.")
    criterion: dict[str, Any] = {"kind": "result_matches", "path": path}
    criterion.update({"call_id": call_id} if call_id is not None else {"tool": tool})
    criterion.update({"equals": equals} if equals is not _ABSENT else {"contains": contains})
    return _described(criterion, description)


def human(description: str) -> dict[str, Any]:
    """A reviewer of the tenant confirms it on the console, with evidence (the task waits in
    `waiting_review`). Plain text in `success_criteria` means the same."""
    return {"kind": "human", "description": description}


def verifier(name: str, *, description: str = "", **params: Any) -> dict[str, Any]:
    """A check registered in Countersign's code under `name` (e.g. `refund_confirmed`)."""
    return _described({"kind": "verifier", "name": name, "params": params}, description)


def _described(criterion: dict[str, Any], description: str) -> dict[str, Any]:
    if description:
        criterion["description"] = description
    return criterion
