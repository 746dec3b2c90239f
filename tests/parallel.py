"""Loaded with `-p tests.parallel` (pyproject's addopts) so that it runs before pytest-django
reads the settings: under pytest-xdist, each worker gets Redis databases of its own, as
pytest-django gives it a test database of its own. Workers share one Redis server; without this,
the Celery workers and channel layers that two test workers start would take each other's
messages (a dispatch of one test's database run against another's).

Worker N adds 2·N to each Redis database number it was given (CHANNEL_LAYER_URL=…/0 and
CELERY_BROKER_URL=…/1 become …/2 and …/3 for gw1). Children started by the tests inherit the
rewritten environment."""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

REDIS_DATABASES = 16  # Redis's default `databases`
REDIS_URL_SETTINGS = ("CHANNEL_LAYER_URL", "CELERY_BROKER_URL", "RATE_LIMIT_CACHE_URL")


def worker_redis_url(url: str, worker: int) -> str:
    parts = urlsplit(url)
    if not parts.scheme.startswith("redis"):
        return url
    database = int(parts.path.lstrip("/") or 0) + 2 * worker
    if database >= REDIS_DATABASES:
        raise SystemExit(f"{url}: test worker gw{worker} would need Redis database {database}; "
                         f"use lower database numbers or fewer workers (-n)")
    return urlunsplit(parts._replace(path=f"/{database}"))


def _isolate_worker() -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return
    number = int(worker.removeprefix("gw"))
    for name in REDIS_URL_SETTINGS:
        if os.environ.get(name):
            os.environ[name] = worker_redis_url(os.environ[name], number)


_isolate_worker()
