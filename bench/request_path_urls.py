"""The product's URLs plus two bare views (bench/request_path_settings.py): the fixed cost of a
Django request on the same server, middleware and settings, with no database and no work."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import path

from console.urls import handler400, handler404  # noqa: F401
from console.urls import urlpatterns as product_urlpatterns


def bare(request: HttpRequest) -> HttpResponse:
    return HttpResponse(b"ok", content_type="text/plain")


async def bare_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse(b"ok", content_type="text/plain")


urlpatterns = [
    path("bench/bare", bare),
    path("bench/bare-async", bare_async),
    *product_urlpatterns,
]
