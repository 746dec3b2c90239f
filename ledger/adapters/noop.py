"""An in-process provider that always succeeds: the benchmark's baseline and a test double
that is a real adapter (it counts its effects)."""

from __future__ import annotations

import threading
from typing import Any

from ledger.adapters.base import ABSENT, FOUND, Outcome, QueryAnswer, known_success


class NoopAdapter:
    name = "noop"
    can_query = True

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.effects: dict[str, dict[str, Any]] = {}

    def execute(self, arguments: dict[str, Any], *, key: str, timeout: float) -> Outcome:
        with self._lock:
            self.effects.setdefault(key, dict(arguments))
        return known_success(receipt={"remote_id": f"noop-{key}", "provider": "noop"}, code="200")

    def query(self, *, key: str, timeout: float) -> QueryAnswer:
        with self._lock:
            found = key in self.effects
        return QueryAnswer(FOUND, receipt={"remote_id": f"noop-{key}", "provider": "noop"}) if found else QueryAnswer(ABSENT)

    def preview(self, arguments: dict[str, Any]) -> dict[str, Any] | None:
        return None
