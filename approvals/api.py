"""Agent API for the policy's tools: `GET /api/v1/tools`, what this agent may call, with the
JSON schemas a framework binds to its model."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from approvals.models import Tool
from console.api import JSONObjectField, errors


class ToolListApi(APIView):
    class OutputSerializer(serializers.Serializer):
        class ToolInfo(serializers.Serializer):
            name = serializers.CharField()
            description = serializers.CharField(allow_blank=True)
            input_schema = JSONObjectField(source="json_schema", help_text="JSON Schema of the arguments.")
            kind = serializers.ChoiceField(choices=Tool.Kind.choices)
            base_tier = serializers.IntegerField(help_text="The tier before escalation rules raise it (0-4).")
            idempotency = serializers.ChoiceField(choices=Tool.Idempotency.choices)
            schema_version = serializers.IntegerField()

            class Meta:
                ref_name = "ToolInfo"

        tools = ToolInfo(many=True)

        class Meta:
            ref_name = "ToolList"

    @extend_schema(operation_id="tool_list", summary="The tools this agent may call",
                   description="Enabled tools allowed for the calling agent, by name.",
                   responses={200: OutputSerializer, **errors(401)})
    def get(self, request):
        tools = Tool.objects.filter(enabled=True, agents=request.user).order_by("name")
        return Response(self.OutputSerializer({"tools": tools}).data)
