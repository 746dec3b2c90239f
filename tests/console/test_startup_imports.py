"""What a process pays before its first piece of work. Every worker, beat, management command
and test subprocess starts Django; the MCP SDK alone took over a second of that start-up (its
pydantic models), for tools most deployments never configure. A process imports it when it
first runs or imports an MCP tool; the ASGI server, which serves agents over MCP, imports it
at start-up so no agent's first request waits for it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SDK = ("mcp", "mcp_types")


def sdk_modules_after(code: str) -> list[str]:
    probe = f"{code}\nimport sys; print(sorted(m for m in sys.modules if m.split('.')[0] in {SDK!r}))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return eval(out.stdout.strip().splitlines()[-1])  # noqa: S307 - our own probe's list of names


def test_a_worker_starts_without_the_mcp_sdk():
    code = ("import django; from console.celery import app; django.setup(); app.loader.import_default_modules(); "
            "import ledger.dispatcher, ledger.reconcile, ledger.support, approvals.admin, approvals.views")
    assert sdk_modules_after(code) == []


def test_an_mcp_tool_still_gets_its_adapter():
    code = ("import django; django.setup(); from approvals.models import Tool; from ledger.adapters import adapter_for; "
            "adapter = adapter_for(Tool(name='t.x', adapter='mcp')); print(type(adapter).__name__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "McpToolAdapter"


def test_the_server_imports_the_mcp_sdk_at_start_up():
    assert "mcp" in sdk_modules_after("import console.asgi")
