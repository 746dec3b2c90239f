"""Django's middleware, as `MIDDLEWARE` lists them, with their hooks run on the event loop.

`asgi_handler()` is the web server's Django application (console.asgi): Django's ASGI handler
with each middleware of `MIDDLEWARE` that `ON_THE_LOOP` names loaded as its subclass below.
`MIDDLEWARE` itself keeps Django's names, which Django's deploy checks look for.

Under ASGI, Django's `MiddlewareMixin.__acall__` runs every `process_request` and
`process_response` in the request's thread (`sync_to_async`): fifteen thread hops a request for
the eight middleware below, each one a wake-up of that thread and then of the loop, whatever the
view. Their hooks are pure computation on the request and the response, except where a
`*_needs_thread` method below says when they may touch the database: the session saved, messages
kept in the session, a CSRF check that reads a submitted form. Only then do they go to the
request's thread, as Django's own would. Under the test client and WSGI (sync) they are Django's
own, unchanged.

`async_unsafe` guards every database call: a hook that touched the database on the loop would
raise `SynchronousOnlyOperation`, not block it.
"""

from __future__ import annotations

import functools

import django
from asgiref.sync import iscoroutinefunction, sync_to_async
from csp.constants import HEADER, HEADER_REPORT_ONLY
from csp.middleware import CheckableLazyObject, build_policy
from csp.middleware import CSPMiddleware as _CSPMiddleware
from django.conf import settings
from django.contrib.auth.middleware import AuthenticationMiddleware as _AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware as _MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware as _SessionMiddleware
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.middleware.clickjacking import XFrameOptionsMiddleware as _XFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware as _CommonMiddleware
from django.middleware.csrf import CsrfViewMiddleware as _CsrfViewMiddleware
from django.middleware.security import SecurityMiddleware as _SecurityMiddleware

from console.api import for_machines
from console.lib.asgi_handler import Handler


def _in_thread(hook):
    return sync_to_async(hook, thread_sensitive=True)


class OnTheLoop:
    """Mixed in before a `MiddlewareMixin` subclass: its hooks run on the event loop unless
    the `*_needs_thread` method for that hook says otherwise."""

    def request_needs_thread(self, request: HttpRequest) -> bool:
        return False

    def response_needs_thread(self, request: HttpRequest, response: HttpResponseBase) -> bool:
        return False

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        response = None
        if hasattr(self, "process_request"):
            if self.request_needs_thread(request):
                response = await _in_thread(self.process_request)(request)
            else:
                response = self.process_request(request)
        response = response or await self.get_response(request)
        if hasattr(self, "process_response"):
            if self.response_needs_thread(request, response):
                response = await _in_thread(self.process_response)(request, response)
            else:
                response = self.process_response(request, response)
        return response


class SecurityMiddleware(OnTheLoop, _SecurityMiddleware):
    pass


# django-csp's marks of a policy changed for one view (csp.decorators); any of them, or a nonce
# the response used, and the header is built for that response as django-csp builds it.
_PER_VIEW = ("_csp_exempt", "_csp_config", "_csp_update", "_csp_replace",
             "_csp_exempt_ro", "_csp_config_ro", "_csp_update_ro", "_csp_replace_ro")


@functools.cache
def _settings_policies() -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    """(header, policy, excluded path prefixes) of the two settings, built as django-csp builds
    them for an answer that used no nonce and changes nothing per view."""
    return tuple((header, build_policy(report_only=report_only),
                  tuple((getattr(settings, name, None) or {}).get("EXCLUDE_URL_PREFIXES") or ()))
                 for header, name, report_only in ((HEADER, "CONTENT_SECURITY_POLICY", False),
                                                   (HEADER_REPORT_ONLY, "CONTENT_SECURITY_POLICY_REPORT_ONLY", True)))


@receiver(setting_changed)
def _policy_setting_changed(*, setting: str, **kwargs) -> None:
    if setting.startswith("CONTENT_SECURITY_POLICY") or setting == "DEBUG":
        _settings_policies.cache_clear()


class CSPMiddleware(OnTheLoop, _CSPMiddleware):
    """django-csp builds the policy for every answer, with two deep copies of its configuration
    on the way. An answer that used no nonce (every API answer, most fragments) and changes
    nothing per view gets the settings' policy, which is the same each time: built once."""

    def process_response(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        if (getattr(request, "_csp_nonce", None) is not None or any(hasattr(response, name) for name in _PER_VIEW)
                or (settings.DEBUG and response.status_code in (404, 500))):
            return super().process_response(request, response)
        for header, policy, excluded in _settings_policies():
            if policy and header not in response and not request.path_info.startswith(excluded):
                response[header] = policy
        # As django-csp does: a nonce asked for after the header was written is an error.
        request.csp_nonce = CheckableLazyObject(self._csp_nonce_post_response)
        return response


class SessionMiddleware(OnTheLoop, _SessionMiddleware):
    # `process_request` only makes the store (lazy). A session that was never read was not
    # changed and is not saved: `process_response` then only looks at flags and the cookie.
    def response_needs_thread(self, request: HttpRequest, response: HttpResponseBase) -> bool:
        session = getattr(request, "session", None)
        return session is not None and session.accessed


class CommonMiddleware(OnTheLoop, _CommonMiddleware):
    pass


class CsrfViewMiddleware(OnTheLoop, _CsrfViewMiddleware):
    # The CSRF secret is read from its cookie; kept in the session instead, it is a query.
    def request_needs_thread(self, request: HttpRequest) -> bool:
        return settings.CSRF_USE_SESSIONS

    def response_needs_thread(self, request: HttpRequest, response: HttpResponseBase) -> bool:
        return settings.CSRF_USE_SESSIONS

    def __init__(self, get_response) -> None:
        super().__init__(get_response)
        if iscoroutinefunction(get_response):
            # Django's handler adapts a sync process_view with a thread hop of its own; this
            # one is a coroutine function, so it is called as it is.
            self.process_view = self._process_view_on_the_loop

    async def _process_view_on_the_loop(self, request, callback, callback_args, callback_kwargs):
        check = super().process_view
        # A safe method or an exempt view is accepted without reading anything; a form's POST
        # reads its body (possibly a file upload) and, with CSRF_USE_SESSIONS, the session.
        if (request.method in ("GET", "HEAD", "OPTIONS", "TRACE") or getattr(callback, "csrf_exempt", False)
                or getattr(request, "csrf_processing_done", False)) and not settings.CSRF_USE_SESSIONS:
            return check(request, callback, callback_args, callback_kwargs)
        return await _in_thread(check)(request, callback, callback_args, callback_kwargs)



class AuthenticationMiddleware(OnTheLoop, _AuthenticationMiddleware):
    # The user is a lazy object: loading it (a query) happens where it is read.
    pass


class MessageMiddleware(OnTheLoop, _MessageMiddleware):
    # Messages nobody added or read are not stored; stored ones may go to the session.

    def process_request(self, request: HttpRequest) -> None:
        # Nothing under the API's paths adds or shows a message: no storage for them (with
        # none, Django's `process_response` has nothing to store).
        if not for_machines(request):
            super().process_request(request)

    def response_needs_thread(self, request: HttpRequest, response: HttpResponseBase) -> bool:
        storage = getattr(request, "_messages", None)
        return storage is not None and (storage.used or storage.added_new)


class XFrameOptionsMiddleware(OnTheLoop, _XFrameOptionsMiddleware):
    pass


ON_THE_LOOP = {
    "django.middleware.security.SecurityMiddleware": "console.middleware.SecurityMiddleware",
    "csp.middleware.CSPMiddleware": "console.middleware.CSPMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware": "console.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware": "console.middleware.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware": "console.middleware.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware": "console.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware": "console.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware": "console.middleware.XFrameOptionsMiddleware",
}


def asgi_handler() -> Handler:
    """Django's ASGI application (as `get_asgi_application()`), its middleware on the loop and
    its own bookkeeping queued in the request's thread (console.lib.asgi_handler).

    The handler reads MIDDLEWARE once, as it builds its chain: only for that moment does the
    setting name the subclasses, at the server's start, before any request."""
    django.setup(set_prefix=False)
    as_listed = settings.MIDDLEWARE
    settings.MIDDLEWARE = [ON_THE_LOOP.get(path, path) for path in as_listed]
    try:
        return Handler()
    finally:
        settings.MIDDLEWARE = as_listed
