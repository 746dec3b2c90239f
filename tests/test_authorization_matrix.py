"""The authorization matrix, generated from the URLconf: every URL pattern × anonymous, each
role of tenant A (reviewer, support, admin), tenant A's agent token, and tenant B's principals.
URL kwargs are filled with objects of tenant A. Each principal a route does not admit must get
a refusal (302 to a login page, 401, 403 or 404); tenant B's principals never get a 200 on
tenant A's objects, nor see them in their own lists. A URL pattern the matrix does not classify
fails the test, so a page added later without a decision here fails CI."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from approvals import stops as stop_services
from approvals.models import Stop
from console.models import Role
from ledger.proposals import call_propose
from tests.conftest import AGENT_TOKEN, OUTSIDER_TOKEN, make_user
from tests.factories import make_pending_approval
from tests.fixtures.api import call_body, refund, start_task

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_password_hasher")]

ANON, REVIEWER, SUPPORT, ADMIN, AGENT = "anonymous", "reviewer", "support", "admin", "agent"
B_REVIEWER, B_SUPPORT, B_ADMIN, B_AGENT = "b-reviewer", "b-support", "b-admin", "b-agent"
PRINCIPALS = (ANON, REVIEWER, SUPPORT, ADMIN, AGENT, B_REVIEWER, B_SUPPORT, B_ADMIN, B_AGENT)
PEOPLE_A = {REVIEWER, SUPPORT, ADMIN}
PEOPLE_B = {B_REVIEWER, B_SUPPORT, B_ADMIN}
EVERYONE = set(PRINCIPALS)


@dataclass(frozen=True)
class Rule:
    """Who is admitted (anyone else must be refused), with which method. A GET is sent to every
    principal: the admitted ones must not be refused, and tenant B's must not see tenant A's
    objects in what they get (their own lists)."""

    admitted: frozenset[str]
    method: str = "get"


def rule(admitted, method: str = "get") -> Rule:
    return Rule(frozenset(admitted), method)


PEOPLE = PEOPLE_A | PEOPLE_B
# Every named route, by "namespace:name". A POST route is refused or admitted on POST; only the
# principals it does not admit are sent (an admitted one would act).
MATRIX: dict[str, Rule] = {
    "home": rule(PEOPLE),  # a person is sent on to the dashboard; anyone else to the login page
    "dashboard": rule(PEOPLE),
    "approvals:inbox": rule(PEOPLE),
    "approvals:export_csv": rule(PEOPLE),
    "approvals:export_json": rule(PEOPLE),
    "approvals:detail": rule({REVIEWER, ADMIN}),
    "approvals:approve": rule({REVIEWER, ADMIN}, "post"),
    "approvals:reject": rule({REVIEWER, ADMIN}, "post"),
    "approvals:edit": rule({REVIEWER, ADMIN}),
    "audit:list": rule(PEOPLE),  # each sees the audited calls of their own tenants only
    "audit:review": rule({REVIEWER}, "post"),  # a reviewer of the call's tier; an admin only looks
    "operations:unknown": rule(PEOPLE),
    "operations:detail": rule(PEOPLE_A),
    "operations:query": rule(PEOPLE_A, "post"),
    "operations:confirm": rule(PEOPLE_A, "post"),
    "operations:retry": rule(PEOPLE_A, "post"),
    "operations:fail": rule(PEOPLE_A, "post"),
    "operations:escalate": rule(PEOPLE_A, "post"),
    "operations:compensate": rule(PEOPLE_A, "post"),
    "operations:compensated": rule(PEOPLE_A, "post"),
    "runs:list": rule(PEOPLE),
    "runs:detail": rule(PEOPLE_A),
    "runs:trace": rule(PEOPLE_A),
    "runs:control": rule(PEOPLE_A, "post"),
    "stops:page": rule(PEOPLE),
    "stops:create": rule(PEOPLE, "post"),  # a stop of the principal's own tenant
    "stops:resume": rule(PEOPLE_A, "post"),
    "login": rule(EVERYONE),
    "logout": rule(EVERYONE, "post"),
    "admin:login": rule(EVERYONE),
    "admin:logout": rule(EVERYONE, "post"),
    "api-schema": rule(EVERYONE),  # the public API description
    "api-docs": rule(EVERYONE),
    "api-task-create": rule({AGENT, B_AGENT}, "post"),  # a task of the agent's own tenant
    "api-task-get": rule({AGENT}),
    "api-task-lease": rule({AGENT}, "post"),
    "api-task-transition": rule({AGENT}, "post"),
    "api-call-propose": rule({AGENT}, "post"),
    "api-operation-get": rule({AGENT}),
    "api-tool-list": rule({AGENT, B_AGENT}),
    "api-call-get": rule({AGENT}),
    "api-stops": rule(PEOPLE),
    "api-stop-resume": rule(PEOPLE_A, "post"),
    "otlp-traces": rule({AGENT, B_AGENT}, "post"),  # spans of the agent's own tenant
    "metrics": rule(set()),  # its bearer token only, which no principal here holds
    "worker-health": rule(set()),
    "healthz": rule(EVERYONE),
}
# The admin site: staff only, and no principal here is staff (tenant roles are not).
ADMIN_SITE = rule(set())
# Admin routes given as regular expressions, and the URL each is tried at.
ADMIN_REGEX_URLS = {"app_list": "/admin/console/", "catch_all": "/admin/console/nothing-here/"}


def classify(route: str, name: str | None) -> Rule | None:
    if name in MATRIX:
        return MATRIX[name]
    if route.startswith("admin/"):
        return ADMIN_SITE
    return None


def refused(response) -> bool:
    if response.status_code in (401, 403, 404):
        return True
    return response.status_code == 302 and "login" in response.headers.get("Location", "")


def all_patterns(patterns=None, prefix: str = "", namespace: str = ""):
    for entry in get_resolver().url_patterns if patterns is None else patterns:
        if isinstance(entry, URLResolver):
            inner = f"{namespace}:{entry.namespace}".strip(":") if entry.namespace else namespace
            yield from all_patterns(entry.url_patterns, prefix + str(entry.pattern), inner)
        elif isinstance(entry, URLPattern):
            yield prefix + str(entry.pattern), f"{namespace}:{entry.name}".strip(":") if entry.name else None


@pytest.fixture
def world(agent, outsider_agent, tenant, other_tenant):
    people = {
        REVIEWER: make_user("a-reviewer", tenant, Role.REVIEWER, max_tier=4),
        SUPPORT: make_user("a-support", tenant, Role.SUPPORT),
        ADMIN: make_user("a-admin", tenant, Role.ADMIN),
        B_REVIEWER: make_user("b-reviewer", other_tenant, Role.REVIEWER, max_tier=4),
        B_SUPPORT: make_user("b-support", other_tenant, Role.SUPPORT),
        B_ADMIN: make_user("b-admin", other_tenant, Role.ADMIN),
    }
    approval = make_pending_approval(agent)
    operation = approval.operation
    # A call run at once under the audited tier, proposed before the agent is stopped.
    audited = start_task(agent)
    audit_id = call_propose(principal=agent, task_id=audited.task_id, call_id="audited", step_id="audited",
                            tool_name="payments.refund", arguments=refund(10), expected_version=audited.version,
                            fencing_token=audited.fencing_token).operation_id
    stop = stop_services.stop_create(tenant_id=tenant.pk, scope=Stop.Scope.AGENT, agent=agent,
                                     user=people[ADMIN], reason="matrix")
    run = start_task(agent)
    kwargs = {"approval_id": approval.pk, "operation_id": operation.pk, "task_id": run.task_id, "audit_id": audit_id,
              "call_id": operation.call_id, "stop_id": stop.stop_id, "action": "pause"}
    # Valid bodies, so a refusal is the authorization's and not the input validation's.
    bodies = {
        "api-call-propose": call_body(run),
        "api-task-transition": {"to": "waiting", "expected_version": run.version, "fencing_token": run.fencing_token},
        "api-task-lease": {"owner": "matrix", "ttl_seconds": 60},
    }
    return people, kwargs, bodies


def client_for(principal: str, people) -> Client:
    if principal in (AGENT, B_AGENT):
        token = AGENT_TOKEN if principal == AGENT else OUTSIDER_TOKEN
        return Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    client = Client()
    if principal != ANON:
        client.force_login(people[principal])
    return client


def fill(route: str, kwargs: dict[str, str]) -> str:
    def value(match):
        return str(kwargs.get(match.group(2), "1"))
    return "/" + re.sub(r"<(?:(\w+):)?(\w+)>", value, route)


def url_of(route: str, name: str | None, kwargs: dict[str, str]) -> str:
    if route.startswith("admin/") and "(?P<" in route:
        return ADMIN_REGEX_URLS["app_list" if name == "admin:app_list" else "catch_all"]
    return fill(route, kwargs)


def test_every_url_pattern_is_classified():
    unclassified = [route for route, name in all_patterns() if classify(route, name) is None]

    assert unclassified == [], "classify these in tests/test_authorization_matrix.py MATRIX"


# Transactional: the async views (api-call-get) read from another thread's connection, which
# sees only committed rows.
@pytest.mark.django_db(transaction=True)
def test_every_principal_a_url_does_not_admit_is_refused_and_every_admitted_one_gets_in(world):
    people, kwargs, bodies = world
    a_ids = [kwargs["approval_id"], kwargs["operation_id"], kwargs["task_id"], kwargs["audit_id"]]
    failures = []
    for route, name in all_patterns():
        rule_ = classify(route, name)
        url = url_of(route, name, kwargs)
        for principal in PRINCIPALS:
            if principal in rule_.admitted and rule_.method != "get":
                continue
            client = client_for(principal, people)
            if rule_.method == "post" and route.startswith(("api/", "v1/")):
                # A JSON body, so the API reaches its authorization and not a 415 before it.
                response = client.post(url, data=json.dumps(bodies.get(name, {})), content_type="application/json")
            else:
                response = getattr(client, rule_.method)(url)
            if principal not in rule_.admitted:
                if not refused(response):
                    failures.append(f"{rule_.method.upper()} {url} as {principal}: {response.status_code}")
            elif refused(response):
                # The control: an admitted principal is not refused, so the refusals are the checks'.
                failures.append(f"GET {url} as {principal} (admitted): {response.status_code}")
            elif response.status_code == 200 and principal in PEOPLE_B | {B_AGENT}:
                # Tenant B's own list: none of tenant A's objects in it.
                body = b"".join(response) if response.streaming else response.content
                leaked = [i for i in a_ids if i.encode() in body]
                if leaked:
                    failures.append(f"GET {url} as {principal} shows tenant A's {leaked}")

    assert failures == []


# The websocket routes (console/routing.py), by route: who may open a socket. A person of any
# tenant may open any stream; what it carries is filtered to the person's own tenants and roles
# (console/live.py events_after), so tenant B's socket on tenant A's object carries nothing of A.
WS_MATRIX: dict[str, frozenset[str]] = {
    "ws/live/<str:stream>/": frozenset(PEOPLE),
    "ws/live/<str:stream>/<str:arg>/": frozenset(PEOPLE),
}


def test_every_websocket_route_is_classified():
    from console.routing import websocket_urlpatterns

    assert sorted(str(p.pattern) for p in websocket_urlpatterns) == sorted(WS_MATRIX)


@pytest.mark.django_db(transaction=True)
def test_anonymous_and_agent_tokens_cannot_open_a_live_socket(agent, tenant, reviewer):
    from asgiref.sync import async_to_sync

    from console.asgi import application
    from console.live import STREAMS
    from tests.console.test_live import ORIGIN, WebsocketCommunicator, session_headers

    task_id = start_task(agent).task_id
    answers = {}
    person = session_headers(Client(), reviewer)

    async def scenario():
        for route in WS_MATRIX:
            for stream in STREAMS:
                path = "/" + route.replace("<str:stream>", stream).replace("<str:arg>", task_id)
                for principal, headers in ((ANON, [ORIGIN]),
                                           (AGENT, [ORIGIN, (b"authorization", f"Bearer {AGENT_TOKEN}".encode())])):
                    communicator = WebsocketCommunicator(application, path, headers=headers)
                    answers[(path, principal)] = await communicator.connect(timeout=10)
        # The control: the same path opens for a person, so the refusals above are the auth's.
        communicator = WebsocketCommunicator(application, "/ws/live/activity/", headers=person)
        opened.append(await communicator.connect(timeout=10))
        await communicator.disconnect(timeout=10)

    opened = []
    async_to_sync(scenario)()

    assert opened == [(True, None)]

    assert answers and all(answer == (False, 4403) for answer in answers.values()), answers
