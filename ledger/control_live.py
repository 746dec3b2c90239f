"""The stops page's live stream (`/ws/live/stops/`, registered from `LedgerConfig.ready`): a
stop or a resume by anyone re-renders the list of stops in force (with the resume buttons the
viewer may press). Stops and resumes also reach the dashboard's activity feed."""

from __future__ import annotations

from collections.abc import Sequence

from django.template.loader import render_to_string

from approvals.models import Stop
from console import live
from console.access import tenant_ids_for
from ledger.control_views import stops_in_force


def _render_stops(user, events: Sequence, arg: str) -> str:
    return render_to_string("ledger/_stops_in_force.html", {
        "in_force": stops_in_force(tenant_ids_for(user), user), "oob": True})


live.register(live.Stream(name="stops", entities=(Stop.EVENT_ENTITY,), render=_render_stops))
