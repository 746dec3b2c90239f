"""Countersign settings: one module, typed environment variables (see .env.example).

No variable set means embedded mode: SQLite in WAL mode, a broker on the local file system,
an in-process channel layer, the demo identities. Production (COUNTERSIGN_ENV=production)
refuses an insecure secret key and DEBUG.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from csp.constants import NONCE
from django.core.exceptions import ImproperlyConfigured
from environs import Env
from marshmallow import ValidationError
from marshmallow.validate import OneOf, Range

# environs reads and types each variable; a bad value raises EnvValidationError at once, naming
# the variable, its value's problem and (through marshmallow's validators) what was expected.
env = Env(expand_vars=False)


@env.parser_for("csv")
def _csv(value: str | list[str]) -> list[str]:
    """A comma-separated list, items stripped, blanks dropped ("" is the empty list)."""
    items = value.split(",") if isinstance(value, str) else value
    return [item.strip() for item in items if item.strip()]


def _schemes(*allowed: str):
    """A validator: the value is a URL with one of these schemes."""

    def validate(value: str) -> None:
        scheme = value.split("://", 1)[0] if "://" in value else ""
        if scheme not in allowed:
            raise ValidationError(f"Must be a URL with a scheme among {', '.join(allowed)}.")

    return validate


BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env.str("COUNTERSIGN_VAR_DIR", str(BASE_DIR / "var")))

COUNTERSIGN_ENV = env.str("COUNTERSIGN_ENV", "embedded", validate=OneOf(("embedded", "production")))
EMBEDDED = COUNTERSIGN_ENV == "embedded"
VAR_DIR.mkdir(parents=True, exist_ok=True)

_INSECURE_KEY = "insecure-embedded-key-do-not-use-in-production"
SECRET_KEY = env.str("SECRET_KEY", _INSECURE_KEY)
# Off by default in both modes, `make run` included: errors show the product's own pages
# (templates/404.html, 403.html, 500.html). A developer turns it on with DEBUG=1 make run.
DEBUG = env.bool("DEBUG", False)
ALLOWED_HOSTS = env.csv("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = env.csv("CSRF_TRUSTED_ORIGINS", [])

# The HMAC-SHA256 key of approval receipts (console/lib/audit.py, docs/security.md). Embedded:
# derived from SECRET_KEY when unset. Production: required, so rotating SECRET_KEY (sessions)
# never silently voids every receipt an auditor holds.
AUDIT_SIGNING_KEY = env.str("AUDIT_SIGNING_KEY", "") or (
    hmac.new(SECRET_KEY.encode(), b"countersign-audit-signing-key", hashlib.sha256).hexdigest() if EMBEDDED else "")

if not EMBEDDED:
    if SECRET_KEY == _INSECURE_KEY or len(SECRET_KEY) < 40 or SECRET_KEY.startswith("insecure"):
        raise ImproperlyConfigured(
            "SECRET_KEY must be set to a random value of at least 40 characters in production."
        )
    if DEBUG:
        raise ImproperlyConfigured("DEBUG must be false in production (COUNTERSIGN_ENV=production).")
    if len(AUDIT_SIGNING_KEY) < 32:
        raise ImproperlyConfigured("AUDIT_SIGNING_KEY must be set to a random value of at least 32 characters "
                                   "in production.")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # For OpClass in an index (the inbox's trigram index, approvals.models): it registers the
    # operator class as an index expression's wrapper. Harmless on SQLite.
    "django.contrib.postgres",
    "channels",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "template_partials",
    "axes",
    "console",
    "runs",
    "approvals",
    "ledger",
]

# The web server loads these with their hooks on the event loop (console/middleware.py: Django's
# MiddlewareMixin sends each hook to a thread). Django's names stay here: its deploy checks look
# for its middleware by name.
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # A database error in the API's plain Django views: 503, as in its DRF views (console/api.py).
    "console.api.DatabaseUnavailableMiddleware",
    # Last, as django-axes requires: it answers a locked-out login with AXES_LOCKOUT_TEMPLATE.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "console.urls"
ASGI_APPLICATION = "console.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.context_processors.navigation",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------------
DATABASE_URL = env.str(
    "DATABASE_URL", f"sqlite:///{VAR_DIR / 'countersign.sqlite3'}",
    validate=_schemes("sqlite", "postgres", "postgresql"),
)
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
IS_SQLITE = DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3"
if IS_SQLITE:
    DATABASES["default"]["OPTIONS"] = {
        # IMMEDIATE takes the write lock at BEGIN, so two writers never deadlock on a lock
        # upgrade ("database is locked"); WAL lets readers go on while one writer commits.
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # A file, not :memory:, so that the server and worker processes started by the end-to-end
    # tests see the same test database; one per test run, so parallel runs do not collide.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / f"test-countersign-{os.getpid()}.sqlite3")}
    # A new SQLite connection parses the whole schema before its first statement (milliseconds
    # of CPU for this one): each thread keeps its connection. The web server's request threads
    # are kept between requests (console/lib/request_threads.py), as are the long-poll's
    # database threads and the worker's.
    DATABASES["default"]["CONN_MAX_AGE"] = 600
else:
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    DATABASES["default"]["TEST"] = {"NAME": env.str("TEST_DATABASE_NAME", "test_countersign")}
    # DATABASE_POOL=N: psycopg's connection pool (at most N connections per process) instead of
    # a new connection, backend process and authentication per request. console.asgi turns it
    # on for the web server: its request threads come and go with the load (a few are kept,
    # console/lib/request_threads.py), so CONN_MAX_AGE would hold a server connection per thread
    # ever started (Django's docs say to use the backend's pool under ASGI). Off elsewhere: a Celery prefork parent
    # that had opened a pool would hand its sockets and dead pool threads to every child.
    # With the pool, CONN_HEALTH_CHECKS checks a connection as it leaves the pool.
    DATABASE_POOL = env.int("DATABASE_POOL", 0, validate=Range(min=0))
    DATABASES["default"]["OPTIONS"] = {
        # Server-side prepared statements after this many runs on a connection, for the ledger's
        # hand-written hot-path statements only (console/lib/sql.py binds them on the server;
        # the ORM binds on the client and never prepares). 0 turns it off: behind a
        # transaction-pooling PgBouncer older than 1.21, which cannot keep them.
        "prepare_threshold": env.int("DATABASE_PREPARE_THRESHOLD", 2, validate=Range(min=0)) or None,
    }
    if DATABASE_POOL:
        DATABASES["default"]["OPTIONS"]["pool"] = {"min_size": 1, "max_size": DATABASE_POOL, "timeout": 30}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Auth, i18n, static ---------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [] if EMBEDDED else [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: refuses a locked-out login before any check
    "django.contrib.auth.backends.ModelBackend",
]
# Login throttling (django-axes, docs/security.md): after AXES_FAILURE_LIMIT wrong passwords for
# one username from one address, that pair is locked for AXES_COOLOFF_MINUTES, even with the
# right password. Failures live in the database, so every server process sees them. A pair, not
# the username alone, so that nobody can lock a colleague out from elsewhere. Behind a proxy,
# AXES_IPWARE_PROXY_COUNT says how many proxies append to X-Forwarded-For.
AXES_FAILURE_LIMIT = env.int("AXES_FAILURE_LIMIT", 5, validate=Range(min=1))
AXES_COOLOFF_MINUTES = env.int("AXES_COOLOFF_MINUTES", 15, validate=Range(min=1))
AXES_COOLOFF_TIME = timedelta(minutes=AXES_COOLOFF_MINUTES)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "console/locked_out.html"
AXES_IPWARE_PROXY_COUNT = env.int("AXES_IPWARE_PROXY_COUNT", 0, validate=Range(min=0)) or None
if AXES_IPWARE_PROXY_COUNT:
    AXES_IPWARE_META_PRECEDENCE_ORDER = ["HTTP_X_FORWARDED_FOR", "REMOTE_ADDR"]
AXES_VERBOSE = False
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = Path(env.str("STATIC_ROOT", str(VAR_DIR / "static")))
STATICFILES_DIRS = [BASE_DIR / "static"]
# The ASGI app serves static files itself (console/asgi.py) unless a web server in front does.
# Every middleware is async-capable, so a long-poll holds no thread while it waits.
SERVE_STATIC = env.bool("SERVE_STATIC", True)

# --- Content-Security-Policy (django-csp), in both modes ------------------------------------
# Scripts and styles come from our own static files, or carry the request's nonce
# (`nonce="{{ request.csp_nonce }}"`); no inline handler, no eval, no style attribute (scripts
# set styles through the CSSOM, which the policy allows). htmx is told not to inject its
# indicator <style> and not to eval (the <meta name="htmx-config"> in base.html).
# `connect-src 'self'` covers the live websockets of the same host and port.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'", NONCE],
        "style-src": ["'self'", NONCE],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'"],
        "connect-src": ["'self'"],
        "worker-src": ["'self'", "blob:"],
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
}

SESSION_COOKIE_SECURE = not EMBEDDED and env.bool("SESSION_COOKIE_SECURE", True)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
# Production over plain HTTP on purpose (SESSION_COOKIE_SECURE=false, e.g. `make cluster` on one
# machine) also means no redirect to https and no HSTS unless asked for.
_HTTPS = SESSION_COOKIE_SECURE

# --- TLS in production (docs/security.md) ----------------------------------------------------
# Embedded mode serves plain http on loopback, so none of this applies there.
# HSTS: browsers refuse plain http to this host for SECURE_HSTS_SECONDS once they saw https.
# Preload is off by default: being on the browsers' preload list is the domain owner's decision,
# hard to undo, and covers every subdomain (hence the silenced W021 below).
SECURE_HSTS_SECONDS = 0 if EMBEDDED else env.int("SECURE_HSTS_SECONDS", 31536000 if _HTTPS else 0,
                                                  validate=Range(min=0))
SECURE_HSTS_INCLUDE_SUBDOMAINS = not EMBEDDED and env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = not EMBEDDED and env.bool("SECURE_HSTS_PRELOAD", False)
# Plain http is redirected to https; a load balancer's health check over http reaches /healthz.
SECURE_SSL_REDIRECT = not EMBEDDED and env.bool("SECURE_SSL_REDIRECT", _HTTPS)
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
# Behind a proxy that terminates TLS, the header it sets to "https" (e.g. X-Forwarded-Proto).
# Set it only if the proxy always sets or strips that header: otherwise a client could claim
# https over plain http. Unset, a TLS-terminating proxy makes SECURE_SSL_REDIRECT loop.
_proxy_ssl_header = env.str("SECURE_PROXY_SSL_HEADER", "")
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_" + _proxy_ssl_header.upper().replace("-", "_"), "https") if _proxy_ssl_header else None
)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
SILENCED_SYSTEM_CHECKS = [] if EMBEDDED or SECURE_HSTS_PRELOAD else ["security.W021"]

# --- Celery ---------------------------------------------------------------------------------
CELERY_BROKER_URL = env.str(
    "CELERY_BROKER_URL", "filesystem://", validate=_schemes("filesystem", "redis", "amqp", "memory")
)
if CELERY_BROKER_URL.startswith("filesystem://"):
    _broker_dir = VAR_DIR / "broker"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
        # Consumers are woken by a datagram (console/lib/fs_broker.py) and poll only while their
        # prefetch is full or they could not bind a socket: kombu's default (1 s) would then let
        # a worker take one message a second from the folder.
        "polling_interval": env.float("CELERY_FS_POLLING_INTERVAL", 0.02, validate=Range(min=0.005)),
    }
    for _folder in ("queue", "processed", "control"):
        (_broker_dir / _folder).mkdir(parents=True, exist_ok=True)
else:
    # Redis redelivers an unacked message after this many seconds, even to a second worker
    # while the first still runs it (celery#2599): the ledger, not the broker, decides.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT", 3600)}
# The pool must survive a SIGKILL at any moment. A prefork child killed while it waits for work
# dies holding its inqueue's lock, and the child that replaces it blocks on that lock for ever
# while the worker looks alive. Threads share no such lock (a killed worker is one process the
# supervisor restarts), and dispatch is I/O: the database and the provider, not the CPU.
CELERY_WORKER_POOL = env.str("CELERY_WORKER_POOL", "threads", validate=OneOf(("threads", "prefork", "solo")))
# A dispatch holds its thread (and the thread's database connection) through the claim's commit,
# the provider call, the receipt's commit and their doorbell rings: with four, the calls of a
# few busy agents waited in the broker for a free thread.
CELERY_WORKER_CONCURRENCY = env.int("CELERY_WORKER_CONCURRENCY", 8, validate=Range(min=1))
# Liveness (ledger/liveness.py): a worker writes a heartbeat this often; it is stalled when due
# work has waited WORKER_STALL_SECONDS and it finished nothing for as long (make run restarts
# it); beat checks every LIVENESS_CHECK_SECONDS and alerts when the oldest due operation is
# older than LIVENESS_ALERT_SECONDS.
WORKER_HEARTBEAT_SECONDS = env.float("WORKER_HEARTBEAT_SECONDS", 5.0, validate=Range(min=0.1))
WORKER_STALL_SECONDS = env.float("WORKER_STALL_SECONDS", 30.0, validate=Range(min=1))
LIVENESS_CHECK_SECONDS = env.float("LIVENESS_CHECK_SECONDS", 10.0, validate=Range(min=0.1))
LIVENESS_ALERT_SECONDS = env.float("LIVENESS_ALERT_SECONDS", 120.0, validate=Range(min=1))
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_DEFAULT_QUEUE = "fast"
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_ROUTES = {"ledger.reconcile_operation": {"queue": "slow"}, "ledger.sweep": {"queue": "fast"}}
SWEEP_SECONDS = env.float("SWEEP_SECONDS", 2.0, validate=Range(min=0.1))
# PostgreSQL's writers leave their event rows unsealed; the sealer links them into the tenants'
# hash chains this often (console.lib.audit.seal_pending). SQLite seals at insert.
EVENT_SEAL_SECONDS = env.float("EVENT_SEAL_SECONDS", 1.0, validate=Range(min=0.1))
CELERY_BEAT_SCHEDULE = {
    "ledger-sweep": {"task": "ledger.sweep", "schedule": SWEEP_SECONDS},
    # Deliveries whose broker message was lost are queued again (the table decides, not the broker).
    "approval-notifications": {"task": "approvals.enqueue_due_notifications", "schedule": 10.0},
    "ledger-webhooks": {"task": "ledger.enqueue_due_webhooks", "schedule": 10.0},
}
if not IS_SQLITE:
    CELERY_BEAT_SCHEDULE["event-seal"] = {"task": "console.seal_events", "schedule": EVENT_SEAL_SECONDS}
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_TIMEZONE = "UTC"

# --- Dispatcher, reconciliation (the protocol's clocks) -----------------------------------
# A dispatched operation with no recorded outcome after timeout + this grace is `unknown`.
DISPATCH_GRACE_SECONDS = env.float("DISPATCH_GRACE_SECONDS", 10.0, validate=Range(min=0))
# Authorized but not dispatched for this long: the broker lost the message; enqueue again.
REDISPATCH_AFTER_SECONDS = env.float("REDISPATCH_AFTER_SECONDS", 15.0, validate=Range(min=0.1))
# A call the gate runs at once, on a fast-queue tool, whose agent waits for its outcome (`?wait=`,
# the MCP server) is dispatched by the server thread that proposed it: no broker hop, no worker
# pickup (ledger/request_dispatch.py). Off: every dispatch goes through the broker, for a
# deployment whose web servers must not reach the tools' providers.
DISPATCH_IN_REQUEST = env.bool("DISPATCH_IN_REQUEST", True)
# At most this many at once per server process (as many request threads as the server keeps,
# console/lib/request_threads.py); past that, the broker's path: a provider that hangs does not
# pile up a server's threads. Fewer sends the calls of a busy server's waiting agents through the
# broker's four hops, the slow path (measured in docs/benchmarks.md).
DISPATCH_IN_REQUEST_SLOTS = env.int("DISPATCH_IN_REQUEST_SLOTS", 16, validate=Range(min=1))
# Unknown outcomes the provider cannot explain within this window go to a person (`manual`).
RECONCILE_WINDOW_SECONDS = env.float("RECONCILE_WINDOW_SECONDS", 45.0, validate=Range(min=1))
TENANT_MAX_IN_FLIGHT = env.int("TENANT_MAX_IN_FLIGHT", 16, validate=Range(min=1))
# Retries may be at most this share of first attempts per tool over the last minute.
RETRY_BUDGET_RATIO = env.float("RETRY_BUDGET_RATIO", 0.5, validate=Range(min=0))
RETRY_BUDGET_MIN = env.int("RETRY_BUDGET_MIN", 20, validate=Range(min=0))
# The circuit opens when this many of a tool's recent attempts failed transiently (and half).
CIRCUIT_FAILURES = env.int("CIRCUIT_FAILURES", 8, validate=Range(min=1))
CIRCUIT_WINDOW_SECONDS = env.float("CIRCUIT_WINDOW_SECONDS", 30.0, validate=Range(min=1))
CIRCUIT_COOLDOWN_SECONDS = env.float("CIRCUIT_COOLDOWN_SECONDS", 5.0, validate=Range(min=0.1))

# --- Channels -------------------------------------------------------------------------------
CHANNEL_LAYER_URL = env.str("CHANNEL_LAYER_URL", "memory://", validate=_schemes("memory", "redis", "rediss"))


def channel_layers(url: str) -> dict:
    """The channel layer carries only the events doorbell (console/doorbell.py): a ring without
    data, lost at worst. On Redis it is publish/subscribe (a ring is one PUBLISH, not a queue per
    listener to fill and expire). Redis's channels ignore the database number, so the names carry
    it: deployments (and test processes) on other databases of one server do not ring each other."""
    if url.startswith("memory://"):
        return {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    database = urlsplit(url).path.lstrip("/") or "0"
    return {"default": {"BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
                        "CONFIG": {"hosts": [url], "prefix": f"countersign.{database}"}}}


CHANNEL_LAYERS = channel_layers(CHANNEL_LAYER_URL)
# Live views tail the event table; this is how often each server process looks for new rows.
LIVE_POLL_SECONDS = env.float("LIVE_POLL_SECONDS", 0.25, validate=Range(min=0.01))

# --- REST framework -------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["console.api.AgentTokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "console.api.exception_handler",
    # JSON only (the agent API's bodies are JSON objects), with a nesting budget.
    "DEFAULT_PARSER_CLASSES": ["console.api.JSONParser"],
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_THROTTLE_CLASSES": ["console.ratelimit.AgentRateThrottle"],
}
# Requests a minute per agent token and per tenant, agent API and OTLP together (0: no limit);
# console/ratelimit.py counts them in the "ratelimit" cache, shared by every server process
# (Redis; the one server's memory in embedded mode).
API_RATE_PER_TOKEN = env.int("API_RATE_PER_TOKEN", 3000, validate=Range(min=0))
API_RATE_PER_TENANT = env.int("API_RATE_PER_TENANT", 12000, validate=Range(min=0))
RATE_LIMIT_CACHE_URL = env.str(
    "RATE_LIMIT_CACHE_URL", CHANNEL_LAYER_URL if CHANNEL_LAYER_URL.startswith("redis") else "",
    validate=lambda v: not v or _schemes("redis", "rediss")(v),
)
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "ratelimit": (
        {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": RATE_LIMIT_CACHE_URL,
         "KEY_PREFIX": "countersign-ratelimit"}
        if RATE_LIMIT_CACHE_URL else
        # Embedded mode serves HTTP from one process (run_embedded): its memory is the exact,
        # atomic counter at no cost, where a file cache wrote and renamed two files per request.
        {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "ratelimit"}
        if EMBEDDED else
        # Production without Redis: files are shared by the machine's server processes
        # (increments are not atomic there, so concurrent requests may be undercounted a little).
        {"BACKEND": "django.core.cache.backends.filebased.FileBasedCache", "LOCATION": str(VAR_DIR / "ratelimit")}
    ),
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Countersign agent API",
    "DESCRIPTION": "Task contracts, leases, tool calls, operations and traces for AI agents.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # The machines have no internet: the docs page's JavaScript is served from our static files.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# --- Sandbox providers and demo -------------------------------------------------------------
PORT = env.int("PORT", 8000, validate=Range(min=1, max=65532))  # the sandboxes take PORT+1..+3
SANDBOX_PAYMENTS_URL = env.str("SANDBOX_PAYMENTS_URL", f"http://127.0.0.1:{PORT + 1}")
SANDBOX_MAIL_URL = env.str("SANDBOX_MAIL_URL", f"http://127.0.0.1:{PORT + 2}")
SANDBOX_MAIL_SMTP_PORT = env.int("SANDBOX_MAIL_SMTP_PORT", PORT + 3, validate=Range(min=1, max=65535))
DEMO_PASSWORD = env.str("DEMO_PASSWORD", "countersign-demo")
DEMO_AGENT_TOKEN = env.str("DEMO_AGENT_TOKEN", "demo-agent-token")

# --- OpenTelemetry --------------------------------------------------------------------------
OTEL_ENABLED = env.bool("OTEL_ENABLED", False)
OTEL_SERVICE_NAME = env.str("OTEL_SERVICE_NAME", "countersign")
OTEL_EXPORTER_OTLP_ENDPOINT = env.str("OTEL_EXPORTER_OTLP_ENDPOINT", "")

# --- OTLP ingest limits (runs/otlp.py, docs/security.md) ----------------------------------
# Per span, as the OpenTelemetry SDK's span limits: what is over is dropped (attributes, events)
# or cut (values), and the span records how much (dropped_*_count, truncated_values_count).
OTLP_SPAN_ATTRIBUTE_COUNT_LIMIT = env.int("OTLP_SPAN_ATTRIBUTE_COUNT_LIMIT", 128, validate=Range(min=1))
OTLP_EVENT_ATTRIBUTE_COUNT_LIMIT = env.int("OTLP_EVENT_ATTRIBUTE_COUNT_LIMIT", 128, validate=Range(min=0))
OTLP_SPAN_EVENT_COUNT_LIMIT = env.int("OTLP_SPAN_EVENT_COUNT_LIMIT", 128, validate=Range(min=0))
# Characters of one string value (also the status message and each string in a list).
OTLP_ATTRIBUTE_VALUE_LENGTH_LIMIT = env.int("OTLP_ATTRIBUTE_VALUE_LENGTH_LIMIT", 4096, validate=Range(min=1))
# Spans one tenant may store (0: no quota). Spans over it are dropped and counted, and the
# exporter is told in the answer's partialSuccess (not a 429: retrying would not help).
OTLP_TENANT_SPAN_QUOTA = env.int("OTLP_TENANT_SPAN_QUOTA", 5_000_000, validate=Range(min=0))

# --- Email (notifications to reviewers and support staff) --------------------------------------
# Embedded mode writes each message to a file under var/mail, so nothing leaves the machine.
EMAIL_BACKEND = env.str(
    "EMAIL_BACKEND",
    "django.core.mail.backends.filebased.EmailBackend" if EMBEDDED else "django.core.mail.backends.smtp.EmailBackend",
)
EMAIL_FILE_PATH = str(VAR_DIR / "mail")
EMAIL_HOST = env.str("EMAIL_HOST", "localhost")
EMAIL_PORT = env.int("EMAIL_PORT", 25, validate=Range(min=1, max=65535))
EMAIL_HOST_USER = env.str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env.str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env.bool("EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", "countersign@localhost")

# --- Notifications of new approval requests (webhook or email per tier, admin) ------------------
# Absolute links in notifications point here.
PUBLIC_BASE_URL = env.str("PUBLIC_BASE_URL", f"http://127.0.0.1:{PORT}")
NOTIFICATION_MAX_ATTEMPTS = env.int("NOTIFICATION_MAX_ATTEMPTS", 5, validate=Range(min=1))
NOTIFICATION_BACKOFF_SECONDS = env.float("NOTIFICATION_BACKOFF_SECONDS", 2.0, validate=Range(min=0))
NOTIFICATION_BACKOFF_CAP_SECONDS = env.float("NOTIFICATION_BACKOFF_CAP_SECONDS", 600.0, validate=Range(min=0))
NOTIFICATION_TIMEOUT_SECONDS = env.float("NOTIFICATION_TIMEOUT_SECONDS", 5.0, validate=Range(min=0.1))
# --- Decision webhooks to agents (ledger.webhooks; an agent's URL and secret in the admin) -----
WEBHOOK_MAX_ATTEMPTS = env.int("WEBHOOK_MAX_ATTEMPTS", 10, validate=Range(min=1))
# Attempt n waits base · 2^(n−1), capped, with jitter (a random share of up to half of it).
WEBHOOK_BACKOFF_SECONDS = env.float("WEBHOOK_BACKOFF_SECONDS", 5.0, validate=Range(min=0))
WEBHOOK_BACKOFF_CAP_SECONDS = env.float("WEBHOOK_BACKOFF_CAP_SECONDS", 3600.0, validate=Range(min=0))
WEBHOOK_TIMEOUT_SECONDS = env.float("WEBHOOK_TIMEOUT_SECONDS", 10.0, validate=Range(min=0.1))
# Loopback, private, link-local and other non-public addresses are refused at connect time
# (server-side request forgery), except where this allows them: embedded mode by default, where
# the agents run on the same machine.
WEBHOOK_ALLOW_PRIVATE_ADDRESSES = env.bool("WEBHOOK_ALLOW_PRIVATE_ADDRESSES", EMBEDDED)
# An approval still undecided after this share of its time reminds its tier's reviewers, and
# after the second share is escalated to the next tier's reviewers.
APPROVAL_REMIND_SHARE = env.float("APPROVAL_REMIND_SHARE", 0.5, validate=Range(min=0.01, max=1))
APPROVAL_ESCALATE_SHARE = env.float("APPROVAL_ESCALATE_SHARE", 0.8, validate=Range(min=0.01, max=1))
if APPROVAL_ESCALATE_SHARE < APPROVAL_REMIND_SHARE:
    raise ImproperlyConfigured("APPROVAL_ESCALATE_SHARE must not be below APPROVAL_REMIND_SHARE.")

# Prometheus /metrics (every tenant's counters): only with this bearer token; off while unset.
METRICS_TOKEN = env.str("METRICS_TOKEN", "")

# --- Logging --------------------------------------------------------------------------------
LOG_LEVEL = env.str("LOG_LEVEL", "INFO", validate=OneOf(("DEBUG", "INFO", "WARNING", "ERROR")))
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    # One line per HTTP request of every client is noise, not information.
    "loggers": {"httpx": {"level": "WARNING"}, "httpcore": {"level": "WARNING"}},
}
