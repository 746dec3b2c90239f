"""An HTTP POST to an address someone typed into the admin, which must not reach inside.

A webhook URL is chosen by whoever configures an agent; sent from the worker, it could reach
the machine's own services, the cloud's metadata endpoint or the private network (server-side
request forgery). So the check happens where the connection is made, on the address actually
connected to: the host name is resolved once, every address it resolves to is checked, and
the socket is opened to a checked address (never resolved again, so a name that answers a
public address to the check and a private one to the connect — DNS rebinding — gains nothing).
TLS still verifies the certificate against the URL's host name. Redirects are not followed
(a 3xx is an answer like any other) and no proxy from the environment is used.

`allow_private=True` (embedded mode, tests with a receiver on loopback) lifts the address check,
nothing else.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import certifi
import httpcore

ALLOWED_SCHEMES = ("http", "https")
BODY_PREVIEW_BYTES = 500


class RefusedAddress(Exception):
    """The URL is not one this process may call (scheme, or a non-public address)."""


class SendFailed(Exception):
    """No answer: the connection failed or timed out (or the URL could not be called)."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: str
    duration_ms: int


def is_public(address: str) -> bool:
    """A globally routable unicast address. Loopback, private (RFC 1918, ULA), link-local
    (169.254/16 with the metadata endpoint, fe80::/10), shared (100.64/10), multicast,
    reserved and unspecified are not; an IPv4 address mapped into IPv6 is judged as IPv4."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def check_url(url: str) -> None:
    """Refuses what no setting allows: a scheme other than http(s), no host, credentials in
    the URL."""
    parts = urlsplit(url)
    if parts.scheme not in ALLOWED_SCHEMES:
        raise RefusedAddress(f"only {' and '.join(ALLOWED_SCHEMES)} URLs are called, not {parts.scheme or 'none'}")
    if not parts.hostname:
        raise RefusedAddress("the URL has no host")
    if parts.username or parts.password:
        raise RefusedAddress("the URL carries credentials; sign with the secret instead")


class GuardedBackend(httpcore.NetworkBackend):
    """httpcore's synchronous backend, connecting only to addresses `is_public` accepts."""

    def __init__(self, *, allow_private: bool) -> None:
        self.allow_private = allow_private
        self.inner = httpcore.SyncBackend()
        self.connected_to: str | None = None

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Any = None) -> httpcore.NetworkStream:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from exc
        addresses = list(dict.fromkeys(info[4][0] for info in infos))
        refused = [a for a in addresses if not is_public(a)]
        if refused and not self.allow_private:
            # One private answer refuses the name: which address a client picks is not ours to choose.
            raise RefusedAddress(f"{host} resolves to a non-public address ({', '.join(refused)})")
        last: Exception | None = None
        for address in addresses:
            try:
                stream = self.inner.connect_tcp(address, port, timeout=timeout, local_address=local_address,
                                                socket_options=socket_options)
            except httpcore.ConnectError as exc:
                last = exc
                continue
            self.connected_to = address
            return stream
        raise last or httpcore.ConnectError(f"{host} has no address")

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Any = None) -> httpcore.NetworkStream:
        raise RefusedAddress("unix sockets are not called")

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)


def _ssl_context() -> ssl.SSLContext:
    return ssl.create_default_context(cafile=certifi.where())


def post(url: str, *, content: bytes, headers: dict[str, str], timeout: float,
         allow_private: bool = False) -> Answer:
    """POST `content` to `url`. Returns the answer whatever its status; raises RefusedAddress
    (the URL or its addresses are refused: nothing was sent) or SendFailed (no answer)."""
    check_url(url)
    backend = GuardedBackend(allow_private=allow_private)
    started = time.monotonic()
    with httpcore.ConnectionPool(ssl_context=_ssl_context(), network_backend=backend, max_connections=1) as pool:
        try:
            with pool.stream("POST", url, headers=list(headers.items()), content=content,
                             extensions={"timeout": {"connect": timeout, "read": timeout,
                                                     "write": timeout, "pool": timeout}}) as response:
                status, body = response.status, _preview(response)
        except httpcore.TimeoutException as exc:
            raise SendFailed(f"timed out after {timeout:g} s ({type(exc).__name__})") from exc
        except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol) as exc:
            raise SendFailed(f"{type(exc).__name__}: {exc}") from exc
    return Answer(status=status, body=body, duration_ms=round((time.monotonic() - started) * 1000))


def _preview(response: httpcore.Response) -> str:
    """The first bytes of the answer, for the record; the rest is not read (a receiver may
    answer with anything, of any size)."""
    body = b""
    for chunk in response.iter_stream():
        body += chunk
        if len(body) >= BODY_PREVIEW_BYTES:
            break
    return body[:BODY_PREVIEW_BYTES].decode("utf-8", "replace")
