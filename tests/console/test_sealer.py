"""The sealer: on PostgreSQL the writers leave their event rows unsealed and beat runs
`console.seal_events` every EVENT_SEAL_SECONDS to link them; `audit_verify` seals what is left
before it checks. SQLite seals at insert, so beat does not run the sealer there."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection

from console import tasks
from console.lib import audit
from console.lib.transitions import record_event
from console.models import Event

ROOT = Path(__file__).resolve().parents[2]
postgres_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite seals at insert")


def written(tenant, n: int = 3) -> list[Event]:
    return [record_event(entity="task", entity_id=f"t{i}", tenant_id=tenant.pk, kind=Event.Kind.CREATED,
                         to_status="running", actor="agent:a") for i in range(n)]


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_beats_sealer_links_the_rows_committed_since_its_last_run(tenant):
    rows = written(tenant)
    assert not Event.objects.filter(pk__in=[r.pk for r in rows], chain_seq__isnull=False).exists()

    assert tasks.seal_events.apply().get() == 3
    assert tasks.seal_events.apply().get() == 0

    seqs = list(Event.objects.filter(pk__in=[r.pk for r in rows]).order_by("id").values_list("chain_seq", flat=True))
    assert seqs == [1, 2, 3]
    assert audit.verify_chain(tenant.pk) is None


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_audit_verify_seals_what_the_sealer_has_not_reached_yet(tenant):
    written(tenant, 2)
    out = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("audit_verify", stdout=out)

    assert exited.value.code == 0, out.getvalue()
    assert "2 row(s) sealed before the check." in out.getvalue()
    assert not Event.objects.filter(chain_seq__isnull=True).exists()


@pytest.mark.django_db
def test_sqlite_seals_each_row_at_insert_postgresql_leaves_it_to_the_sealer(tenant):
    rows = written(tenant, 2)
    at_insert = connection.vendor == "sqlite"
    assert all(bool(Event.objects.get(pk=r.pk).chain_seq) == at_insert for r in rows)
    assert audit.seal_pending() == (0 if at_insert else 2)
    assert audit.verify_chain(tenant.pk) is None


def beat_schedule(tmp_path, database_url: str) -> dict:
    """The beat schedule the settings build for this database, read in a fresh process."""
    environment = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
    environment.update(DATABASE_URL=database_url, COUNTERSIGN_VAR_DIR=str(tmp_path), PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run([sys.executable, "-c", "import json, console.settings as s; "
                           "print(json.dumps(s.CELERY_BEAT_SCHEDULE))"],
                          cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_beat_runs_the_sealer_on_postgresql_only(tmp_path):
    assert beat_schedule(tmp_path, "postgres://postgres@127.0.0.1:5432/countersign")["event-seal"] == {
        "task": "console.seal_events", "schedule": 1.0}
    assert "event-seal" not in beat_schedule(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite3'}")
