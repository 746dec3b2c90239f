"""Shared fixtures: a tenant with an owner agent, reviewers of each tier, support staff, and an
outsider in another tenant — the cast every permission test needs."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.test import override_settings

from approvals.defaults import ensure_policy_defaults
from approvals.models import Tool
from console.lib.audit import SEAL_LOCK
from console.models import AgentPrincipal, Membership, Role, Tenant
from ledger.longpoll import Doorbell

# Fixtures and helpers shared by tests in several directories (the agent API's client and running
# task, the dispatcher's sandbox providers, the support console's operations). Nothing in them is
# autouse: a test module asks for what it needs.
pytest_plugins = ["tests.fixtures.api", "tests.fixtures.dispatch", "tests.fixtures.support"]

AGENT_TOKEN = "test-agent-token"
OUTSIDER_TOKEN = "test-outsider-token"


def make_user(username: str, tenant: Tenant | None, *roles: str, max_tier: int | None = None, **extra):
    user = get_user_model().objects.create_user(username=username, password="pw", **extra)
    for role in roles:
        Membership.objects.create(
            user=user, tenant=tenant, role=role, max_tier=max_tier if role == Role.REVIEWER else None
        )
    return user


def make_agent(tenant: Tenant, name: str, token: str) -> AgentPrincipal:
    agent = AgentPrincipal(tenant=tenant, name=name)
    agent.set_token(token)
    agent.save()
    agent.allowed_tools.set(Tool.objects.all())
    return agent


@pytest.fixture
def policy(db):
    ensure_policy_defaults()
    return {tool.name: tool for tool in Tool.objects.all()}


@pytest.fixture
def tenant(db) -> Tenant:
    return Tenant.objects.create(slug="acme", name="Acme")


@pytest.fixture
def other_tenant(db) -> Tenant:
    return Tenant.objects.create(slug="globex", name="Globex")


@pytest.fixture
def agent(policy, tenant) -> AgentPrincipal:
    return make_agent(tenant, "agent", AGENT_TOKEN)


@pytest.fixture
def outsider_agent(policy, other_tenant) -> AgentPrincipal:
    return make_agent(other_tenant, "outsider", OUTSIDER_TOKEN)


@pytest.fixture
def reviewer(tenant):
    return make_user("reviewer", tenant, Role.REVIEWER, max_tier=3)


@pytest.fixture
def senior(tenant):
    return make_user("senior", tenant, Role.REVIEWER, max_tier=4)


@pytest.fixture
def senior2(tenant):
    return make_user("senior2", tenant, Role.REVIEWER, max_tier=4)


@pytest.fixture
def support_user(tenant):
    return make_user("support", tenant, Role.SUPPORT)


@pytest.fixture
def outsider(other_tenant):
    """A reviewer of every tier — in another tenant."""
    return make_user("outsider", other_tenant, Role.REVIEWER, Role.SUPPORT, max_tier=4)


@pytest.fixture(autouse=True, scope="session")
def _in_process_broker():
    """Unit tests run dispatches explicitly; messages published by on_commit go nowhere.
    End-to-end tests start real workers with a real broker of their own."""
    from console.celery import app

    app.conf.broker_url = "memory://"
    app.conf.task_always_eager = False


@pytest.fixture(autouse=True)
def _urlconf_left_as_found():
    """A test that leaves the URLconf overridden breaks every later test of its process, far
    from it (mixing `@override_settings` with pytest-django's `settings` fixture does: the
    fixture's undo puts the decorator's override back). Caught here, at the test that did it."""
    from django.conf import settings

    before = settings.ROOT_URLCONF
    yield
    assert settings.ROOT_URLCONF == before, f"this test left ROOT_URLCONF = {settings.ROOT_URLCONF!r}"


class OneRoundPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    """The product's hasher with one round instead of a million. A hash names its rounds
    (`pbkdf2_sha256$1$…`), so a server or worker started by a test, with the product's own
    hashers, still verifies it (and upgrades it on first login)."""

    iterations = 1


@pytest.fixture(scope="session", autouse=True)
def one_round_password_hashes():
    """Every user the tests make costs a password hash, and one PBKDF2 hash at the product's
    strength is over half a second of CPU: a large share of the suite's time, testing nothing."""
    with override_settings(PASSWORD_HASHERS=["tests.conftest.OneRoundPBKDF2PasswordHasher"]):
        yield


@pytest.fixture(scope="session", autouse=True)
def flush_by_delete_on_postgresql():
    """After each transactional test Django empties every table by one TRUNCATE, which on
    PostgreSQL gives each of the ~50 tables and their indexes a new file: about 0.3 s per test,
    whatever it wrote. DELETE of the few rows a test wrote is a few milliseconds. The tables'
    triggers are set aside for the deletes (the event table is append-only; the pending counts
    would count them), then in force again for one more, empty, DELETE of the tables whose
    statement triggers TRUNCATE fired (the policy's generation gets a new token, as it did).
    The content types and permissions stay: Django writes the same rows again after every flush
    (its post-migrate signal), which cost more than the flush itself. A database user who may
    not set triggers aside (not a superuser) keeps TRUNCATE. tests/test_flush.py holds the end
    state to TRUNCATE's."""
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if not tables:
            return truncate(self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        # A stack's beat may be sealing the event log meanwhile: its lock first, or the sealer
        # (chain heads in the chains' order) and the flush (in the table's) can each hold a head
        # the other waits for.
        sealer = f"SELECT pg_advisory_xact_lock({SEAL_LOCK});"
        triggered = _tables_whose_truncate_fires_triggers(self.connection)
        if reset_sequences or triggered is None:
            return [sealer, *truncate(self, style, tables, reset_sequences=reset_sequences,
                                      allow_cascade=allow_cascade)]
        tables = [table for table in tables if table not in WRITTEN_AGAIN_AFTER_A_FLUSH]

        def delete(table: str) -> str:
            return f"{style.SQL_KEYWORD('DELETE FROM')} {style.SQL_FIELD(self.quote_name(table))};"

        return [sealer, "SET LOCAL session_replication_role = replica;", *map(delete, tables),
                "SET LOCAL session_replication_role = origin;", *map(delete, sorted(triggered & set(tables)))]

    DatabaseOperations.sql_flush = sql_flush
    yield
    DatabaseOperations.sql_flush = truncate


# Rows Django's post-migrate signal writes after every flush, the same each time.
WRITTEN_AGAIN_AFTER_A_FLUSH = frozenset({"django_content_type", "auth_permission"})
_TRUNCATE_TRIGGERS: dict[str, frozenset[str] | None] = {}


def _tables_whose_truncate_fires_triggers(connection) -> frozenset[str] | None:
    """The tables with statement triggers that fire on TRUNCATE (and on DELETE), read once per
    database; None when this user may not set triggers aside (not a superuser)."""
    name = connection.settings_dict["NAME"]
    if name not in _TRUNCATE_TRIGGERS:
        with connection.cursor() as cursor:
            cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
            superuser = bool(cursor.fetchone()[0])
            # tgtype: 8 fires on DELETE, 32 on TRUNCATE; 1 would be per row.
            cursor.execute("SELECT DISTINCT c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                           "WHERE NOT t.tgisinternal AND t.tgtype & 32 <> 0 AND t.tgtype & 8 <> 0 AND t.tgtype & 1 = 0")
            triggered = frozenset(relname for (relname,) in cursor.fetchall())
        _TRUNCATE_TRIGGERS[name] = triggered if superuser else None
    return _TRUNCATE_TRIGGERS[name]


@pytest.fixture
def waits(monkeypatch) -> list[tuple[float, str | None]]:
    """Each wait a long-poll or a proposal entered (`Doorbell.watch`): its seconds, and the
    status that ended it (None: it ran out). "Answered at once" is then no wait at all, not a
    stopwatch's reading."""
    seen: list[tuple[float, str | None]] = []
    real = Doorbell.watch

    async def watch(self, call_pk, baseline, wait, **kwargs):
        moved = await real(self, call_pk, baseline, wait, **kwargs)
        seen.append((wait, None if moved is None else moved[0]))
        return moved

    monkeypatch.setattr(Doorbell, "watch", watch)
    return seen


@pytest.fixture(scope="session")
def asgi_server(django_db_setup, django_db_blocker):
    """uvicorn serving console.asgi (HTTP and websockets) against the test database."""
    from tests.asgi import AsgiServer

    server = AsgiServer().start()
    yield server
    server.stop()


def pytest_collection_modifyitems(config, items):
    """Browser tests run last: Playwright's sync API keeps an event loop running in the main
    thread for the rest of the session, after which `async_to_sync` refuses to run there. Under
    pytest-xdist this holds in each worker because `make test` hands out whole modules in this
    order (`--dist loadscope --no-loadscope-reorder`)."""
    items.sort(key=lambda item: "/tests/browser/" in str(item.path))


@pytest.fixture
def model_inits(monkeypatch) -> list[type]:
    """The models whose `Model.__init__` ran during the test, in order: the hot path builds the
    rows it reads and writes without it."""
    from django.db.models import Model

    built: list[type] = []
    init = Model.__init__

    def counting(self, *args, **kwargs):
        built.append(type(self))
        init(self, *args, **kwargs)

    monkeypatch.setattr(Model, "__init__", counting)
    return built
