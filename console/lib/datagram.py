"""One wake-up datagram to a local UNIX socket, never blocking: how a process tells another on
the same machine to look now (the embedded broker's consumers, the embedded server's doorbell).
The datagram carries nothing; what it announces is already written where the listener reads."""

from __future__ import annotations

import os
import socket

_sender: tuple[int, socket.socket] | None = None  # one socket per process (a fork makes its own)


def send(path: str) -> bool:
    """One datagram to `path`. False when nobody is bound there any more (a stale socket);
    True otherwise, also when the path is gone or its queue is full: the listener then has
    datagrams waiting, or looks anyway at its fallback interval."""
    global _sender
    if _sender is None or _sender[0] != os.getpid():
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        _sender = (os.getpid(), sock)
    try:
        _sender[1].sendto(b"\0", path)
    except ConnectionRefusedError:
        return False
    except OSError:
        pass  # gone meanwhile (ENOENT), or its queue of datagrams is full (EAGAIN)
    return True
