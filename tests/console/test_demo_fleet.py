"""The demo fleet (`manage.py demo_fleet`): a task waiting for a reviewer gives its place to a new
one, so a fresh `make run` where nobody approves anything keeps producing work."""

from __future__ import annotations

import threading

from django.core.management import call_command

from console.lib.procs import wait_until
from console.management.commands import demo_fleet


def test_tasks_waiting_for_a_reviewer_do_not_stop_the_fleet(monkeypatch):
    started: list[str] = []
    release = threading.Event()

    class WaitsForAReviewer:
        def __init__(self, client, name, log, tracer=None, waiting_for_person=None):
            self.name, self.waiting_for_person = name, waiting_for_person

        def run(self, scenario: str) -> str:
            started.append(self.name)
            self.waiting_for_person()
            release.wait(30)
            return f"{scenario}: confirmed"

    monkeypatch.setattr(demo_fleet, "FleetAgent", WaitsForAReviewer)
    fleet = threading.Thread(target=call_command, args=("demo_fleet",), daemon=True, kwargs=dict(
        url="http://127.0.0.1:9", agents=2, waiting=3, count=6, interval=0))
    fleet.start()
    try:
        # 2 places at work, 3 more for tasks waiting on a person: 5 start, the 6th waits for a place.
        wait_until(lambda: len(started) == 5, timeout=10, what="five tasks to start")
        assert not release.wait(0.3) and len(started) == 5
    finally:
        release.set()
    fleet.join(10)
    assert len(started) == 6 and not fleet.is_alive()
