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
from django.conf import settings
from django.middleware.csrf import _get_new_csrf_string
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from approvals import stops as stop_services
from approvals.models import Stop
from console.models import Role
from ledger.proposals import call_propose
from tests.conftest import AGENT_TOKEN, OUTSIDER_TOKEN, make_user
from tests.factories import make_pending_approval
from tests.fixtures.api import call_body, refund, start_task

pytestmark = pytest.mark.django_db

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
SUPPORT_A = {SUPPORT, ADMIN}
# Every named route, by "namespace:name". A POST route is refused or admitted on POST; only the
# principals it does not admit are sent (an admitted one would act).
MATRIX: dict[str, Rule] = {
    "home": rule(PEOPLE),  # a person is sent on to the dashboard; anyone else to the login page
    "dashboard": rule(PEOPLE),
    "approvals:inbox": rule(PEOPLE),
    "approvals:export_csv": rule(PEOPLE),
    "approvals:export_json": rule(PEOPLE),
    "approvals:detail": rule({REVIEWER, ADMIN}),
    # An admin reads a request; only a reviewer (of its tier) decides it.
    "approvals:approve": rule({REVIEWER}, "post"),
    "approvals:reject": rule({REVIEWER}, "post"),
    "approvals:edit": rule({REVIEWER, ADMIN}),
    "audit:list": rule(PEOPLE),  # each sees the audited calls of their own tenants only
    "audit:review": rule({REVIEWER}, "post"),  # a reviewer of the call's tier; an admin only looks
    "operations:unknown": rule(PEOPLE),
    "operations:detail": rule(PEOPLE_A),
    # A reviewer reads an operation; support staff and admins act on it (ledger.support.ACT_ROLES).
    "operations:query": rule(SUPPORT_A, "post"),
    "operations:confirm": rule(SUPPORT_A, "post"),
    "operations:retry": rule(SUPPORT_A, "post"),
    "operations:fail": rule(SUPPORT_A, "post"),
    "operations:escalate": rule(SUPPORT_A, "post"),
    "operations:compensate": rule(SUPPORT_A, "post"),
    "operations:compensated": rule(SUPPORT_A, "post"),
    "runs:list": rule(PEOPLE),
    "runs:detail": rule(PEOPLE_A),
    "runs:trace": rule(PEOPLE_A),
    "runs:control": rule(SUPPORT_A, "post"),
    "runs:reviews": rule(PEOPLE),  # each sees the tasks of the tenants where they review
    "runs:review": rule({REVIEWER}, "post"),  # a success review: reviewers of the task's tenant only
    "stops:page": rule(PEOPLE),
    "stops:create": rule(PEOPLE, "post"),  # a stop of the principal's own tenant
    "stops:resume": rule({ADMIN}, "post"),  # an agent's stop: its tenant's admins only
    # Tools are shared configuration: any person may read one; its use (agents, operations) is
    # shown for the person's own tenants only, so tenant B's people see none of tenant A's.
    "tools:detail": rule(PEOPLE),
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
    "api-stop-resume": rule({ADMIN}, "post"),
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


def refused_post(response) -> bool:
    """`refused`, except that a redirect to the login page is a refusal only when it asks to come
    back (`next=`): logging out succeeds by sending the person to the login page."""
    if response.status_code in (401, 403, 404):
        return True
    location = response.headers.get("Location", "")
    return response.status_code == 302 and "login" in location and "next=" in location


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
              "call_id": operation.call_id, "stop_id": stop.stop_id, "action": "pause",
              "tool_name": operation.tool.name,
              "decision": "confirm"}
    # Valid bodies, so a refusal is the authorization's and not the input validation's.
    bodies = {
        "api-call-propose": call_body(run),
        "api-task-transition": {"to": "waiting", "expected_version": run.version, "fencing_token": run.fencing_token},
        "api-task-lease": {"owner": "matrix", "ttl_seconds": 60},
        "approvals:reject": {"reason": "matrix"},  # a form: without its reason, a 400 before the role check
    }
    return people, kwargs, bodies


def client_for(principal: str, people, sessions: dict[str, str]) -> Client:
    """A fresh client (no cookie from an earlier answer) for each request. A person logs in once:
    later clients carry the same session (a login is most of a request's cost, and this test
    sends two thousand); the requests a person sends here are admitted GETs and refused POSTs,
    neither of which ends a session."""
    if principal in (AGENT, B_AGENT):
        token = AGENT_TOKEN if principal == AGENT else OUTSIDER_TOKEN
        return Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    client = Client()
    if principal in sessions:
        client.cookies[settings.SESSION_COOKIE_NAME] = sessions[principal]
    elif principal != ANON:
        client.force_login(people[principal])
        sessions[principal] = client.cookies[settings.SESSION_COOKIE_NAME].value
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
    # /mcp is outside the URLconf: test_mcp_admits_only_an_agents_token_and_a_session_only_to_its_own_agent.
    unclassified = [route for route, name in all_patterns() if classify(route, name) is None]

    assert unclassified == [], "classify these in tests/test_authorization_matrix.py MATRIX"


# Transactional: the async views (api-call-get) read from another thread's connection, which
# sees only committed rows.
@pytest.mark.django_db(transaction=True)
def test_every_principal_a_url_does_not_admit_is_refused_and_every_admitted_one_gets_in(world):
    people, kwargs, bodies = world
    a_ids = [kwargs["approval_id"], kwargs["operation_id"], kwargs["task_id"], kwargs["audit_id"]]
    failures, sessions = [], {}
    for route, name in all_patterns():
        rule_ = classify(route, name)
        url = url_of(route, name, kwargs)
        for principal in PRINCIPALS:
            if principal in rule_.admitted and rule_.method != "get":
                continue
            client = client_for(principal, people, sessions)
            if rule_.method == "post" and route.startswith(("api/", "v1/")):
                # A JSON body, so the API reaches its authorization and not a 415 before it.
                response = client.post(url, data=json.dumps(bodies.get(name, {})), content_type="application/json")
            elif rule_.method == "post":
                response = client.post(url, bodies.get(name, {}))
            else:
                response = client.get(url)
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


def csrf_client_for(principal: str, people) -> Client:
    """`client_for`, with CSRF checks on and a valid token (cookie and header), as a browser sends it."""
    token = _get_new_csrf_string()
    headers = {"HTTP_X_CSRFTOKEN": token}
    if principal in (AGENT, B_AGENT):
        headers["HTTP_AUTHORIZATION"] = f"Bearer {AGENT_TOKEN if principal == AGENT else OUTSIDER_TOKEN}"
    client = Client(enforce_csrf_checks=True, **headers)
    client.cookies[settings.CSRF_COOKIE_NAME] = token
    if principal not in (ANON, AGENT, B_AGENT):
        client.force_login(people[principal])
    return client


def post(client: Client, route: str, name: str | None, url: str, bodies) -> object:
    if route.startswith(("api/", "v1/")):
        # A JSON body, so the API reaches its authorization and not a 415 before it.
        return client.post(url, data=json.dumps(bodies.get(name, {})), content_type="application/json")
    return client.post(url, bodies.get(name, {}))  # mostly an empty form: invalid, or an action that needs nothing


@pytest.mark.django_db(transaction=True)
def test_every_principal_a_post_route_admits_is_not_refused_by_authorization(world):
    """The admitted side of every POST route: each admitted principal's POST, with a CSRF token
    as the page would send it, gets past authentication, the CSRF check and authorization — an
    empty or invalid form may be a 400 or the page again, never 401/403/404 or the login page.
    (Some act: a stop is resumed, a run paused, a session ended; later principals may then get
    a 409 for the same object, which is not a refusal either.)"""
    people, kwargs, bodies = world
    failures, sent = [], 0
    for route, name in all_patterns():
        rule_ = classify(route, name)
        if rule_.method != "post":
            continue
        url = url_of(route, name, kwargs)
        for principal in sorted(rule_.admitted):
            response = post(csrf_client_for(principal, people), route, name, url, bodies)
            sent += 1
            if refused_post(response):
                failures.append(f"POST {url} as {principal} (admitted): {response.status_code}")

    assert sent > 40  # every POST route's admitted principals were sent
    assert failures == [], "\n".join(failures)


@pytest.mark.django_db
def test_a_sessions_post_without_its_csrf_token_is_refused(world):
    """The control for the test above: the CSRF check is on, so the token it sends is what gets
    the POSTs in."""
    people, kwargs, _ = world
    client = csrf_client_for(ADMIN, people)
    del client.defaults["HTTP_X_CSRFTOKEN"]

    response = client.post(fill("operations/<str:operation_id>/retry/", kwargs))

    assert response.status_code == 403


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


# /mcp (Countersign as an MCP server) is mounted in console/asgi.py beside the URLconf, so the
# matrix above cannot see it: its principals by hand, against the served application. Only an
# agent's bearer token opens a session; a session belongs to the agent that opened it.
MCP_ACCEPT = "application/json, text/event-stream"
MCP_INITIALIZE = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "matrix", "version": "1"}}}
MCP_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}


@pytest.mark.django_db(transaction=True)
def test_mcp_admits_only_an_agents_token_and_a_session_only_to_its_own_agent(asgi_server, agent, outsider_agent,
                                                                             tenant):
    import httpx

    url = f"{asgi_server.url}/mcp"
    person = Client()
    person.force_login(make_user("a-admin", tenant, Role.ADMIN))
    session_cookie = {"sessionid": person.cookies["sessionid"].value}

    def post(body, headers=None, cookies=None):
        return httpx.post(url, json=body, headers={"Accept": MCP_ACCEPT, **(headers or {})}, cookies=cookies,
                          timeout=30)

    # The control: tenant A's agent opens a session.
    opened = post(MCP_INITIALIZE, {"Authorization": f"Bearer {AGENT_TOKEN}"})
    assert opened.status_code == 200, opened.text
    session = {"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}

    answers = {
        ANON: post(MCP_INITIALIZE).status_code,
        "wrong token": post(MCP_INITIALIZE, {"Authorization": "Bearer not-a-token"}).status_code,
        "console session": post(MCP_INITIALIZE, cookies=session_cookie).status_code,
        "console session on A's session": post(MCP_LIST, session, cookies=session_cookie).status_code,
        "anonymous on A's session": post(MCP_LIST, session).status_code,
        # Another tenant's agent presenting A's session ID: the session is not its own (the
        # SDK answers 404, as for a session that does not exist: nothing is learnt).
        "B's agent on A's session": post(MCP_LIST, {**session, "Authorization": f"Bearer {OUTSIDER_TOKEN}"}).status_code,
    }

    assert answers == {ANON: 401, "wrong token": 401, "console session": 401, "console session on A's session": 401,
                       "anonymous on A's session": 401, "B's agent on A's session": 404}
