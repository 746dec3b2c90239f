"""A Celery app on the embedded broker's transport and nothing else (no Django, no database), for
the tests that run a real worker on it (tests/console/test_fs_broker_wake.py):

    FS_BROKER_TEST_FOLDER=<folder> celery -A tests.console.fs_broker_worker worker -Q <queue>

Both the fallback listing and kombu's polling are a minute apart, so a message picked up
within seconds was picked up because something rang.
"""

from __future__ import annotations

import os
from pathlib import Path

from celery import Celery

FOLDER = Path(os.environ.get("FS_BROKER_TEST_FOLDER", "."))
QUIET_SECONDS = 60.0


def transport_options(folder: Path) -> dict:
    return {"data_folder_in": str(folder / "queue"), "data_folder_out": str(folder / "queue"),
            "control_folder": str(folder / "control"), "processed_folder": str(folder / "processed"),
            "polling_interval": QUIET_SECONDS, "fallback_interval": QUIET_SECONDS}


def make_app(folder: Path) -> Celery:
    # Not the process's current app: imported by a test, it would take over the product's
    # shared tasks (their publishes would go to this app's folders).
    app = Celery("fs_broker_test", broker="filesystem://", fixups=[], set_as_current=False)
    app.conf.update(
        broker_transport="console.lib.fs_broker:Transport",
        broker_transport_options=transport_options(folder),
        # As the product runs it (console/settings.py).
        worker_pool="threads",
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        worker_hijack_root_logger=False,
    )
    return app


app = make_app(FOLDER)


@app.task(name="fs_broker_test.touch")
def touch(name: str) -> None:
    # Renamed into place: the test reads it as soon as it exists.
    (FOLDER / f"{name}.tmp").write_text(str(os.getpid()))
    os.replace(FOLDER / f"{name}.tmp", FOLDER / "done" / name)
