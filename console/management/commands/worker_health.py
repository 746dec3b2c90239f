"""`python manage.py worker_health [--worker NAME] [--json]`: the workers' liveness for a probe.

Exit status, for systemd or a container orchestrator's liveness probe:

- 0: healthy — a worker is alive, and due work is moving (or there is none);
- 1: stalled — due work has waited WORKER_STALL_SECONDS and no live worker (or the named
  worker) finished a task for as long: restart it;
- 2: no live worker (or the named one has no recent heartbeat).

`--worker` checks one Celery node (`%h` is this host's name, as Celery expands it), for a probe
per worker container. The same verdict is served as JSON at `/healthz/workers`.
"""

from __future__ import annotations

import json
import socket

from django.core.management.base import BaseCommand

from ledger.liveness import liveness_report

HEALTHY, STALLED, NO_WORKER = 0, 1, 2


class Command(BaseCommand):
    help = "Exit 0 if the workers make progress, 1 if due work waits and none does, 2 if no worker is alive."

    def add_arguments(self, parser):
        parser.add_argument("--worker", default="", help="One Celery node name, e.g. worker1@%%h.")
        parser.add_argument("--json", action="store_true", dest="as_json", help="Print the whole report as JSON.")

    def handle(self, *args, worker: str = "", as_json: bool = False, **options):
        report = liveness_report()
        name = worker.replace("%h", socket.gethostname())
        if name:
            states = [w for w in report.workers if w.name == name]
            code = (NO_WORKER if not states or not states[0].alive else STALLED if states[0].stalled else HEALTHY)
        else:
            code = NO_WORKER if not report.live_workers else STALLED if report.stalled else HEALTHY
        if as_json:
            self.stdout.write(json.dumps({**report.as_dict(), "exit_code": code}, indent=2))
        else:
            self.stdout.write(_summary(report, name, code))
        raise SystemExit(code)


def _summary(report, name: str, code: int) -> str:
    verdict = {HEALTHY: "healthy", STALLED: "STALLED", NO_WORKER: "NO LIVE WORKER"}[code]
    oldest = "none" if report.oldest_due_seconds is None else f"{report.oldest_due_seconds:.0f} s"
    lines = [f"{verdict}{f' ({name})' if name else ''}: {report.due_operations} due, oldest {oldest}"]
    for w in report.workers:
        progressed = "never" if w.progressed_seconds_ago is None else f"{w.progressed_seconds_ago:.0f} s ago"
        state = "stalled" if w.stalled else "alive" if w.alive else "gone"
        lines.append(f"  {w.name} [{w.pool}; {','.join(w.queues)}] {state}, last progress {progressed}")
    return "\n".join(lines)
