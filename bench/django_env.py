"""Django for a bench script run by itself: the configured DATABASE_URL, or a fresh SQLite file."""

from __future__ import annotations

import os
import tempfile

import django


def setup(prefix: str) -> None:
    if not os.environ.get("DATABASE_URL"):
        os.environ["DATABASE_URL"] = f"sqlite:///{tempfile.mkdtemp(prefix=prefix)}/bench.sqlite3"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    django.setup()
