"""Fixtures for the sandbox providers: real subprocesses, no Django, no mocks.

Run with ``.venv/bin/pytest tests/sandbox -p no:django`` while the Django project is not
importable; nothing here needs it.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# Make ``ledger`` importable however pytest was started (rootdir, -p no:django, IDE...).
_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from sandbox import client  # noqa: E402
from sandbox.process import SandboxProcess  # noqa: E402

# Short, so the timeout faults keep the suite fast; clients time out well before it, and a test
# that asks again while the first request is held has time to on a loaded machine (at 1 s, a
# retry sent 0.3 s after the request came after the hang under three test processes).
HANG_SECONDS = 3.0
CLIENT_TIMEOUT = 0.3


@pytest.fixture(scope="module")
def payments() -> Iterator[SandboxProcess]:
    with SandboxProcess.start("payments", hang_seconds=HANG_SECONDS, die_with_parent=True) as proc:
        yield proc


@pytest.fixture(scope="module")
def mail() -> Iterator[SandboxProcess]:
    with SandboxProcess.start("mail", hang_seconds=HANG_SECONDS, die_with_parent=True) as proc:
        yield proc


@pytest.fixture
def client_timeout() -> float:
    """How long test clients wait for a reply: well under the providers' hang."""
    return CLIENT_TIMEOUT


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Fresh keys per test, so tests sharing a module-scoped provider never see each other."""

    def make(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:10]}"

    return make


@pytest.fixture
def no_service_faults(payments: SandboxProcess) -> Iterator[None]:
    yield
    client.clear_fault(payments.base_url)
    client.set_latency(payments.base_url, 0)
