"""ledger.seams: a no-op in the product, a hook a harness installs (the chaos workers do)."""

from __future__ import annotations

import ast
from pathlib import Path

from ledger import dispatcher, seams


def test_a_seam_does_nothing_without_a_hook():
    assert seams.installed() is None
    assert seams.seam("before_provider_call", "op-1") is None


def test_an_installed_hook_runs_at_every_seam_and_uninstalling_restores_the_no_op():
    calls = []
    previous = seams.install(lambda name, operation_id: calls.append((name, operation_id)))
    try:
        assert previous is None
        # The dispatcher's own name for it, bound at import: installing must still reach it.
        dispatcher.seam("before_dispatch_commit", "op-1")
        seams.seam("after_provider_call", "op-2")
    finally:
        seams.install(previous)
    assert calls == [("before_dispatch_commit", "op-1"), ("after_provider_call", "op-2")]
    assert seams.installed() is None
    dispatcher.seam("before_dispatch_commit", "op-3")
    assert len(calls) == 2


def test_the_product_imports_no_test_harness():
    """chaos/ and sandbox/ are harnesses: only the management commands that run them (the project
    package wiring things together) may import them."""
    root = Path(__file__).resolve().parents[2]
    offenders = []
    for package in ("ledger", "runs", "approvals", "console"):
        for path in (root / package).rglob("*.py"):
            if path.parent == root / "console" / "management" / "commands":
                continue
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                offenders += [f"{path.relative_to(root)}: {name}" for name in names
                              if name.split(".")[0] in ("chaos", "sandbox")]
    assert offenders == []
