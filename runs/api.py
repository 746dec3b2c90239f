"""Agent API for task contracts, leases and transitions.

One view per operation; each view validates with its input serializer, calls one service and
answers with its output serializer. The shared fields, the error shape and bearer-token auth
come from `console.api`; errors reach the client through its `exception_handler`.
"""

from __future__ import annotations

import math

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    PolymorphicProxySerializer,
    extend_schema,
    extend_schema_field,
)
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from approvals.gate import CONSTRAINT_TYPES, parse_deadline, task_limits
from console.api import (
    JSONObjectField,
    StrictCharField,
    StrictIntegerField,
    canonicalizable,
    errors,
)
from ledger import decisions, starts
from runs import criteria, services, verifiers
from runs.models import TaskStatus
from runs.selectors import task_by_idempotency_key, task_for_principal, task_lease

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


# --- success criteria ------------------------------------------------------------------------


def bounded_value(value):
    """An expected value or argument subset: small and shallow (`runs.criteria` limits)."""
    if criteria.value_depth(value) > criteria.MAX_VALUE_DEPTH:
        raise serializers.ValidationError(f"Nested at most {criteria.MAX_VALUE_DEPTH} levels.")
    if criteria.value_size(value) > criteria.MAX_VALUE_BYTES:
        raise serializers.ValidationError(f"At most {criteria.MAX_VALUE_BYTES} characters as JSON.")
    return value


def valid_path(value: str) -> str:
    try:
        criteria.path_segments(value)
    except criteria.BadPath as exc:
        raise serializers.ValidationError(str(exc)) from exc
    return value


class AnyJSONField(serializers.JSONField):
    """Any JSON value (null too), bounded."""

    def __init__(self, **kwargs):
        super().__init__(allow_null=True, validators=[bounded_value], **kwargs)


def _kind(name: str):
    return serializers.ChoiceField(choices=[name], help_text=f"`{name}`")


def _label():
    return StrictCharField(required=False, max_length=criteria.MAX_DESCRIPTION,
                           help_text="What this criterion means, for the people who read the run page.")


class OperationConfirmedCriterion(serializers.Serializer):
    kind = _kind(criteria.OPERATION_CONFIRMED)
    tool = StrictCharField(max_length=100, help_text="The tool's name, e.g. `payments.refund`.")
    arguments = JSONObjectField(required=False, validators=[bounded_value],
                                help_text="A subset the operation's arguments must contain (objects recursively).")
    description = _label()

    class Meta:
        ref_name = "OperationConfirmedCriterion"


class ResultMatchesCriterion(serializers.Serializer):
    kind = _kind(criteria.RESULT_MATCHES)
    call_id = StrictCharField(required=False, max_length=128, help_text="One call of this task (or `tool`).")
    tool = StrictCharField(required=False, max_length=100, help_text="Any confirmed call of the tool (or `call_id`).")
    path = StrictCharField(required=False, default="", allow_blank=True, max_length=criteria.MAX_PATH_LENGTH,
                           validators=[valid_path],
                           help_text="Into the call's result: a JSON pointer (`/refund/id`) or a dotted path "
                                     f"(`refund.id`), at most {criteria.MAX_PATH_SEGMENTS} segments; empty: the "
                                     "whole result.")
    equals = AnyJSONField(required=False, help_text="The value there equals this (or `contains`).")
    contains = AnyJSONField(required=False, help_text="A string there contains this substring, a list an "
                                                      "element equal to it, an object this subset (or `equals`).")
    description = _label()

    class Meta:
        ref_name = "ResultMatchesCriterion"

    def validate(self, attrs):
        if ("call_id" in attrs) == ("tool" in attrs):
            raise serializers.ValidationError({"call_id": ["Name exactly one of call_id and tool."]})
        if ("equals" in self.initial_data) == ("contains" in self.initial_data):
            raise serializers.ValidationError({"equals": ["Give exactly one of equals and contains."]})
        return attrs


class HumanCriterion(serializers.Serializer):
    kind = _kind(criteria.HUMAN)
    description = StrictCharField(max_length=criteria.MAX_DESCRIPTION,
                                  help_text="What a reviewer of the tenant confirms on the console, with evidence.")

    class Meta:
        ref_name = "HumanCriterion"


class VerifierCriterion(serializers.Serializer):
    kind = _kind(criteria.VERIFIER)
    name = StrictCharField(max_length=100, help_text="A registered check: " + ", ".join(
        f"`{name}`" for name in sorted(verifiers.VERIFIERS)) + ".")
    params = JSONObjectField(required=False, default=dict, validators=[bounded_value])
    description = _label()

    class Meta:
        ref_name = "VerifierCriterion"

    def validate_name(self, value: str) -> str:
        if value not in verifiers.VERIFIERS:
            raise serializers.ValidationError(f"No verifier registered as {value!r}.")
        return value


CRITERION_SERIALIZERS = {
    criteria.OPERATION_CONFIRMED: OperationConfirmedCriterion,
    criteria.RESULT_MATCHES: ResultMatchesCriterion,
    criteria.HUMAN: HumanCriterion,
    criteria.VERIFIER: VerifierCriterion,
}
SUCCESS_CRITERION = PolymorphicProxySerializer(
    component_name="SuccessCriterion", resource_type_field_name="kind",
    serializers=dict(CRITERION_SERIALIZERS),
)


@extend_schema_field({"oneOf": [
    {"type": "string", "minLength": 1, "maxLength": criteria.MAX_DESCRIPTION,
     "description": "Free text: a `human` criterion with this description."},
    {"$ref": "#/components/schemas/SuccessCriterion"},
]})
class CriterionField(serializers.Field):
    """One success criterion in: free text, a registered verifier's name as kind (shorthand for
    `verifier`), or one of the kinds; answered in normal form (`runs.criteria.normalize`).
    Unknown keys are refused: a misspelt `equal` must not make a check that always passes."""

    default_error_messages = {"invalid": "Expected a string or an object with a `kind`."}

    def to_internal_value(self, data):
        if isinstance(data, str):
            if not data.strip() or len(data) > criteria.MAX_DESCRIPTION:
                raise serializers.ValidationError(f"Free text of 1 to {criteria.MAX_DESCRIPTION} characters.")
        elif not isinstance(data, dict):
            self.fail("invalid")
        [data] = criteria.normalize([data], verifiers.VERIFIERS)
        serializer_class = CRITERION_SERIALIZERS.get(data.get("kind"))
        if serializer_class is None:
            raise serializers.ValidationError({"kind": [
                f"One of {', '.join(criteria.KINDS)}, or a registered verifier: "
                f"{', '.join(sorted(verifiers.VERIFIERS))}."]})
        serializer = serializer_class(data=data)
        unknown = sorted(set(data) - set(serializer.fields))
        if unknown:
            raise serializers.ValidationError({key: ["Unknown key for this kind."] for key in unknown})
        if not serializer.is_valid():
            raise serializers.ValidationError(serializer.errors)
        return dict(serializer.validated_data)

    def to_representation(self, value):
        return value


@extend_schema_field(SUCCESS_CRITERION)
class CriterionOutputField(serializers.Field):
    def to_representation(self, value):
        return value


class CriteriaOutputField(serializers.ListField):
    """The contract's criteria in normal form (older contracts' free text read as `human`)."""

    child = CriterionOutputField()

    def to_representation(self, data):
        return super().to_representation(criteria.normalize(data if isinstance(data, list) else [],
                                                            verifiers.VERIFIERS))


class VerdictSerializer(serializers.Serializer):
    criterion = CriterionOutputField()
    source = serializers.CharField(help_text="`contract`, or `task type` (a check every task of its type has).")
    description = serializers.CharField()
    result = serializers.CharField(help_text="met, pending, failed, or review (waiting for a reviewer).")
    evidence = serializers.DictField(help_text="What the verdict rests on: operation IDs, receipts, the value "
                                               "found, or the reviewer's decision.")

    class Meta:
        ref_name = "CriterionVerdict"


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
    success_criteria = CriteriaOutputField()
    verdicts = VerdictSerializer(many=True, help_text="Each criterion's last verdict (empty until the task was "
                                                      "verified).")
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
# As `idempotency_key` checks it. HTTP drops a header value's leading and trailing spaces, so the
# first and last characters are not spaces.
IDEMPOTENCY_KEY_SCHEMA = {"type": "string", "minLength": 1, "maxLength": IDEMPOTENCY_KEY_MAX,
                          "pattern": "^[!-~]([ -~]*[!-~])?$"}


def idempotency_key(request) -> str:
    """The Idempotency-Key header: absent is no key; present, 1 to 255 printable ASCII characters."""
    key = request.headers.get("Idempotency-Key")
    return "" if key is None else checked_key(key, field="Idempotency-Key")


def checked_key(key: str, *, field: str) -> str:
    if not 0 < len(key) <= IDEMPOTENCY_KEY_MAX or not all(" " <= ch <= "~" for ch in key):
        raise serializers.ValidationError({field: [f"1 to {IDEMPOTENCY_KEY_MAX} printable ASCII characters."]})
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
        # The contract is hashed canonically (an Idempotency-Key binds to it).
        inputs = JSONObjectField(required=False, default=dict, validators=[canonicalizable])
        success_criteria = serializers.ListField(
            child=CriterionField(), required=False, default=list, max_length=criteria.MAX_CRITERIA, validators=[canonicalizable],
            help_text="Checks judged from the ledger when the agent finishes (`to: verifying`); all must pass "
                      "for `succeeded`. `human` ones (and free text) wait for a reviewer: `waiting_review`.")
        constraints = JSONObjectField(required=False, default=dict, validators=[validate_constraints, canonicalizable])
        versions = JSONObjectField(required=False, default=dict, validators=[canonicalizable])
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
        parameters=[OpenApiParameter("Idempotency-Key", IDEMPOTENCY_KEY_SCHEMA, OpenApiParameter.HEADER,
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

    @extend_schema(
        operation_id="task_get_by_key", summary="Read the task registered under an Idempotency-Key",
        description="The task this agent registered with `Idempotency-Key: K`, in whatever status, without a "
                    "lease: a restarted agent learns that its task is finished (a start with `lease` is 409 then).",
        parameters=[OpenApiParameter("idempotency_key", OpenApiTypes.STR, OpenApiParameter.QUERY, required=True,
                                     description="1 to 255 printable ASCII characters.")],
        responses={200: TaskOutputSerializer, **errors(400, 401, 404)},
    )
    def get(self, request):
        key = checked_key(request.query_params.get("idempotency_key", ""), field="idempotency_key")
        task = task_by_idempotency_key(principal=request.user, idempotency_key=key)
        return Response(TaskOutputSerializer(task).data)


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
