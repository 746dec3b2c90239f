"""The asynchronous client: the same API as `countersign.client`, awaited."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from countersign import _core
from countersign.errors import ApiError, CountersignUnavailable, NotFinal


class AsyncClient:
    def __init__(self, base_url: str, token: str, *, timeout: float = 35.0,
                 http: httpx.AsyncClient | None = None, retries: int = _core.RETRIES) -> None:
        self.retries = retries
        self.base_url = base_url.rstrip("/")
        self.http = http or httpx.AsyncClient(base_url=self.base_url, timeout=timeout,
                                              headers={"Authorization": f"Bearer {token}"})

    async def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        last: object = None
        for attempt in range(max(self.retries, 1)):
            await asyncio.sleep(_core.backoff(attempt))
            try:
                answer = _core.settle(await self.http.request(method, path, **kwargs))
            except httpx.TransportError as error:
                last = error
                continue
            if answer is not None:
                return answer
            last = "a gateway error"
        raise _core.unavailable(self.base_url, last)

    async def start_task(self, *, key: str, task_type: str, goal: str, inputs: dict | None = None,
                         constraints: dict | None = None, success_criteria: list | None = None,
                         owner: str | None = None, ttl_seconds: int = 300, renew: bool = True) -> AsyncTask:
        body = _core.start_body(task_type=task_type, goal=goal, inputs=inputs, constraints=constraints,
                                success_criteria=success_criteria, owner=owner or key, ttl_seconds=ttl_seconds)
        try:
            answer = await self.request("POST", f"{_core.API}/tasks", json=body, headers={"Idempotency-Key": key})
        except ApiError as error:
            if error.status != 409:
                raise
            raise _core.finished_or(error, await self.task_by_key(key)) from error
        task = AsyncTask(self, answer, owner=owner or key, ttl_seconds=ttl_seconds)
        if renew:
            task.start_renewing()
        return task

    async def task_by_key(self, key: str) -> dict[str, Any] | None:
        path, params = _core.by_key_request(key)
        try:
            return await self.request("GET", path, params=params)
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    async def task(self, task_id: str) -> dict[str, Any]:
        return await self.request("GET", f"{_core.API}/tasks/{task_id}")

    async def tools(self) -> list[dict[str, Any]]:
        return (await self.request("GET", f"{_core.API}/tools"))["tools"]

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncTask(_core.TaskState):
    def __init__(self, client: AsyncClient, answer: dict[str, Any], *, owner: str, ttl_seconds: int) -> None:
        super().__init__(answer, owner=owner, ttl_seconds=ttl_seconds)
        self.client = client
        self._renewer: asyncio.Task | None = None

    async def renew(self) -> dict[str, Any]:
        path, body = self.lease_request()
        return await self.client.request("POST", path, json=body)

    def start_renewing(self) -> None:
        if self._renewer is None:
            self._renewer = asyncio.get_running_loop().create_task(self._renew_loop())

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self.renew_every)
            try:
                await self.renew()
            except ApiError as error:
                self.lease_error = _core.lease_error(error)
                return
            except CountersignUnavailable:
                continue

    async def stop_renewing(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            await asyncio.gather(self._renewer, return_exceptions=True)
            self._renewer = None

    async def propose(self, tool: str, arguments: dict[str, Any], *, step_id: str,
                      call_id: str | None = None, wait: float | None = None) -> dict[str, Any]:
        path, body = self.propose_request(tool, arguments, step_id, call_id)
        try:
            return await self.client.request("POST", path, json=body, params=_core.propose_params(wait))
        except ApiError as error:
            raise _core.fenced(error) from error

    async def wait(self, call_id: str, *, timeout: float | None = None) -> dict[str, Any]:
        until = _core.deadline(timeout)
        answer = await self.client.request("GET", _core.call_path(call_id),
                                           params=_core.first_wait_poll(self.task_id, until))
        while (params := _core.next_poll(self.task_id, answer, until)) is not None:
            answer = await self.client.request("GET", _core.call_path(call_id), params=params)
        return answer

    async def wait_decided(self, call_id: str, *, timeout: float | None = None) -> dict[str, Any]:
        """Long-polls the call until a person decided it (or it never needed one); NotFinal when
        `timeout` passes first."""
        until = _core.deadline(timeout)
        answer = await self.client.request("GET", _core.call_path(call_id), params=self.first_poll())
        while (params := _core.next_decision_poll(self.task_id, answer, until)) is not None:
            answer = await self.client.request("GET", _core.call_path(call_id), params=params)
        return answer

    async def call_answer(self, tool: str, arguments: dict[str, Any], *, step_id: str,
                          call_id: str | None = None, timeout: float | None = None) -> dict[str, Any]:
        until = _core.deadline(timeout)
        proposed = await self.propose(tool, arguments, step_id=step_id, call_id=call_id,
                                      wait=_core.poll_wait(until))
        if _core.answers_for_itself(proposed):
            return proposed
        return await self.wait(proposed["call_id"], timeout=_core.time_left(until))

    async def call(self, tool: str, arguments: dict[str, Any], *, step_id: str, call_id: str | None = None,
                   timeout: float | None = None) -> Any:
        answer = await self.call_answer(tool, arguments, step_id=step_id, call_id=call_id, timeout=timeout)
        if _core.is_open(answer):
            raise NotFinal(answer)
        return _core.outcome(answer)

    async def check(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        path, body = self.check_request(tool, arguments)
        return await self.client.request("POST", path, json=body)

    async def needs_approval(self, tool: str, arguments: dict[str, Any]) -> bool:
        return (await self.check(tool, arguments))["outcome"] == "awaiting_approval"

    async def transition(self, to: str, *, evidence: dict[str, Any] | None = None, reason: str = "") -> dict[str, Any]:
        path, body = self.transition_request(to, evidence, reason)
        try:
            return self.committed(await self.client.request("POST", path, json=body))
        except ApiError as error:
            raise _core.fenced(error) from error

    async def finish(self, *, evidence: dict[str, Any], reason: str = "", wait: float | None = None) -> dict[str, Any]:
        try:
            answer = await self.transition("verifying", evidence=evidence, reason=reason)
        finally:
            await self.stop_renewing()
        return answer if wait is None else await self.verdict(timeout=wait)

    async def verdict(self, *, timeout: float = 60.0) -> dict[str, Any]:
        until = _core.deadline(timeout)
        attempt = 0
        while not _core.judged(task := await self.client.task(self.task_id)) and time.monotonic() < until:
            await asyncio.sleep(_core.verdict_pause(attempt))
            attempt += 1
        self.status, self.version = task["status"], task["version"]
        return task

    async def fail(self, reason: str, *, evidence: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            return await self.transition("failed", evidence=evidence, reason=reason)
        finally:
            await self.stop_renewing()

    async def close(self) -> None:
        await self.stop_renewing()
