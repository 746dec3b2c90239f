from __future__ import annotations

from django.urls import path

from approvals import audit_views

app_name = "audit"

urlpatterns = [
    path("", audit_views.audit_list, name="list"),
    path("<str:audit_id>/review/", audit_views.audit_review, name="review"),
]
