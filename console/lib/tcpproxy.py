"""A small TCP load balancer for the local cluster: each client connection goes to the next
backend in turn, skipping backends that refuse the connection.

It works below HTTP, so websockets, streaming responses and keep-alive pass through untouched,
and one connection always stays with one server (as sticky as an agent's long-poll needs).
Not for production: there a real load balancer sits in front of the ASGI servers.

    python -m console.lib.tcpproxy --listen 8000 --backend 127.0.0.1:8010 --backend 127.0.0.1:8011
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import signal

CHUNK = 64 * 1024


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


class Balancer:
    def __init__(self, backends: list[tuple[str, int]], *, connect_timeout: float = 2.0) -> None:
        if not backends:
            raise ValueError("at least one backend")
        self.backends = backends
        self.connect_timeout = connect_timeout
        self._turn = itertools.cycle(range(len(backends)))

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        for _ in range(len(self.backends)):
            host, port = self.backends[next(self._turn)]
            try:
                return await asyncio.wait_for(asyncio.open_connection(host, port), self.connect_timeout)
            except (OSError, TimeoutError):
                continue  # that server is down: the next one takes the connection
        return None

    async def handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        upstream = await self._connect()
        if upstream is None:
            client_writer.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            with contextlib.suppress(Exception):
                await client_writer.drain()
                client_writer.close()
            return
        server_reader, server_writer = upstream
        await asyncio.gather(_pipe(client_reader, server_writer), _pipe(server_reader, client_writer))


async def serve(host: str, port: int, backends: list[tuple[str, int]]) -> None:
    balancer = Balancer(backends)
    server = await asyncio.start_server(balancer.handle, host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m console.lib.tcpproxy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--listen", type=int, required=True)
    parser.add_argument("--backend", action="append", type=_address, required=True, help="host:port, repeatable")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.host, args.listen, args.backend))


if __name__ == "__main__":
    main()
