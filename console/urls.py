from __future__ import annotations

from csp.constants import SELF, UNSAFE_INLINE
from csp.decorators import csp_replace
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView

from console import metrics_endpoint, views
from runs.otlp import otlp_traces

urlpatterns = [
    # First: every agent call resolves its URL, and no other prefix overlaps the API's.
    path("api/v1/", include("console.api_urls")),
    path("", views.home, name="home"),
    path("dashboard/", views.dashboard, name="dashboard"),
    path("approvals/", include("approvals.urls")),
    path("audit/", include("approvals.audit_urls")),
    path("operations/", include("ledger.urls")),
    path("runs/", include("runs.urls")),
    path("stops/", include("ledger.control_urls")),
    path("tools/", include("approvals.tool_urls")),
    path("accounts/login/", auth_views.LoginView.as_view(template_name="console/login.html"), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    # Redoc writes <style> elements at run time: this page alone allows inline styles (a nonce
    # in style-src would make browsers ignore 'unsafe-inline'); scripts still need 'self'.
    path("api/docs/", csp_replace({"style-src": [SELF, UNSAFE_INLINE]})(
        SpectacularRedocView.as_view(url_name="api-schema")), name="api-docs"),
    path("v1/traces", otlp_traces, name="otlp-traces"),
    path("metrics", metrics_endpoint.metrics, name="metrics"),
    path("healthz", views.healthz, name="healthz"),
    path("healthz/workers", metrics_endpoint.worker_health, name="worker-health"),
]

handler400 = views.bad_request
handler404 = views.not_found
