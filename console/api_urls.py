"""The agent API (/api/v1/): each app contributes its endpoints."""

from __future__ import annotations

urlpatterns: list = []
