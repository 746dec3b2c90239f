"""console.lib.procs.supervise: what make run and the chaos stack do every half second — start
again a child that exited, stop and start again one that is alive but stalled."""

from __future__ import annotations

import sys

from console.lib.procs import Child, supervise


def sleeper(name: str) -> Child:
    return Child(name, [sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_child_that_exited_is_started_again(tmp_path):
    child = Child("quitter", [sys.executable, "-c", "pass"]).start(log_dir=tmp_path)
    child.popen.wait()
    first = child.popen.pid
    why = []
    try:
        supervise([child], log_dir=tmp_path, on_restart=lambda c, reason: why.append((c.name, reason)))
        assert child.popen.pid != first
        assert why == [("quitter", "exited (0)")]
    finally:
        child.stop()


def test_a_stalled_child_is_stopped_and_started_again_and_a_moving_one_is_left_alone(tmp_path):
    stuck, moving = sleeper("stuck").start(log_dir=tmp_path), sleeper("moving").start(log_dir=tmp_path)
    before = {c.name: c.popen for c in (stuck, moving)}
    why = []
    try:
        supervise([stuck, moving], log_dir=tmp_path, stalled=lambda c: c.name == "stuck",
                  on_restart=lambda c, reason: why.append((c.name, reason)))
        assert before["stuck"].poll() is not None and stuck.alive and stuck.popen is not before["stuck"]
        assert moving.popen is before["moving"] and moving.alive
        assert why == [("stuck", "is alive but made no progress")]
    finally:
        stuck.stop()
        moving.stop()
