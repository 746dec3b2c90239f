"""The product's settings, plus the bare views of bench/request_path.py (bench only).

`bench/request_path.py` starts `run_embedded` with DJANGO_SETTINGS_MODULE pointing here, so the
server, worker, beat and fleet it starts are the product's own, with the same middleware and
settings; the only difference is the URLconf, which adds two views that do nothing. The product
has no such endpoint."""

from __future__ import annotations

from console.settings import *  # noqa: F403 - the product's settings, unchanged

ROOT_URLCONF = "bench.request_path_urls"
