"""Agent API for task contracts, leases and transitions.

One view per operation; each view validates with its input serializer, calls one service and
answers with its output serializer. The shared fields, the error shape and bearer-token auth
come from `console.api`; errors reach the client through its `exception_handler`.
"""

from __future__ import annotations

import math

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from approvals.gate import CONSTRAINT_TYPES, parse_deadline, task_limits
from console.api import JSONObjectField, StrictCharField, StrictIntegerField, errors
from ledger import decisions, starts
from runs import services
from runs.models import TaskStatus
from runs.selectors import task_for_principal, task_lease

TASK_STATUSES = "One of: " + ", ".join(TaskStatus.values) + "."

# --- contract validation ---------------------------------------------------------------------


def validate_constraints(value: dict) -> dict:
    """Known keys must have their types (a budget of "ten" would silently never bind); other
    keys are kept and reported back as not enforced."""
    problems: dict[str, str] = {}
    for key, kind in CONSTRAINT_TYPES.items():
        if key not in value or value[key] is None:
            continue
        item = value[key]
        if kind == "integer":
            if isinstance(item, bool) or not isinstance(item, int) or item < 0:
                problems[key] = "Expected an integer >= 0."
        elif kind == "number":
            if (isinstance(item, bool) or not isinstance(item, int | float)
                    or not math.isfinite(item) or item < 0):
                problems[key] = "Expected a number >= 0."
        elif kind == "datetime":
            try:
                parse_deadline(item)
            except (ValueError, TypeError):
                problems[key] = "Expected an ISO 8601 date-time, e.g. 2030-01-31T17:00:00Z."
    if problems:
        raise serializers.ValidationError(problems)
    return value


class TaskOutputSerializer(serializers.Serializer):
    class Budget(serializers.Serializer):
        calls_used = serializers.IntegerField()
        writes_used = serializers.IntegerField()
        amount_used = serializers.DecimalField(max_digits=18, decimal_places=4, coerce_to_string=False)
        limits = serializers.SerializerMethodField(
            help_text="The limits that bind this task's counters now: the least of the contract's budget and the "
                      "administrator's caps (tenant, agent). A contract asking for more is capped, not refused; "
                      "`source` names who set the limit, `contract_asked` what the contract asked when a cap "
                      "lowered it. Daily caps and a tool's caps are not listed: a call they refuse says so.")

        class Meta:
            ref_name = "TaskBudget"

        @extend_schema_field(OpenApiTypes.OBJECT)
        def get_limits(self, task) -> dict:
            limits = task_limits(task)
            return {key: {"limit": float(limit.value) if key == "max_amount" else int(limit.value),
                          "source": limit.source,
                          "contract_asked": (None if limit.contract_asked is None else
                                             float(limit.contract_asked) if key == "max_amount"
                                             else int(limit.contract_asked))}
                    for key, limit in limits.items()}

    class LeaseInfo(serializers.Serializer):
        owner = serializers.CharField()
        generation = serializers.IntegerField()
        expires_at = serializers.DateTimeField()
        live = serializers.BooleanField(source="is_live")

        class Meta:
            ref_name = "TaskLease"

    task_id = serializers.CharField()
    status = serializers.CharField(help_text=TASK_STATUSES)
    version = serializers.IntegerField()
    task_type = serializers.CharField()
    goal = serializers.CharField()
    inputs = JSONObjectField()
    success_criteria = serializers.ListField(child=serializers.JSONField())
    constraints = JSONObjectField()
    versions = JSONObjectField()
    superseded_by = serializers.CharField(source="superseded_by_id", allow_null=True)
    budget = Budget(source="*")
    lease = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    class Meta:
        ref_name = "Task"

    @extend_schema_field(LeaseInfo(allow_null=True))
    def get_lease(self, task):
        lease = task_lease(task)
        return self.LeaseInfo(lease).data if lease is not None else None


# --- views -----------------------------------------------------------------------------------


IDEMPOTENCY_KEY_MAX = 255


def idempotency_key(request) -> str:
    """The Idempotency-Key header: absent is no key; present, 1 to 255 printable ASCII characters."""
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return ""
    if not 0 < len(key) <= IDEMPOTENCY_KEY_MAX or not all(" " <= ch <= "~" for ch in key):
        raise serializers.ValidationError(
            {"Idempotency-Key": [f"1 to {IDEMPOTENCY_KEY_MAX} printable ASCII characters."]})
    return key


class LeaseInputSerializer(serializers.Serializer):
    owner = StrictCharField(max_length=160)
    ttl_seconds = StrictIntegerField(min_value=1, max_value=3600)

    class Meta:
        ref_name = "TaskLeaseInput"


class TaskCreateApi(APIView):
    class InputSerializer(serializers.Serializer):
        task_type = StrictCharField(max_length=100)
        goal = StrictCharField()
        inputs = JSONObjectField(required=False, default=dict)
        success_criteria = serializers.ListField(child=serializers.JSONField(), required=False, default=list)
        constraints = JSONObjectField(required=False, default=dict, validators=[validate_constraints])
        versions = JSONObjectField(required=False, default=dict)
        lease = LeaseInputSerializer(
            required=False,
            help_text="Also lease the task to this owner and move it to `running`, in the same call. The same "
                      "owner re-takes its own live lease with a new fencing token; another owner waits for expiry.",
        )

        class Meta:
            ref_name = "TaskCreateInput"

    class OutputSerializer(serializers.Serializer):
        class Lease(serializers.Serializer):
            owner = serializers.CharField()
            fencing_token = serializers.IntegerField()
            generation = serializers.IntegerField()
            expires_at = serializers.DateTimeField()

            class Meta:
                ref_name = "TaskCreateLease"

        task_id = serializers.CharField()
        status = serializers.CharField(help_text=TASK_STATUSES)
        version = serializers.IntegerField()
        unenforced_constraints = serializers.ListField(
            child=serializers.CharField(),
            help_text="Constraint keys stored with the contract that no gate enforces.",
        )
        fencing_token = serializers.IntegerField(allow_null=True, help_text="With `lease`: the token to act with.")
        lease = Lease(allow_null=True, help_text="With `lease`: the lease held now.")

        class Meta:
            ref_name = "TaskCreateOutput"

    @extend_schema(
        operation_id="task_create", summary="Register (or find) a task contract; optionally lease and start it",
        description="With an `Idempotency-Key` header (e.g. the framework's thread ID): the same key and the same "
                    "contract answer the task registered first (200); the same key with another contract is 422. "
                    "Keys belong to the agent and do not expire.",
        parameters=[OpenApiParameter("Idempotency-Key", OpenApiTypes.STR, OpenApiParameter.HEADER,
                                     description="1 to 255 printable ASCII characters.")],
        request=InputSerializer,
        responses={201: OutputSerializer, 200: OutputSerializer, **errors(400, 401, 409, 422)},
    )
    def post(self, request):
        key = idempotency_key(request)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        contract = dict(serializer.validated_data)
        lease = contract.pop("lease", None)
        start = starts.task_start(principal=request.user, contract=contract, idempotency_key=key, lease=lease)
        task = start.task
        task.unenforced_constraints = sorted(set(task.constraints) - set(CONSTRAINT_TYPES))
        task.fencing_token = start.lease.fencing_token if start.lease is not None else None
        task.lease = start.lease
        return Response(self.OutputSerializer(task).data,
                        status=status.HTTP_201_CREATED if start.created else status.HTTP_200_OK)


class TaskGetApi(APIView):
    @extend_schema(operation_id="task_get", summary="Read a task",
                   responses={200: TaskOutputSerializer, **errors(401, 404)})
    def get(self, request, task_id: str):
        task = task_for_principal(principal=request.user, task_id=task_id)
        return Response(TaskOutputSerializer(task).data)


class TaskLeaseApi(APIView):
    InputSerializer = LeaseInputSerializer

    class OutputSerializer(serializers.Serializer):
        task_id = serializers.CharField()
        owner = serializers.CharField()
        fencing_token = serializers.IntegerField()
        generation = serializers.IntegerField()
        expires_at = serializers.DateTimeField()

        class Meta:
            ref_name = "TaskLeaseOutput"

    @extend_schema(
        operation_id="task_lease", summary="Acquire, renew or take over the task's lease",
        description="The same owner renews and keeps its fencing token; another owner takes over only "
                    "an expired lease, with generation and fencing token + 1.",
        request=InputSerializer, responses={200: OutputSerializer, **errors(400, 401, 404, 409)},
    )
    def post(self, request, task_id: str):
        task = task_for_principal(principal=request.user, task_id=task_id)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        lease = decisions.lease_acquire(task_id=task.task_id, **serializer.validated_data)
        return Response(self.OutputSerializer(lease).data)


class TaskTransitionApi(APIView):
    class InputSerializer(serializers.Serializer):
        to = serializers.ChoiceField(choices=TaskStatus.choices)
        expected_version = StrictIntegerField(min_value=0)
        fencing_token = StrictIntegerField(min_value=0)
        evidence = JSONObjectField(required=False, default=dict)
        reason = StrictCharField(required=False, default="", allow_blank=True, max_length=2000)
        superseded_by = StrictCharField(required=False, default="", allow_blank=True, max_length=64,
                                        help_text="With to=cancelled: the task that replaces this one.")

        class Meta:
            ref_name = "TaskTransitionInput"

    class OutputSerializer(serializers.Serializer):
        task_id = serializers.CharField()
        status = serializers.CharField(help_text=TASK_STATUSES)
        version = serializers.IntegerField()

        class Meta:
            ref_name = "TaskTransitionOutput"

    @extend_schema(
        operation_id="task_transition", summary="Move the task (compare-and-set on version)",
        description="Only the current fencing token commits. `succeeded` is reached only through a verifier.",
        request=InputSerializer, responses={200: OutputSerializer, **errors(400, 401, 403, 404, 409)},
    )
    def post(self, request, task_id: str):
        task = task_for_principal(principal=request.user, task_id=task_id)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        task = services.task_transition(
            task_id=task.task_id, to=data["to"], expected_version=data["expected_version"],
            fencing_token=data["fencing_token"], actor=request.user.ref, reason=data["reason"],
            evidence=data["evidence"] or None, superseded_by=data["superseded_by"],
        )
        return Response(self.OutputSerializer(task).data)
