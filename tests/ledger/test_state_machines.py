"""Property-based: random sequences of service calls on operations, tasks and approvals.

Whatever the sequence, every observed move is one TRANSITIONS allows, an illegal call raises
and changes nothing, and replaying the event log (ordered by id, per entity: the last
`to_status`) rebuilds every record's current status.

Each test runs in one pytest-django transaction (`db`); every example builds its own task,
operations and requests, so examples do not see each other's records.
"""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from approvals import services as approval_services
from approvals.models import APPROVAL_TRANSITIONS, ApprovalDecision, ApprovalRequest, ApprovalStatus
from console.lib.errors import Conflict, DomainError, IllegalTransition, NotPermitted
from console.models import Event
from ledger import decisions
from ledger import services as ledger_services
from ledger.models import (
    OPERATION_TERMINAL,
    OPERATION_TRANSITIONS,
    Attempt,
    Fact,
    Operation,
    OperationStatus,
)
from runs import services as run_services
from runs.models import TASK_TERMINAL, TASK_TRANSITIONS, Lease, Task, TaskStatus
from tests.factories import make_approval_request, make_operation, make_task

S = OperationStatus
A = ApprovalStatus
T = TaskStatus
# Moves an agent may never make: success is a verifier's word, waiting for approval is Countersign's.
AGENT_FORBIDDEN = frozenset({T.SUCCEEDED, T.WAITING_APPROVAL, T.WAITING_REVIEW})

MACHINE_SETTINGS = settings(
    max_examples=30, stateful_step_count=20, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    # The explain phase replays each failure many times over the database: minutes, not seconds.
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)
EVIDENCE = {"provider_query": "no effect", "request_stopped": True}


def event_log(entity: str, ids: list[str]) -> dict[str, list[Event]]:
    log: dict[str, list[Event]] = {i: [] for i in ids}
    for event in Event.objects.filter(entity=entity, entity_id__in=ids).order_by("id"):
        log[event.entity_id].append(event)
    return log


def assert_replay_matches(entity: str, model, transitions, ids: list[str]) -> None:
    """Every record's log starts with its creation, then its transitions make a path through
    `transitions` that ends at the record's status; events of other kinds (one approval of two,
    a reassignment) name the status they found and leave it as it was."""
    current = dict(model.objects.filter(pk__in=ids).values_list("pk", "status"))
    for entity_id, events in event_log(entity, ids).items():
        assert events, f"{entity} {entity_id} has no events"
        assert (events[0].kind, events[0].from_status) == (Event.Kind.CREATED, "")
        status = events[0].to_status
        for event in events[1:]:
            if event.kind == Event.Kind.TRANSITION:
                assert event.from_status == status, (entity_id, status, event)
                assert event.to_status in transitions[status], (entity_id, event)
            else:
                assert event.kind != Event.Kind.CREATED, (entity_id, event)
                assert (event.from_status, event.to_status) == ("", status), (entity_id, event)
            status = event.to_status
        assert status == current[entity_id], (entity_id, [e.to_status for e in events])


# --- operations --------------------------------------------------------------------------------

VERB_TARGETS = {
    "authorize": S.AUTHORIZED, "reject": S.REJECTED, "expire": S.EXPIRED, "cancel": S.CANCELLED,
    "mark_unknown": S.UNKNOWN, "confirm": S.CONFIRMED, "mark_retry_safe": S.RETRY_SAFE,
    "escalate_manual": S.MANUAL, "require_compensation": S.COMPENSATION_REQUIRED, "fail": S.FAILED,
    "mark_compensated": S.COMPENSATED,
}
# Moves TRANSITIONS allows but that belong to the worker holding the fencing token; a person's
# verb may (and should) refuse them. Either answer is accepted here; tests/ledger/test_services
# pins the expected one.
EITHER_WAY = {("mark_retry_safe", S.DISPATCHED), ("fail", S.DISPATCHED), ("confirm", S.DISPATCHED)}
OUTCOME = {Fact.KNOWN_SUCCESS: S.CONFIRMED, Fact.KNOWN_FAILURE: S.FAILED, Fact.UNKNOWN: S.UNKNOWN,
           Fact.NOT_SENT: S.RETRY_SAFE}


def call_verb(verb: str, op_id: str) -> None:
    kwargs = {"operation_id": op_id, "actor": "test", "reason": "property"}
    if verb in ("mark_retry_safe", "fail", "mark_compensated"):
        kwargs["evidence"] = EVIDENCE
    if verb == "confirm":
        kwargs["receipt"] = {"id": "re_1"}
    getattr(ledger_services, f"operation_{verb}")(**kwargs)


class OperationMachine(RuleBasedStateMachine):
    def __init__(self, agent) -> None:
        super().__init__()
        self.agent = agent
        self.task = make_task(agent)
        self.ids: list[str] = []

    # Each walk starts from any status, reached through the services (so the log tells it all).
    @initialize(first=st.sampled_from(sorted(S.values)), second=st.sampled_from(sorted(S.values)))
    def two_operations(self, first, second):
        self.ids = [make_operation(self.agent, task=self.task, status=status).operation_id
                    for status in (first, second)]

    def snapshot(self, op_id: str) -> tuple:
        op = Operation.objects.get(pk=op_id)
        return (op.status, op.fencing_token, op.attempt_count, op.receipt,
                Event.objects.filter(entity="operation", entity_id=op_id).count(),
                Attempt.objects.filter(operation_id=op_id).count())

    def check_move(self, op_id: str, before: tuple, *, raised: bool) -> None:
        after = self.snapshot(op_id)
        if raised or after[0] == before[0]:
            # Refused, a no-op or a stale outcome: status and the event log are untouched.
            assert after[0] == before[0]
            assert after[4] == before[4]
            if raised:
                assert after == before
            return
        assert after[0] in OPERATION_TRANSITIONS[before[0]], (before[0], after[0])
        assert after[4] == before[4] + 1
        last = Event.objects.filter(entity="operation", entity_id=op_id).order_by("-id").first()
        assert (last.from_status, last.to_status) == (before[0], after[0])

    def verb(self, op_id: str, verb: str) -> None:
        before = self.snapshot(op_id)
        target = VERB_TARGETS[verb]
        legal = target == before[0] or target in OPERATION_TRANSITIONS[before[0]]
        try:
            call_verb(verb, op_id)
        except IllegalTransition:
            assert not legal or (verb, before[0]) in EITHER_WAY, (verb, before[0])
            self.check_move(op_id, before, raised=True)
        else:
            assert legal, f"operation_{verb} moved {before[0]} without raising"
            self.check_move(op_id, before, raised=False)
            assert self.snapshot(op_id)[0] == target

    def dispatch(self, op_id: str) -> None:
        before = self.snapshot(op_id)
        try:
            ledger_services.operation_dispatch(operation_id=op_id, worker="w")
        except Conflict:
            assert before[0] not in (S.AUTHORIZED, S.RETRY_SAFE)
            self.check_move(op_id, before, raised=True)
        else:
            assert before[0] in (S.AUTHORIZED, S.RETRY_SAFE)
            self.check_move(op_id, before, raised=False)
            after = self.snapshot(op_id)
            assert (after[1], after[2], after[5]) == (before[1] + 1, before[2] + 1, before[5] + 1)

    def report(self, op_id: str, fact: str, *, stale: bool, terminal: bool) -> None:
        before = self.snapshot(op_id)
        if before[2] == 0:
            return  # never dispatched: no attempt to report on
        token = before[1] + 1 if stale else before[1]
        already_reported = Attempt.objects.get(operation_id=op_id, number=before[2]).finished_at is not None
        _, applied = ledger_services.operation_record_outcome(
            operation_id=op_id, attempt_number=before[2], fencing_token=token, fact=fact,
            receipt={"id": "re_1"} if fact == Fact.KNOWN_SUCCESS else None, terminal_failure=terminal,
        )
        assert applied == (before[0] == S.DISPATCHED and not stale)
        self.check_move(op_id, before, raised=False)
        after = self.snapshot(op_id)
        if applied:
            expected = S.FAILED if fact == Fact.NOT_SENT and terminal else OUTCOME[fact]
            assert after[0] == expected
        else:
            assert after[0] == before[0]
            if not already_reported:  # a repeated report: tests/ledger/test_services pins it
                assert Attempt.objects.get(operation_id=op_id, number=before[2]).stale is True

    # Any call at any time: most are illegal and must be refused without a trace.
    @rule(index=st.sampled_from([0, 0, 0, 1]), verb=st.sampled_from(sorted(VERB_TARGETS)))
    def any_verb(self, index, verb):
        self.verb(self.ids[index], verb)

    @rule(index=st.sampled_from([0, 0, 0, 1]))
    def any_dispatch(self, index):
        self.dispatch(self.ids[index])

    @rule(index=st.sampled_from([0, 0, 0, 1]), fact=st.sampled_from(sorted(OUTCOME)), stale=st.booleans(),
          terminal=st.booleans())
    def any_report(self, index, fact, stale, terminal):
        self.report(self.ids[index], fact, stale=stale, terminal=terminal)

    # A legal next step, so that random walks reach the deep states (manual, retried, ...):
    # twice as likely as the other rules, and moves that end the operation are drawn less often.
    @rule(index=st.sampled_from([0, 0, 0, 1]), data=st.data())
    def a_legal_step(self, index, data):
        self.legal_step(self.ids[index], data)

    @rule(index=st.sampled_from([0, 0, 0, 1]), data=st.data())
    def another_legal_step(self, index, data):
        self.legal_step(self.ids[index], data)

    def legal_step(self, op_id: str, data) -> None:
        status = Operation.objects.values_list("status", flat=True).get(pk=op_id)
        steps = [("verb", v, target) for v, target in sorted(VERB_TARGETS.items())
                 if target in OPERATION_TRANSITIONS[status] and (v, status) not in EITHER_WAY]
        if status in (S.AUTHORIZED, S.RETRY_SAFE):
            steps.append(("dispatch", "", S.DISPATCHED))
        if status == S.DISPATCHED:
            steps += [("report", fact, OUTCOME[fact]) for fact in sorted(OUTCOME)]
        if not steps:
            return  # terminal
        # Moves that keep the operation alive first (Hypothesis favours early choices) and 4:1.
        steps.sort(key=lambda step: step[2] in OPERATION_TERMINAL)
        weighted = [step for step in steps for _ in range(1 if step[2] in OPERATION_TERMINAL else 4)]
        kind, what, _ = data.draw(st.sampled_from(weighted), label="step")
        if kind == "verb":
            self.verb(op_id, what)
        elif kind == "dispatch":
            self.dispatch(op_id)
        else:
            self.report(op_id, what, stale=data.draw(st.booleans(), label="stale"),
                        terminal=data.draw(st.booleans(), label="terminal"))

    @invariant()
    def the_event_log_replays_to_every_status(self):
        assert_replay_matches("operation", Operation, OPERATION_TRANSITIONS, self.ids)

    @invariant()
    def tokens_and_attempts_move_together(self):
        for op in Operation.objects.filter(pk__in=self.ids):
            numbers = list(Attempt.objects.filter(operation=op).values_list("number", "fencing_token"))
            assert numbers == [(n, n) for n in range(1, op.attempt_count + 1)]
            assert op.fencing_token == op.attempt_count


def test_random_operation_call_sequences_stay_within_transitions(agent):
    run_state_machine_as_test(lambda: OperationMachine(agent), settings=MACHINE_SETTINGS)


# --- tasks and leases ----------------------------------------------------------------------------


class TaskMachine(RuleBasedStateMachine):
    OWNERS = ("w1", "w2", "w3")
    TTL = 30

    def __init__(self, agent) -> None:
        super().__init__()
        self.task_id = make_task(agent).task_id
        self.now = timezone.now()

    def state(self) -> tuple:
        task = Task.objects.get(pk=self.task_id)
        lease = Lease.objects.filter(task_id=self.task_id).values_list("owner", "fencing_token", "expires_at").first()
        events = Event.objects.filter(entity__in=("task", "lease"), entity_id=self.task_id).count()
        return task.status, task.version, lease, events

    @rule(seconds=st.integers(0, 45))
    def time_passes(self, seconds):
        self.now += timedelta(seconds=seconds)

    @rule(owner=st.sampled_from(OWNERS))
    def acquire(self, owner):
        status, version, lease, events = self.state()
        try:
            decisions.lease_acquire(task_id=self.task_id, owner=owner, ttl_seconds=self.TTL, now=self.now)
        except Conflict:
            assert status in (T.SUCCEEDED, T.FAILED, T.CANCELLED) or (
                lease is not None and lease[0] != owner and lease[2] > self.now)
            assert self.state() == (status, version, lease, events)
            return
        new_lease = self.state()[2]
        assert new_lease[0] == owner
        if lease is None:
            assert new_lease[1] == 1
        elif lease[0] == owner and lease[2] > self.now:
            assert new_lease[1] == lease[1]  # a renewal keeps the token
        else:
            assert new_lease[1] == lease[1] + 1  # a takeover: token + 1

    @rule(to=st.sampled_from(sorted(T.values)), version_offset=st.sampled_from([0, 0, 0, -1, 1]),
          stale_token=st.booleans())
    def agent_moves(self, to, version_offset, stale_token):
        self.move(to, version_offset, stale_token)

    @rule(data=st.data())
    def agent_moves_legally(self, data):
        # A legal move by the lease holder, so that walks get past `queued`.
        status = Task.objects.values_list("status", flat=True).get(pk=self.task_id)
        moves = sorted(TASK_TRANSITIONS[status] - AGENT_FORBIDDEN, key=lambda to: to in TASK_TERMINAL)
        if not moves:
            return
        if not Lease.objects.filter(task_id=self.task_id).exists():
            self.acquire("w1")
        self.move(data.draw(st.sampled_from(moves), label="to"), 0, False)

    def move(self, to: str, version_offset: int, stale_token: bool) -> None:
        status, version, lease, events = self.state()
        token = None if lease is None else lease[1] - 1 if stale_token else lease[1]
        try:
            run_services.task_transition(
                task_id=self.task_id, to=to, expected_version=version + version_offset,
                fencing_token=token, actor="agent",
            )
        except DomainError as exc:
            assert self.state() == (status, version, lease, events)
            fenced_ok = lease is not None and not stale_token
            legal = to == status or to in TASK_TRANSITIONS[status]
            if isinstance(exc, NotPermitted):
                assert to in AGENT_FORBIDDEN
            elif isinstance(exc, IllegalTransition):
                assert fenced_ok and version_offset == 0 and not legal
            else:
                assert not fenced_ok or version_offset != 0
            return
        assert lease is not None and not stale_token and version_offset == 0 and to not in AGENT_FORBIDDEN
        new_status, new_version, _, new_events = self.state()
        assert new_status == to
        if to == status:
            assert (new_version, new_events) == (version, events)
        else:
            assert to in TASK_TRANSITIONS[status]
            assert (new_version, new_events) == (version + 1, events + 1)

    @invariant()
    def the_event_log_replays_to_the_status_and_version(self):
        assert_replay_matches("task", Task, TASK_TRANSITIONS, [self.task_id])
        moves = Event.objects.filter(entity="task", entity_id=self.task_id, kind=Event.Kind.TRANSITION).count()
        assert Task.objects.get(pk=self.task_id).version == 1 + moves

    @invariant()
    def fencing_tokens_strictly_increase_and_the_log_names_the_current_one(self):
        tokens = [e["fencing_token"] for e in Event.objects.filter(
            entity="lease", entity_id=self.task_id).order_by("id").values_list("evidence", flat=True)]
        assert tokens == list(range(1, len(tokens) + 1))
        lease = Lease.objects.filter(task_id=self.task_id).first()
        assert (lease.fencing_token if lease else None) == (tokens[-1] if tokens else None)


def test_random_task_and_lease_sequences_stay_within_transitions(agent):
    run_state_machine_as_test(lambda: TaskMachine(agent), settings=MACHINE_SETTINGS)


# --- approvals -----------------------------------------------------------------------------------

# What an approval request's status says about its operation's.
OPERATION_FOR_REQUEST = {
    A.PENDING: {S.PLANNED},
    A.APPROVED: {S.AUTHORIZED, S.DISPATCHED},
    A.CONSUMED: {S.AUTHORIZED, S.DISPATCHED},
    A.REJECTED: {S.REJECTED},
    A.EXPIRED: {S.EXPIRED, S.DISPATCHED},
    A.INVALIDATED: {S.CANCELLED, S.DISPATCHED},
}


class ApprovalMachine(RuleBasedStateMachine):
    def __init__(self, agent, people) -> None:
        super().__init__()
        self.people = people  # name -> (user, max tier in the agent's tenant or None)
        task = make_task(agent)
        self.requests = [
            make_approval_request(make_operation(agent, task=task), risk_tier=3, approvals_needed=1).approval_id,
            make_approval_request(make_operation(agent, task=task), risk_tier=4, approvals_needed=2).approval_id,
            make_approval_request(make_operation(agent, task=task), risk_tier=2, approvals_needed=1).approval_id,
        ]

    def state(self, approval_id: str) -> tuple:
        request = ApprovalRequest.objects.get(pk=approval_id)
        return (
            request.status,
            Operation.objects.get(pk=request.operation_id).status,
            request.expires_at <= timezone.now(),
            ApprovalDecision.objects.filter(request=request).count(),
            Event.objects.filter(entity="approval", entity_id=approval_id).count(),
            Event.objects.filter(entity="operation", entity_id=request.operation_id).count(),
        )

    def request(self, index: int) -> ApprovalRequest:
        return ApprovalRequest.objects.get(pk=self.requests[index])

    @rule(index=st.integers(0, 2), who=st.sampled_from(["reviewer", "senior", "senior2", "outsider"]))
    def approve(self, index, who):
        user, max_tier = self.people[who]
        request = self.request(index)
        before = self.state(request.pk)
        already = ApprovalDecision.objects.filter(request=request, reviewer=user).exists()
        try:
            decisions.approval_approve(approval_id=request.pk, reviewer=user)
        except DomainError as exc:
            assert self.state(request.pk) == before
            if isinstance(exc, NotPermitted):
                assert max_tier is None or request.risk_tier > max_tier
            else:
                assert before[0] != A.PENDING or before[2] or already
            return
        assert max_tier is not None and request.risk_tier <= max_tier
        assert before[0] == A.PENDING and not before[2] and not already
        after = self.state(request.pk)
        assert after[3] == before[3] + 1
        if after[0] == A.APPROVED:
            assert after[3] == request.approvals_needed
            assert (after[1], after[4], after[5]) == (S.AUTHORIZED, before[4] + 1, before[5] + 1)
        else:
            assert after[0] == A.PENDING and after[3] < request.approvals_needed
            assert (after[4], after[5]) == (before[4] + 1, before[5])

    @rule(index=st.integers(0, 2), who=st.sampled_from(["reviewer", "senior", "outsider"]),
          reason=st.sampled_from(["", "wrong amount"]))
    def reject(self, index, who, reason):
        user, max_tier = self.people[who]
        request = self.request(index)
        before = self.state(request.pk)
        allowed = bool(reason) and max_tier is not None and request.risk_tier <= max_tier
        open_ = before[0] == A.PENDING and not before[2]
        try:
            decisions.approval_reject(approval_id=request.pk, reviewer=user, reason=reason)
        except DomainError:
            assert self.state(request.pk) == before
            already = ApprovalDecision.objects.filter(request=request, reviewer=user).exists()
            assert not (allowed and open_ and not already)
            return
        assert allowed and open_
        after = self.state(request.pk)
        assert (after[0], after[1]) == (A.REJECTED, S.REJECTED)
        assert (after[4], after[5]) == (before[4] + 1, before[5] + 1)

    @rule(index=st.integers(0, 2), verb=st.sampled_from(["expire", "invalidate", "consume"]))
    def system_closes(self, index, verb):
        approval_id = self.requests[index]
        before = self.state(approval_id)
        target = {"expire": A.EXPIRED, "invalidate": A.INVALIDATED, "consume": A.CONSUMED}[verb]
        call = {
            "expire": lambda: decisions.approval_expire(approval_id=approval_id),
            "invalidate": lambda: decisions.approval_invalidate(
                approval_id=approval_id, actor="system", reason="property"),
            "consume": lambda: approval_services.approval_consume(approval_id=approval_id, actor="worker:w"),
        }[verb]
        try:
            call()
        except IllegalTransition:
            assert target not in APPROVAL_TRANSITIONS[before[0]] and target != before[0]
            assert self.state(approval_id) == before
            return
        after = self.state(approval_id)
        assert after[0] == target
        if before[0] == target:
            assert after == before
        else:
            assert target in APPROVAL_TRANSITIONS[before[0]]
            assert after[4] == before[4] + 1

    @rule(index=st.integers(0, 2))
    def time_runs_out(self, index):
        ApprovalRequest.objects.filter(pk=self.requests[index]).update(
            expires_at=timezone.now() - timedelta(seconds=1))

    @rule(index=st.integers(0, 2))
    def dispatcher_takes_it(self, index):
        request = self.request(index)
        if request.status != A.APPROVED or Operation.objects.get(pk=request.operation_id).status != S.AUTHORIZED:
            return
        approval_services.approval_consume(approval_id=request.pk, actor="worker:w")
        ledger_services.operation_dispatch(operation_id=request.operation_id, worker="w")

    @invariant()
    def the_event_logs_replay_to_every_status(self):
        assert_replay_matches("approval", ApprovalRequest, APPROVAL_TRANSITIONS, self.requests)
        op_ids = list(ApprovalRequest.objects.filter(pk__in=self.requests).values_list("operation_id", flat=True))
        assert_replay_matches("operation", Operation, OPERATION_TRANSITIONS, op_ids)

    @invariant()
    def each_operation_agrees_with_its_request(self):
        requests = list(ApprovalRequest.objects.filter(pk__in=self.requests).values_list(
            "pk", "status", "approvals_needed", "operation__status"))
        decisions = list(ApprovalDecision.objects.filter(request_id__in=self.requests).values_list(
            "request_id", "reviewer_id", "verdict"))
        for approval_id, status, needed, operation_status in requests:
            assert operation_status in OPERATION_FOR_REQUEST[status], (status, operation_status)
            mine = [(reviewer, verdict) for request_id, reviewer, verdict in decisions if request_id == approval_id]
            assert len({reviewer for reviewer, _ in mine}) == len(mine)  # distinct people
            if status in (A.APPROVED, A.CONSUMED):
                assert sum(verdict == "approve" for _, verdict in mine) == needed


def test_random_approval_sequences_stay_within_transitions(agent, reviewer, senior, senior2, outsider):
    people = {"reviewer": (reviewer, 3), "senior": (senior, 4), "senior2": (senior2, 4), "outsider": (outsider, None)}
    run_state_machine_as_test(lambda: ApprovalMachine(agent, people), settings=MACHINE_SETTINGS)
