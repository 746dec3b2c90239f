from __future__ import annotations

from django.urls import path

from approvals import tool_views

app_name = "tools"

urlpatterns = [
    path("<str:tool_name>/", tool_views.tool_detail, name="detail"),
]
