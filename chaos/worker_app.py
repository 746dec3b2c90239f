"""The Celery app a chaos worker or beat runs (`celery -A chaos.worker_app`, see chaos/worker.py):
the product's app, with the broker transport options the stack passes in the environment.

Only Celery's `-A` loads this module, in a chaos worker, after chaos/worker.py patched the clock;
the harness process never imports it (it would change the harness's own app).
"""

from __future__ import annotations

from chaos.worker_env import transport_options_from_env
from console.celery import app

_extra = transport_options_from_env()
if _extra:
    app.conf.broker_transport_options = {**app.conf.broker_transport_options, **_extra}

__all__ = ["app"]
