"""The agent API against its own OpenAPI schema (GET /api/schema/): schemathesis generates
requests for every operation from the schema — valid ones and invalid ones — and sends them to
the application in-process (WSGI), as tenant A's agent and as nobody. Every answer must be no
server error, a status code the operation documents, the content type it documents, and a body
its schema admits. Examples are bounded (a fixed number per operation and mode, no example
database, a fixed seed), so the test costs the same on every run and in CI on both databases.

Requests that reach real objects are sent too: the agent's running task, its operation and its
call, so the answers past the 404s (leases, transitions, proposals, the call long-poll) are
checked as well."""

from __future__ import annotations

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, given, seed, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.conftest import AGENT_TOKEN
from tests.factories import make_pending_approval
from tests.fixtures.api import start_task

# The checks the answers must pass. Left out: `positive_data_acceptance` (a request the schema
# admits gets a 2xx): the schema cannot state every input check in OpenAPI 3.0's regular
# expressions — a call ID is checked with `str.isprintable` (Unicode categories, unassigned code
# points included) — so generated IDs the schema admits are rightly refused. The mismatches it
# found that the schema can state were fixed (tests/console/test_api_schema.py). And
# `negative_data_rejection` (a request the schema refuses gets a 4xx): the schema is stricter
# than the server on purpose where a limit is checked after trimming or capping (a wait over
# 30 seconds is taken as 30).
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          response_headers_conformance]
EXAMPLES = {GenerationMode.POSITIVE: 10, GenerationMode.NEGATIVE: 8}
ANONYMOUS_EXAMPLES = 4
KNOWN_OBJECT_EXAMPLES = 6


def _run(operation, mode: GenerationMode, headers: dict[str, str], examples: int, **fixed) -> list[str]:
    """Send `examples` generated requests for one operation; the failures schemathesis reports."""

    @seed(20261201)
    @settings(max_examples=examples, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode, **fixed))
    def send(case):
        case.call_and_validate(headers=headers, checks=CHECKS)

    try:
        send()
    except (Exception, BaseExceptionGroup) as failure:  # noqa: BLE001 - every operation is reported
        return [f"{operation.label} ({mode.value}, {sorted(headers) or 'anonymous'}):\n{failure}"]
    return []


def _operations():
    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", get_wsgi_application())
    return [result.ok() for result in schema.get_all_operations()]


# Transactional: the async long-poll reads from another thread's connection.
@pytest.mark.django_db(transaction=True)
def test_every_operation_answers_as_its_schema_says_to_generated_requests(agent):
    run = start_task(agent)
    operation = make_pending_approval(agent).operation
    known = {"task_id": run.task_id, "operation_id": operation.pk, "call_id": operation.call_id}
    as_agent = {"Authorization": f"Bearer {AGENT_TOKEN}"}
    operations = _operations()
    failures = []
    for api_operation in operations:
        for mode, examples in EXAMPLES.items():
            failures += _run(api_operation, mode, as_agent, examples)
        failures += _run(api_operation, GenerationMode.POSITIVE, {}, ANONYMOUS_EXAMPLES)
        names = {p.name for p in api_operation.path_parameters}
        if names and names <= set(known):
            # The long-poll of a real call: wait=0, or each example would wait up to 30 s.
            query = {"wait": 0} if "call_id" in names else None
            failures += _run(api_operation, GenerationMode.POSITIVE, as_agent, KNOWN_OBJECT_EXAMPLES,
                             path_parameters={name: known[name] for name in names}, query=query)

    assert len(operations) >= 11  # the control: the schema was read and lists the agent API
    assert failures == [], "\n\n".join(failures)
