from __future__ import annotations

from django.urls import path

from approvals import views

app_name = "approvals"

urlpatterns = [
    path("", views.inbox, name="inbox"),
    path("export.csv", views.export_csv, name="export_csv"),
    path("export.json", views.export_json, name="export_json"),
    path("<str:approval_id>/", views.detail, name="detail"),
    path("<str:approval_id>/approve/", views.approve, name="approve"),
    path("<str:approval_id>/reject/", views.reject, name="reject"),
    path("<str:approval_id>/edit/", views.edit, name="edit"),
]
