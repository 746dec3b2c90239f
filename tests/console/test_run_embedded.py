"""`make run` (the run_embedded command): a port already taken is named in one sentence, with
how to pick another, before anything starts (a probe got a traceback)."""

from __future__ import annotations

import socket

import pytest
from django.core.management import CommandError, call_command


@pytest.fixture
def taken_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize("offset", [0, 1, 2])
def test_a_taken_port_is_named_with_how_to_choose_another(settings, tmp_path, taken_port, offset):
    settings.EMBEDDED = True
    settings.VAR_DIR = tmp_path
    settings.PORT = taken_port - offset

    with pytest.raises(CommandError) as raised:
        call_command("run_embedded", "--no-fleet")

    message = str(raised.value)
    assert f"Port {taken_port} is in use" in message
    assert "PORT=" in message
    assert not (tmp_path / "logs").exists()  # nothing was started
