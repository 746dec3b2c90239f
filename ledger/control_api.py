"""The stops API for people (`/api/v1/stops`): list, stop, resume.

People, not agents: session (with CSRF) or HTTP Basic authentication; an agent's bearer token
is not accepted here. The services decide who may stop what (the tenant's admins; for a tool,
its L4 reviewers too); a tenant the caller has no role in is a 404."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import authentication, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from approvals import stops
from approvals.models import Stop, StopStatus, Tool
from console.access import tenant_ids_for
from console.api import StrictCharField, errors
from console.lib.errors import NotFound
from console.models import AgentPrincipal, Tenant
from ledger import control

# Basic first: an unauthenticated call is answered 401 with its WWW-Authenticate.
PEOPLE_AUTH = [authentication.BasicAuthentication, authentication.SessionAuthentication]


class StopOutputSerializer(serializers.Serializer):
    stop_id = serializers.CharField()
    tenant = serializers.CharField(source="tenant.slug")
    scope = serializers.CharField()
    agent = serializers.CharField(source="agent.name", allow_null=True, default=None)
    tool = serializers.CharField(source="tool.name", allow_null=True, default=None)
    status = serializers.CharField()
    reason = serializers.CharField()
    stopped_by = serializers.CharField(source="stopped_by.username")
    created_at = serializers.DateTimeField()
    resumed_by = serializers.CharField(source="resumed_by.username", allow_null=True, default=None)
    resumed_at = serializers.DateTimeField(allow_null=True)
    resume_reason = serializers.CharField()


def _visible(request: Request):
    return Stop.objects.filter(tenant_id__in=tenant_ids_for(request.user)).select_related(
        "tenant", "agent", "tool", "stopped_by", "resumed_by")


class StopListApi(APIView):
    authentication_classes = PEOPLE_AUTH

    class StopCreateInputSerializer(serializers.Serializer):
        tenant = StrictCharField(help_text="The tenant's slug.")
        scope = serializers.ChoiceField(choices=Stop.Scope.choices)
        agent = StrictCharField(required=False, help_text="The agent's name (scope agent).")
        tool = StrictCharField(required=False, help_text="The tool's name (scope tool).")
        reason = StrictCharField()

    @extend_schema(operation_id="stops_list", responses={200: StopOutputSerializer(many=True), **errors(401, 403)},
                   summary="Stops of your tenants, those in force first")
    def get(self, request: Request) -> Response:
        rows = _visible(request).order_by("-status", "-created_at")[:200]
        if request.query_params.get("status") in StopStatus.values:
            rows = _visible(request).filter(status=request.query_params["status"])[:200]
        return Response(StopOutputSerializer(rows, many=True).data)

    @extend_schema(operation_id="stops_create", request=StopCreateInputSerializer,
                   responses={201: StopOutputSerializer, **errors(400, 401, 403, 404, 409)},
                   summary="Stop a tenant, an agent or a tool at once")
    def post(self, request: Request) -> Response:
        data = self.StopCreateInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        tenant = Tenant.objects.filter(slug=values["tenant"], pk__in=tenant_ids_for(request.user)).first()
        if tenant is None:
            raise NotFound("No such tenant among yours.")
        agent = tool = None
        if values["scope"] == Stop.Scope.AGENT:
            agent = AgentPrincipal.objects.filter(tenant=tenant, name=values.get("agent", "")).first()
            if agent is None:
                raise NotFound("No such agent in this tenant.")
        if values["scope"] == Stop.Scope.TOOL:
            tool = Tool.objects.filter(name=values.get("tool", "")).first()
            if tool is None:
                raise NotFound("No such tool.")
        stop = stops.stop_create(tenant_id=tenant.pk, scope=values["scope"], agent=agent, tool=tool,
                                 user=request.user, reason=values["reason"])
        return Response(StopOutputSerializer(_visible(request).get(pk=stop.pk)).data, status=status.HTTP_201_CREATED)


class StopResumeApi(APIView):
    authentication_classes = PEOPLE_AUTH

    class StopResumeInputSerializer(serializers.Serializer):
        reason = StrictCharField(required=False, allow_blank=True, default="")

    @extend_schema(operation_id="stops_resume", request=StopResumeInputSerializer,
                   responses={200: StopOutputSerializer, **errors(400, 401, 403, 404)},
                   summary="Resume a stop; what it held is dispatched again")
    def post(self, request: Request, stop_id: str) -> Response:
        if not _visible(request).filter(pk=stop_id).exists():
            raise NotFound(f"No stop {stop_id} in your tenants.")
        data = self.StopResumeInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        control.stop_resume(stop_id=stop_id, user=request.user, reason=data.validated_data["reason"])
        return Response(StopOutputSerializer(_visible(request).get(pk=stop_id)).data)

