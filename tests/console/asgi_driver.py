"""Requests straight into an ASGI application, in this process, as uvicorn would send them:
for tests of the web server's own handler (console.asgi), which Django's AsyncClient does not use."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from urllib.parse import urlencode


@dataclass
class Answer:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


async def call(app, path: str, *, method: str = "GET", headers: list[tuple[bytes, bytes]] | None = None,
               body: bytes = b"") -> Answer:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"testserver"), *(headers or [])], "client": ("127.0.0.1", 1),
             "server": ("testserver", 80)}
    delivered = False
    sent: list[dict] = []

    async def receive():
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client stays connected until the answer is sent

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    return Answer(sent[0]["status"], sent[0].get("headers", []),
                  b"".join(message.get("body", b"") for message in sent[1:]))


@dataclass
class Browser:
    """Keeps the cookies it is given, and sends forms as a browser does."""

    app: object
    cookies: SimpleCookie = field(default_factory=SimpleCookie)

    async def request(self, path: str, *, method: str = "GET", form: dict | None = None) -> Answer:
        headers = []
        if self.cookies:
            headers.append((b"cookie", "; ".join(f"{k}={m.value}" for k, m in self.cookies.items()).encode()))
        body = b""
        if form is not None:
            body = urlencode(form).encode()
            headers += [(b"content-type", b"application/x-www-form-urlencoded"),
                        (b"content-length", str(len(body)).encode())]
        answer = await call(self.app, path, method=method, headers=headers, body=body)
        for name, value in answer.headers:
            if name.lower() == b"set-cookie":
                self.cookies.load(value.decode())
        return answer


async def counting_hops(work):
    """Run `work()` and count the thread hops (run_in_executor) the event loop made meanwhile."""
    loop = asyncio.get_running_loop()
    hops = []
    original = loop.run_in_executor

    def counted(executor, func, *args):
        hops.append(func)
        return original(executor, func, *args)

    loop.run_in_executor = counted
    try:
        result = await work()
    finally:
        del loop.run_in_executor
    return result, len(hops)
