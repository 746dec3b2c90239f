"""psycopg splits a statement's text into its parameters (`%s` → `$n`) and keeps the split only
for statements of at most 50 parameters; the proposal's one writing statement on PostgreSQL
(budgets, call, operation, audit entry and events) carries more. The hot path's cursor keeps
the split of every statement it runs, so a proposal splits no text once its statements have
run once in the process."""

from __future__ import annotations

import pytest
from django.db import connection

from console.lib import django_private
from ledger.proposals import call_propose
from tests.fixtures.api import refund

pytestmark = [pytest.mark.postgres,
              pytest.mark.skipif("connection.vendor != 'postgresql'", reason="psycopg's parse of a statement")]


def propose(agent, run, n: int):
    return call_propose(principal=agent, task_id=run.task_id, call_id=f"call-{n}", step_id=f"step-{n}",
                        tool_name="payments.refund", arguments=refund(), expected_version=run.version,
                        fencing_token=run.fencing_token)


def test_a_proposal_splits_no_statement_text_once_its_statements_ran(agent, running_task, monkeypatch):
    from psycopg import _queries

    assert not django_private.queries_logged(connection)  # the hot path's own cursor, as in production
    assert propose(agent, running_task, 1).created
    splits = []
    split = _queries._query2pg_nocache

    def counted(query, encoding):
        splits.append(query)
        return split(query, encoding)

    monkeypatch.setattr(_queries, "_query2pg_nocache", counted)
    assert propose(agent, running_task, 2).created
    assert [query[:60] for query in splits] == []
