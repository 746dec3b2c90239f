"""Agent API for tool calls and operations (the contract clients rely on: add fields, rename none).

`POST /tasks/{id}/calls` proposes a call (ledger.proposals; with `?wait=` it also waits for the
outcome of a call the gate runs at once: `propose_call`); `GET /operations/{id}` reads the
ledger; `GET /calls/{id}?wait=` long-polls. The long-poll is a plain async Django view, not DRF:
a waiting client must hold no thread of its own, so it sleeps on the event loop and reads the
database in short, separate hops (`sync_to_async(thread_sensitive=False)`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
)
from rest_framework import serializers, status
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from approvals.gate import Decision
from console.api import (
    ErrorSerializer,
    JSONObjectField,
    StrictCharField,
    StrictIntegerField,
    error_body,
    errors,
    principal_for_authorization,
)
from console.lib import sql
from console.lib.errors import DomainError, InvalidInput
from ledger import request_dispatch
from ledger.answers import (
    DecisionSerializer,
    OperationOutputSerializer,
    decision_body,
    operation_body,
)
from ledger.longpoll import Doorbell, db_hop
from ledger.models import Operation
from ledger.proposals import MAX_CALL_ID, MAX_STEP_ID, Proposal, call_dry_run, call_propose
from ledger.queries import NOW_FIELDS, NOW_SQL
from ledger.selectors import (
    CALL_STATUSES,
    FINAL_STATUSES,
    WAIT_ENDS,
    call_detail,
    call_for_principal,
    call_status,
    operation_detail,
    operation_for_principal,
)

MAX_WAIT_SECONDS = 30.0
MAX_TOOL_NAME = 100


def printable(value: str) -> None:
    if not value.isprintable():
        raise serializers.ValidationError("Printable characters only (no tabs, newlines or other controls).")


class StrictBooleanField(serializers.BooleanField):
    """A JSON true or false: "yes" and 1 are not answers to "only ask?"."""

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class CallDryRunOutputSerializer(serializers.Serializer):
    class Rule(serializers.Serializer):
        id = serializers.IntegerField()
        argument_path = serializers.CharField()
        comparison = serializers.CharField()
        value = serializers.JSONField()
        tier = serializers.IntegerField()
        description = serializers.CharField(allow_blank=True)

        class Meta:
            ref_name = "EscalationRuleMatched"

    dry_run = serializers.BooleanField(help_text="Always true: nothing was written.")
    outcome = serializers.ChoiceField(choices=[(value, value) for value in Decision.values],
                                      help_text="What a proposal of these arguments would be answered now.")
    risk_tier = serializers.IntegerField(allow_null=True)
    approvals_needed = serializers.IntegerField()
    reasons = serializers.ListField(child=serializers.CharField())
    rules = Rule(many=True, help_text="The escalation rules these arguments match.")
    tool = serializers.CharField()
    task_id = serializers.CharField()
    task_version = serializers.IntegerField()

    class Meta:
        ref_name = "CallDryRunOutput"


# Needed for a proposal, not for a dry run.
PROPOSAL_ONLY = ("call_id", "step_id", "expected_version", "fencing_token")


class _DryRunField(StrictBooleanField):
    """`dry_run` documented as exactly one value: each branch of the proposal's request schema."""

    def __init__(self, value: bool, **kwargs) -> None:
        super().__init__(**kwargs)
        self.value = value


class _DryRunFieldExtension(OpenApiSerializerFieldExtension):
    target_class = _DryRunField
    match_subclasses = True

    def map_serializer_field(self, auto_schema, direction):
        return {"type": "boolean", "enum": [self.target.value]}


class CallProposeApi(APIView):
    class InputSerializer(serializers.Serializer):
        call_id = StrictCharField(
            required=False, max_length=MAX_CALL_ID, trim_whitespace=False, validators=[printable],
            help_text="The model's tool-call ID, unique within the task: any printable characters, kept as sent.")
        step_id = StrictCharField(required=False, max_length=MAX_STEP_ID,
                                  help_text="One side-effecting call per step.")
        tool = StrictCharField(max_length=MAX_TOOL_NAME)
        arguments = JSONObjectField()
        expected_version = StrictIntegerField(required=False, min_value=0)
        fencing_token = StrictIntegerField(required=False, min_value=0)
        dry_run = StrictBooleanField(
            required=False, default=False,
            help_text="Only ask: the gate's verdict for these arguments now; nothing is written. call_id, "
                      "step_id, expected_version and fencing_token are then optional.")

        class Meta:
            ref_name = "CallProposeInput"

        def validate(self, attrs):
            if not attrs["dry_run"]:
                missing = {name: [serializers.Field.default_error_messages["required"]]
                           for name in PROPOSAL_ONLY if name not in attrs}
                if missing:
                    raise serializers.ValidationError(missing)
            return attrs

    # The request as the schema shows it: the ids are required unless `dry_run` is true, which the
    # input serializer checks in `validate` and a flat schema cannot say; one branch for each.
    class ProposalInputSerializer(InputSerializer):
        class Meta:
            ref_name = "CallProposalInput"

        def get_fields(self):
            fields = super().get_fields()
            for name in PROPOSAL_ONLY:
                fields[name].required = True
            fields["dry_run"] = _DryRunField(False, required=False, default=False)
            return fields

    class DryRunInputSerializer(InputSerializer):
        class Meta:
            ref_name = "CallDryRunInput"

        def get_fields(self):
            fields = super().get_fields()
            fields["dry_run"] = _DryRunField(True, required=True)
            return fields

    class OutputSerializer(serializers.Serializer):
        call_id = serializers.CharField()
        operation_id = serializers.CharField(allow_null=True)
        decision = DecisionSerializer(source="outcome")
        final = serializers.BooleanField(source="outcome.final", help_text="Nothing more will happen to this call.")
        status = serializers.CharField(help_text="The operation's status; `refused` when none was created.")
        approval_id = serializers.CharField(allow_null=True)
        reasons = serializers.ListField(child=serializers.CharField())
        risk_tier = serializers.IntegerField(allow_null=True)
        approvals_needed = serializers.IntegerField()
        task_id = serializers.CharField()
        task_version = serializers.IntegerField(help_text="The task's version now (proposing does not move it).")
        result = serializers.JSONField(allow_null=True,
                                       help_text="The operation's result once it has one (a repeat of a call that ran).")

        class Meta:
            ref_name = "CallProposeOutput"

    @extend_schema(
        operation_id="call_propose", summary="Propose a tool call",
        description=(
            "201: a new operation. 200: answered from the ledger (a repeat of the call ID, the same step "
            "under a new call ID, or a refusal). A repeat with the same arguments is answered before any "
            "version or token check; the same call ID with other arguments is 422. With `dry_run: true`, 200 "
            "with the gate's verdict (CallDryRunOutput) and nothing written. With `wait`, a call the gate runs "
            "at once is answered when it is final (or when `wait` runs out, with its status then): one request "
            "proposes and waits. A call held for people is answered at once."
        ),
        parameters=[OpenApiParameter(
            "wait", {"type": "number", "minimum": 0},
            description="Seconds (0–30) to wait for the outcome of a call the gate runs at once.")],
        request=PolymorphicProxySerializer(component_name="CallProposeInput", resource_type_field_name=None,
                                           serializers=[ProposalInputSerializer, DryRunInputSerializer]),
        responses={
            201: OutputSerializer,
            200: PolymorphicProxySerializer(component_name="CallProposeAnswer", resource_type_field_name=None,
                                            serializers=[OutputSerializer, CallDryRunOutputSerializer]),
            **errors(400, 401, 403, 404, 409, 422),
        },
    )
    def post(self, request, task_id: str):
        wait = _parse_wait(request.query_params.get("wait"))
        data = plain_proposal_input(request.data)
        if data is None:  # a dry run, or a body the serializer must read (and answer its errors)
            serializer = self.InputSerializer(data=request.data)
            serializer.is_valid(raise_exception=True)
            data = serializer.validated_data
        if data["dry_run"]:
            answer = call_dry_run(principal=request.user, task_id=task_id, tool_name=data["tool"],
                                  arguments=data["arguments"])
            return Response(CallDryRunOutputSerializer(answer).data)
        proposal = call_propose(
            principal=request.user, task_id=task_id, call_id=data["call_id"], step_id=data["step_id"],
            tool_name=data["tool"], arguments=data["arguments"], expected_version=data["expected_version"],
            fencing_token=data["fencing_token"],
            # Set by `_propose_and_let_go` (a wait, and one of the server's dispatch slots free),
            # which dispatches what this leaves to it.
            dispatch_here=wait > 0 and getattr(request, "dispatch_here", False),
        )
        response = Response(proposal_body(proposal, request),
                            status=status.HTTP_201_CREATED if proposal.created else status.HTTP_200_OK)
        # For `propose_call`, which waits for the outcome when asked to (not part of the body).
        response.proposal, response.wait = proposal, wait
        return response


def plain_proposal_input(data: Any) -> dict[str, Any] | None:
    """CallProposeApi.InputSerializer's validated data for a proposal (not a dry run) whose every
    field is plainly what it accepts, read directly; None for any other body, which the serializer
    then reads and answers with its errors. The serializer deep-copies its eight fields on every
    request an agent waits on. tests/ledger/test_api_call_propose_input.py holds the two equal."""
    if type(data) is not dict or data.get("dry_run", False) is not False:
        return None
    call_id, step_id, tool = data.get("call_id"), data.get("step_id"), data.get("tool")
    arguments, version, token = data.get("arguments"), data.get("expected_version"), data.get("fencing_token")
    if not (_plain_text(call_id, MAX_CALL_ID, trimmed=False) and _plain_text(step_id, MAX_STEP_ID)
            and _plain_text(tool, MAX_TOOL_NAME) and type(arguments) is dict
            and _plain_count(version) and _plain_count(token)):
        return None
    return {"call_id": call_id, "step_id": step_id, "tool": tool, "arguments": arguments,
            "expected_version": version, "fencing_token": token, "dry_run": False}


def _plain_text(value: Any, max_length: int, *, trimmed: bool = True) -> bool:
    # Printable excludes the NUL and surrogate characters the serializer's fields refuse; a
    # trimmed field's value must be one its trimming leaves as it is.
    return (type(value) is str and 0 < len(value) <= max_length and value.isprintable()
            and (not trimmed or value == value.strip()))


def _plain_count(value: Any) -> bool:
    return type(value) is int and 0 <= value <= _MAX_PLAIN_COUNT


_MAX_PLAIN_COUNT = 2**63 - 1  # beyond a bigint the serializer has the last word


def proposal_body(proposal: Proposal, request) -> dict[str, Any]:
    """CallProposeApi.OutputSerializer's representation of a proposal, built directly: the
    serializer deep-copies its fields and the nested decision's for every answer, on the request
    an agent waits on. tests/ledger/test_api_call_propose_body.py holds the two equal."""
    outcome = proposal.outcome
    return {
        "call_id": proposal.call_id,
        "operation_id": proposal.operation_id,
        "decision": decision_body(outcome, request),
        "final": outcome.final,
        "status": proposal.status,
        "approval_id": proposal.approval_id,
        "reasons": [str(reason) for reason in proposal.reasons],
        "risk_tier": proposal.risk_tier,
        "approvals_needed": proposal.approvals_needed,
        "task_id": proposal.task_id,
        "task_version": proposal.task_version,
        "result": proposal.result,
    }


_propose_view = CallProposeApi.as_view()
_propose_in_request_thread = sync_to_async(_propose_view, thread_sensitive=True)


def _propose_and_let_go(request: HttpRequest, task_id: str):
    """The proposal, its dispatch when it is this request's to run (`ledger.request_dispatch`),
    answered with the status the dispatch left; then its database connection back to the pool
    (as the end of a request gives it back): a proposal that waits holds none meanwhile, or a
    few waiting proposals would leave none for the reads that answer them."""
    try:
        with request_dispatch.slot() as free:
            request.dispatch_here = free  # read by `CallProposeApi.post`
            response = _propose_view(request, task_id=task_id)
            proposal = getattr(response, "proposal", None)
            if proposal is None or not proposal.dispatch_here:
                return response
            settled = request_dispatch.dispatch(proposal.operation_id, proposal.claim)
        now = _as_now(proposal) if settled is None else _moved(proposal, settled)
        answer = _json(proposal_body(now, request), status_code=response.status_code)
        answer.proposal, answer.wait = now, response.wait
        return answer
    finally:
        close_old_connections()


_propose_and_let_go_in_request_thread = sync_to_async(_propose_and_let_go, thread_sensitive=True)


@csrf_exempt
async def propose_call(request: HttpRequest, task_id: str) -> HttpResponse:
    """`CallProposeApi`, and with `?wait=` the outcome of a call the gate ran at once: the answer
    waits (on the event loop, holding no thread, as the long-poll does) until the call is final
    or the wait runs out, then carries its status and result. The proposal itself runs as any
    sync view does, in the request's thread."""
    if not request.GET.get("wait"):
        return await _propose_in_request_thread(request, task_id=task_id)
    bell = Doorbell.for_loop()
    async with bell.waiting():
        # Rings heard from here on may be for a commit the proposal's answer does not show.
        since = bell.rings
        response = await _propose_and_let_go_in_request_thread(request, task_id=task_id)
        proposal, wait = getattr(response, "proposal", None), getattr(response, "wait", 0.0)
        if (proposal is None or proposal.call_pk is None or wait <= 0 or proposal.status in WAIT_ENDS
                or proposal.decision != Decision.DISPATCHED):
            return response  # an error, a dry run, an answer the wait ends at, or held for people
        answer = partial(_proposal_now, request, proposal, response.status_code)
        moved = await bell.watch(proposal.call_pk, proposal.status, wait, since=since, answer=answer,
                                 until=WAIT_ENDS, operation_id=proposal.operation_id)
    if moved is not None and moved[1] is not None:
        return moved[1]
    return await db_hop(answer)()


def _proposal_now(request: HttpRequest, proposal: Proposal, status_code: int) -> HttpResponse:
    """The proposal's answer with its operation's status and result as they are now."""
    return _json(proposal_body(_as_now(proposal), request), status_code=status_code)


def _as_now(proposal: Proposal) -> Proposal:
    # A statement written by hand: the answer of every waiting proposal reads it.
    connection = sql.connection_for(Operation)
    return _moved(proposal, sql.load(Operation, sql.fetchone(connection, NOW_SQL, [proposal.operation_id]),
                                     connection=connection, only=NOW_FIELDS))


def _moved(proposal: Proposal, operation: Operation) -> Proposal:
    """The proposal with its operation's status and result as `operation` has them."""
    return replace(proposal, status=operation.status, result=operation.result,
                   outcome=replace(proposal.outcome, final=operation.status in FINAL_STATUSES))


# drf-spectacular documents any URL whose callback names an APIView class.
propose_call.cls = CallProposeApi
propose_call.initkwargs = {}


class OperationGetApi(APIView):
    @extend_schema(operation_id="operation_get", summary="Read an operation, its attempts and approval",
                   responses={200: OperationOutputSerializer, **errors(401, 404)})
    def get(self, request, operation_id: str):
        operation = operation_for_principal(principal=request.user, operation_id=operation_id)
        return Response(operation_body(operation_detail(operation), request))


# --- GET /calls/{call_id}?wait= (async) ------------------------------------------------------


def _json(body: dict[str, Any], *, status_code: int = 200, headers: dict[str, str] | None = None) -> HttpResponse:
    return HttpResponse(JSONRenderer().render(body), status=status_code,
                        content_type="application/json", headers=headers)


def _error(code: str, message: str, details: dict | None = None, *, status_code: int,
           headers: dict[str, str] | None = None) -> HttpResponse:
    return _json(error_body(code, message, details), status_code=status_code, headers=headers)


def _parse_wait(raw: str | None) -> float:
    if raw is None or raw == "":
        return 0.0
    try:
        wait = float(raw)
    except ValueError:
        wait = math.nan
    if not math.isfinite(wait) or wait < 0:
        raise InvalidInput("The request is invalid.",
                           details={"fields": {"wait": [f"A number of seconds from 0 to {MAX_WAIT_SECONDS:g}."]}})
    return min(wait, MAX_WAIT_SECONDS)


def _call_body(call, request, *, fresh: bool = True) -> dict[str, Any]:
    return operation_body(call_detail(call, fresh=fresh), request)


def _parse_seen(raw: str | None) -> str | None:
    if not raw:
        return None
    if raw not in CALL_STATUSES:
        raise InvalidInput("The request is invalid.",
                           details={"fields": {"seen": ["One of: " + ", ".join(CALL_STATUSES) + "."]}})
    return raw


# `until`'s one value: the statuses that answer a poll that waits for the call to be final (or
# parked for a person, `manual`: the agent is told then, not when its wait runs out).
UNTIL = {"final": WAIT_ENDS}


def _parse_until(raw: str | None) -> frozenset[str] | None:
    if raw is None or raw == "":
        return None
    if raw not in UNTIL:
        raise InvalidInput("The request is invalid.",
                           details={"fields": {"until": ["One of: " + ", ".join(UNTIL) + "."]}})
    return UNTIL[raw]


def _unknown_token() -> HttpResponse:
    return _error("unauthenticated", "Use 'Authorization: Bearer <token>' with a known, active agent token.",
                  status_code=401, headers={"WWW-Authenticate": "Bearer"})


@dataclass
class _Look:
    """The first database hop of a poll: the answer, when it needs no waiting, or the call
    and the status to wait on."""

    response: HttpResponse | None = None
    call: Any = None
    baseline: str = ""


def _look(request: HttpRequest, header: str, call_id: str, wait: float, seen: str | None,
          invalid: InvalidInput | None, until: frozenset[str] | None = None) -> _Look:
    """The agent, the call with its operation, and the answer when there is nothing to wait
    for: one hop (the token is checked before the query string, as the DRF views do)."""
    principal = principal_for_authorization(header)
    if principal is None:
        return _Look(response=_unknown_token())
    try:
        if invalid is not None:
            raise invalid
        call = call_for_principal(principal=principal, call_id=call_id, task_id=request.GET.get("task_id") or None)
        status = call_status(call)
        baseline = seen or status
        waits = status not in until if until is not None else status == baseline
        if wait > 0 and waits and status not in FINAL_STATUSES:
            return _Look(call=call, baseline=baseline)
        return _Look(response=_json(_call_body(call, request, fresh=False)))
    except DomainError as exc:
        return _Look(response=_error(exc.code, exc.message, exc.details, status_code=exc.status))


def _answer(request: HttpRequest, call) -> HttpResponse:
    return _json(_call_body(call, request))


async def call_get(request: HttpRequest, call_id: str) -> HttpResponse:
    """Long-poll a call: answer when its operation's status differs from the one the agent last
    saw (`seen`, else the status at the start), or when `wait` seconds (at most 30) have passed —
    with the status as it is then. With `until=final` only a final status answers it (the agent
    waits once per call, not once per status on the way). A call that is already final, or
    already past `seen` (without `until`), is answered at once: a poll that starts after the
    change must not wait for one. A waiting poll wakes on the committed event
    (`ledger.longpoll.Doorbell`), not on a timer. One database hop
    answers a poll that does not wait; one more, shared by every poll the same ring wakes,
    answers one that does."""
    if request.method not in ("GET", "HEAD"):
        return _error("method_not_allowed", f'Method "{request.method}" not allowed.',
                      status_code=405, headers={"Allow": "GET, HEAD"})
    header = request.headers.get("Authorization", "")
    if not header:
        return _error("unauthenticated", "Authentication credentials were not provided.",
                      status_code=401, headers={"WWW-Authenticate": "Bearer"})
    invalid, wait, seen, until = None, 0.0, None, None
    try:
        wait = _parse_wait(request.GET.get("wait"))
        seen = _parse_seen(request.GET.get("seen"))
        until = _parse_until(request.GET.get("until"))
    except InvalidInput as exc:
        invalid, wait = exc, 0.0
    if wait <= 0:
        look = await db_hop(_look)(request, header, call_id, wait, seen, invalid, until)
        return look.response
    bell = Doorbell.for_loop()
    async with bell.waiting():
        # Rings heard from here on may be for a commit the look below does not see yet.
        since = bell.rings
        look = await db_hop(_look)(request, header, call_id, wait, seen, invalid, until)
        if look.response is not None:
            return look.response
        moved = await bell.watch(look.call.pk, look.baseline, wait, since=since,
                                 answer=partial(_answer, request, look.call), until=until,
                                 operation_id=look.call.operation_id)
    if moved is not None and moved[1] is not None:
        return moved[1]
    return await db_hop(_answer)(request, look.call)


class CallGetApi(APIView):
    """Documents `call_get` in the OpenAPI schema; the requests are served by the async view."""

    @extend_schema(
        operation_id="call_get", summary="Read (long-poll) a call's operation",
        description="Answers at once with `wait=0`, or when the call is final (nothing more will happen to "
                    "it); otherwise when the operation's status differs from `seen` (default: the status at "
                    "the start of the request), or after `wait` seconds (at most 30). With `until=final`, "
                    "only a final status (or `manual`: the call waits for a person) answers before `wait` "
                    "runs out: one poll waits for the outcome.",
        parameters=[
            OpenApiParameter("wait", {"type": "number", "minimum": 0}, description="Seconds to wait for a change (0–30)."),
            OpenApiParameter("seen", OpenApiTypes.STR, enum=CALL_STATUSES,
                             description="The status the agent last saw: a different one answers at once."),
            OpenApiParameter("until", OpenApiTypes.STR, enum=list(UNTIL),
                             description="`final`: answer only when the call is final or waits for a person "
                                         "(`manual`), or `wait` runs out (with the status as it is), not at "
                                         "the statuses on the way; `seen` is then not needed."),
            OpenApiParameter("task_id", OpenApiTypes.STR,
                             description="The call's task. Without it, a call ID used in several of your tenant's "
                                         "tasks is 409 (details.task_ids names them)."),
        ],
        responses={200: OperationOutputSerializer, 400: OpenApiResponse(ErrorSerializer),
                   **errors(401, 404, 409)},
    )
    def get(self, request, call_id: str):  # pragma: no cover - never routed
        raise NotImplementedError


# drf-spectacular documents any URL whose callback names an APIView class.
call_get.cls = CallGetApi
call_get.initkwargs = {}
