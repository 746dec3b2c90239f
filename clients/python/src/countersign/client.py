"""The synchronous client: `Client(url, token).start_task(key=…, …)` → `Task`, whose `call()`
proposes a tool call, waits for it to be final and returns its result or raises."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx

from countersign import _core
from countersign.errors import ApiError, CountersignUnavailable, NotFinal


class Client:
    def __init__(self, base_url: str, token: str, *, timeout: float = 35.0,
                 http: httpx.Client | None = None, retries: int = _core.RETRIES) -> None:
        self.retries = retries
        self.base_url = base_url.rstrip("/")
        self.http = http or httpx.Client(base_url=self.base_url, timeout=timeout,
                                         headers={"Authorization": f"Bearer {token}"})

    def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        last: object = None
        for attempt in range(max(self.retries, 1)):
            time.sleep(_core.backoff(attempt))
            try:
                answer = _core.settle(self.http.request(method, path, **kwargs))
            except httpx.TransportError as error:
                last = error
                continue
            if answer is not None:
                return answer
            last = "a gateway error"
        raise _core.unavailable(self.base_url, last)

    def start_task(self, *, key: str, task_type: str, goal: str, inputs: dict | None = None,
                   constraints: dict | None = None, success_criteria: list | None = None,
                   owner: str | None = None, ttl_seconds: int = 300, renew: bool = True) -> Task:
        """Registers the task (or finds the one registered under `key`), leased and running. Use
        a key that survives a restart (the framework's thread ID); the owner defaults to it.
        TaskFinished when the task under `key` is already finished (it takes no lease)."""
        body = _core.start_body(task_type=task_type, goal=goal, inputs=inputs, constraints=constraints,
                                success_criteria=success_criteria, owner=owner or key, ttl_seconds=ttl_seconds)
        try:
            answer = self.request("POST", f"{_core.API}/tasks", json=body, headers={"Idempotency-Key": key})
        except ApiError as error:
            if error.status != 409:
                raise
            raise _core.finished_or(error, self.task_by_key(key)) from error
        task = Task(self, answer, owner=owner or key, ttl_seconds=ttl_seconds)
        if renew:
            task.start_renewing()
        return task

    def task(self, task_id: str) -> dict[str, Any]:
        return self.request("GET", f"{_core.API}/tasks/{task_id}")

    def task_by_key(self, key: str) -> dict[str, Any] | None:
        """The task registered under this Idempotency-Key, in whatever status (no lease taken),
        or None: how a restarted agent learns its task is already finished."""
        path, params = _core.by_key_request(key)
        try:
            return self.request("GET", path, params=params)
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    def tools(self) -> list[dict[str, Any]]:
        """The tools this agent may call, with the JSON Schema of their arguments."""
        return self.request("GET", f"{_core.API}/tools")["tools"]

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Task(_core.TaskState):
    def __init__(self, client: Client, answer: dict[str, Any], *, owner: str, ttl_seconds: int) -> None:
        super().__init__(answer, owner=owner, ttl_seconds=ttl_seconds)
        self.client = client
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    # The lease, renewed in the background while the task is open -----------------------------

    def renew(self) -> dict[str, Any]:
        path, body = self.lease_request()
        return self.client.request("POST", path, json=body)

    def start_renewing(self) -> None:
        if self._renewer is None:
            self._renewer = threading.Thread(target=self._renew_loop, name=f"countersign-lease-{self.task_id}",
                                             daemon=True)
            self._renewer.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.renew_every):
            try:
                self.renew()
            except ApiError as error:
                self.lease_error = _core.lease_error(error)
                return
            except CountersignUnavailable:
                continue  # the next round tries again; the lease outlives a few missed renewals

    def stop_renewing(self) -> None:
        self._stop.set()
        if self._renewer is not None and self._renewer is not threading.current_thread():
            self._renewer.join(timeout=5)

    # Calls -------------------------------------------------------------------------------------

    def propose(self, tool: str, arguments: dict[str, Any], *, step_id: str, call_id: str | None = None,
                wait: float | None = None) -> dict[str, Any]:
        """Proposes the call (a repeat answers from the ledger) and returns the server's answer;
        with `wait`, a call the gate runs at once is answered when it is final (at most `wait`
        seconds), a call held for a person at once."""
        path, body = self.propose_request(tool, arguments, step_id, call_id)
        try:
            return self.client.request("POST", path, json=body, params=_core.propose_params(wait))
        except ApiError as error:
            raise _core.fenced(error) from error

    def wait(self, call_id: str, *, timeout: float | None = None) -> dict[str, Any]:
        """Long-polls the call until it is final (or parked for people), or `timeout` passes: one
        poll that the server answers when the call is final (`until=final`), more only when a
        poll's wait runs out first."""
        until = _core.deadline(timeout)
        answer = self.client.request("GET", _core.call_path(call_id), params=_core.first_wait_poll(self.task_id, until))
        while (params := _core.next_poll(self.task_id, answer, until)) is not None:
            answer = self.client.request("GET", _core.call_path(call_id), params=params)
        return answer

    def call_answer(self, tool: str, arguments: dict[str, Any], *, step_id: str, call_id: str | None = None,
                    timeout: float | None = None) -> dict[str, Any]:
        """Proposes and waits; the last answer, final unless `timeout` passed. The proposal itself
        waits for a call the gate runs at once; one answered final (that, a refusal, a repeat of
        a call that ended) is returned as it is, without a poll: it carries `result` but not
        `receipt` or `attempts` (`wait()` reads them)."""
        until = _core.deadline(timeout)
        proposed = self.propose(tool, arguments, step_id=step_id, call_id=call_id, wait=_core.poll_wait(until))
        if _core.answers_for_itself(proposed):
            return proposed
        return self.wait(proposed["call_id"], timeout=_core.time_left(until))

    def call(self, tool: str, arguments: dict[str, Any], *, step_id: str, call_id: str | None = None,
             timeout: float | None = None) -> Any:
        """Runs the call through Countersign: the result, or Rejected / Refused / Expired /
        Cancelled / Failed / OutcomeUnknown / NotFinal (timeout passed) / CountersignUnavailable."""
        answer = self.call_answer(tool, arguments, step_id=step_id, call_id=call_id, timeout=timeout)
        if _core.is_open(answer):
            raise NotFinal(answer)
        return _core.outcome(answer)

    def check(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """The gate's verdict for these arguments now (a dry run: nothing is written)."""
        path, body = self.check_request(tool, arguments)
        return self.client.request("POST", path, json=body)

    def needs_approval(self, tool: str, arguments: dict[str, Any]) -> bool:
        """True when proposing these arguments now would wait for a person. A call the gate
        would refuse answers False: proposing it raises Refused."""
        return self.check(tool, arguments)["outcome"] == "awaiting_approval"

    # The end -----------------------------------------------------------------------------------

    def transition(self, to: str, *, evidence: dict[str, Any] | None = None, reason: str = "") -> dict[str, Any]:
        path, body = self.transition_request(to, evidence, reason)
        try:
            return self.committed(self.client.request("POST", path, json=body))
        except ApiError as error:
            raise _core.fenced(error) from error

    def finish(self, *, evidence: dict[str, Any], reason: str = "", wait: float | None = None) -> dict[str, Any]:
        """Hands the task to its verifiers (`verifying`): only they say `succeeded`. With `wait`
        (seconds), waits for their ruling and returns the task (`status`, `verdicts`)."""
        try:
            answer = self.transition("verifying", evidence=evidence, reason=reason)
        finally:
            self.stop_renewing()
        return answer if wait is None else self.verdict(timeout=wait)

    def verdict(self, *, timeout: float = 60.0) -> dict[str, Any]:
        """The task once its verifiers ruled on it (or as it is when `timeout` passed): `status`
        (`succeeded`, `failed`, `waiting_review`, or `running` when a criterion is not settled
        yet) and `verdicts`, each criterion's result and evidence. Back in `running`, the lease is
        no longer renewed: start the task again with the same key to go on."""
        until = _core.deadline(timeout)
        attempt = 0
        while not _core.judged(task := self.client.task(self.task_id)) and time.monotonic() < until:
            time.sleep(_core.verdict_pause(attempt))
            attempt += 1
        self.status, self.version = task["status"], task["version"]
        return task

    def fail(self, reason: str, *, evidence: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            return self.transition("failed", evidence=evidence, reason=reason)
        finally:
            self.stop_renewing()

    def close(self) -> None:
        """Stops renewing the lease (the task stays open; a restart with the same key continues it)."""
        self.stop_renewing()

    def __enter__(self) -> Task:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
