"""A full garbage collection of a loaded Django process walks every object its imports made
(about 180,000 here): over 100 ms with the GIL held, which every request, ring and dispatch of
that process waits for (it was the agent's slowest call, in the proposal's publish and in the
worker's pickup). The server and the worker move what start-up made out of the collector's
sight (`gc.freeze()`), so a full collection walks only what came after."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Far more objects than a process makes outside its imports before this point.
STARTUP_OBJECTS = 50_000


def freeze_count_after(code: str) -> int:
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.strip().splitlines()[-1])


def test_the_server_freezes_what_start_up_made():
    assert freeze_count_after("import gc, console.asgi; print(gc.get_freeze_count())") > STARTUP_OBJECTS


def test_a_worker_freezes_what_start_up_made_when_ready():
    code = ("import gc, django; from console.celery import app; django.setup(); app.loader.import_default_modules(); "
            "from celery.signals import worker_ready; before = gc.get_freeze_count(); "
            "worker_ready.send(sender=None); print(gc.get_freeze_count() - before)")
    assert freeze_count_after(code) > STARTUP_OBJECTS


def test_a_prefork_child_freezes_what_it_inherited_and_made():
    code = ("import gc, django; from console.celery import app; django.setup(); "
            "from celery.signals import worker_process_init; worker_process_init.send(sender=None); "
            "print(gc.get_freeze_count())")
    assert freeze_count_after(code) > STARTUP_OBJECTS
