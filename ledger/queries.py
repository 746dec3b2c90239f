"""The ledger's statements written by hand for its hot path, named from the models' `_meta`.

Built once per database vendor (`functools.cache`) or at import, so each text is the same on
every call and psycopg prepares it on PostgreSQL. Each statement's `Shape` (what it reads, by
model and field) is in `SHAPES`, by name; tests/console/test_queries.py checks every statement
against it and runs it once.
"""

from __future__ import annotations

from functools import cache

from approvals import queries as approval_queries
from approvals.models import PolicyGeneration, Tool
from console.lib import sql
from console.models import AgentPrincipal, Tenant
from ledger.models import Attempt, Call, Operation, ToolCircuit
from runs.models import Lease, Step, Task

_col = sql.column


def _locks_sharing_the_agent(connection, of: str) -> str:
    """`FOR UPDATE OF <of>`, and the agent's row (alias `a`) share-locked where the database
    can lock one table of a join (PostgreSQL; SQLite serializes writers anyway)."""
    locks = sql.for_update(connection, of=of)
    if locks and connection.features.has_select_for_update_of:
        locks += " FOR SHARE OF a"
    return locks


def _in_flight(tenant_column: str) -> str:
    """How many of the tenant's operations are in a status (a parameter: dispatched)."""
    return (f"(SELECT COUNT(*) FROM {sql.table(Operation)} f "
            f"WHERE {_col(Operation, 'tenant', 'f')} = {tenant_column} AND {_col(Operation, 'status', 'f')} = %s)")


def _tokens(vendor: str) -> str:
    """The configuration generation's token as of the statement's snapshot, then share-locked
    (`claim_sql` says why twice)."""
    return f"{approval_queries.TOKEN_SUBQUERY}, ({approval_queries.token_for_share_sql(vendor)})"


# Whether the call and the operation are in the ledger already: their ids or NULL, for a task
# aliased `t`. Parameters: the call id, the operation id.
_KNOWN_CALL_AND_OPERATION = (
    f"(SELECT {_col(Call, 'pk', 'c')} FROM {sql.table(Call)} c "
    f"WHERE {_col(Call, 'task', 'c')} = {_col(Task, 'pk', 't')} AND {_col(Call, 'call_id', 'c')} = %s), "
    f"(SELECT {_col(Operation, 'pk', 'o')} FROM {sql.table(Operation)} o WHERE {_col(Operation, 'pk', 'o')} = %s)")


@cache
def claim_sql(vendor: str) -> str:
    """The dispatcher's claim: the operation locked, with its tool, its task, its agent (row
    share-locked: a deactivation committed before is seen, one after waits for the claim to
    commit) and the agent's tenant, the tool's circuit breaker verdict (or NULLs), the count
    of the tenant's operations in a status (dispatched), and the configuration generation's
    token twice: as of this statement's snapshot, then share-locked (held until the claim
    commits; a change waits for it), which reads the latest committed. One statement: the
    locks and reads ride with the operation's. The two tokens differ only when a configuration
    change committed after the snapshot (the statement waited for it): the caller runs the
    statement again, and its new snapshot has the change. Parameters: that status, the
    operation id."""
    connection = sql.connection_for(Operation)
    return (
        f"SELECT {sql.columns(Operation, 'o')}, {sql.columns(Tool, 't')}, {sql.columns(Task, 'k')}, "
        f"{sql.columns(AgentPrincipal, 'a')}, {sql.columns(Tenant, 'n')}, {sql.columns(ToolCircuit, 'c')}, "
        f"{_in_flight(_col(Operation, 'tenant', 'o'))}, {_tokens(vendor)} "
        f"FROM {sql.table(Operation)} o "
        f"JOIN {sql.table(Tool)} t ON {_col(Tool, 'pk', 't')} = {_col(Operation, 'tool', 'o')} "
        f"JOIN {sql.table(Task)} k ON {_col(Task, 'pk', 'k')} = {_col(Operation, 'task', 'o')} "
        f"JOIN {sql.table(AgentPrincipal)} a ON {_col(AgentPrincipal, 'pk', 'a')} = {_col(Operation, 'principal', 'o')} "
        f"JOIN {sql.table(Tenant)} n ON {_col(Tenant, 'pk', 'n')} = {_col(AgentPrincipal, 'tenant', 'a')} "
        f"LEFT JOIN {sql.table(ToolCircuit)} c ON {_col(ToolCircuit, 'tool', 'c')} = {_col(Operation, 'tool', 'o')} "
        f"WHERE {_col(Operation, 'pk', 'o')} = %s{_locks_sharing_the_agent(connection, 'o')}"
    )


# The dispatcher's check, just before the provider call, that the claim is still its own.
# Parameters: the operation id, the status (dispatched), the claim's fencing token.
STILL_MINE_SQL = (f"SELECT 1 FROM {sql.table(Operation)} "
                  f"WHERE {_col(Operation, 'pk')} = %s AND {_col(Operation, 'status')} = %s "
                  f"AND {_col(Operation, 'fencing_token')} = %s")


# Another operation of the tool on the same business object (one order's refunds) in flight:
# dispatched, or unknown (in doubt, it may have happened). Parameters: the tool, the business
# key, the two statuses, the operation itself (never busy because of itself).
BUSINESS_KEY_BUSY_SQL = (f"SELECT 1 FROM {sql.table(Operation)} "
                         f"WHERE {_col(Operation, 'tool')} = %s AND {_col(Operation, 'business_key')} = %s "
                         f"AND ({_col(Operation, 'status')} = %s OR {_col(Operation, 'status')} = %s) "
                         f"AND NOT ({_col(Operation, 'pk')} = %s) LIMIT 1")


# Does the agent take webhooks (a URL, not disabled)? Asked by every move that makes a webhook
# event: inside its transaction, or (the dispatcher's receipt) as the `unless` of its one
# statement. Parameter: the agent's id.
RECEIVES_WEBHOOKS_SQL = (f"SELECT 1 FROM {sql.table(AgentPrincipal)} "
                         f"WHERE {_col(AgentPrincipal, 'pk')} = %s AND {_col(AgentPrincipal, 'webhook_disabled_at')} IS NULL "
                         f"AND {_col(AgentPrincipal, 'webhook_url')} <> ''")


@cache
def lease_sql(vendor: str) -> str:
    """The proposal's first lock: the task's lease, if the task is the tenant's.
    Parameters: the task id, the tenant id."""
    connection = sql.connection_for(Lease)
    return (f"SELECT {sql.columns(Lease, 'l')} FROM {sql.table(Lease)} l "
            f"JOIN {sql.table(Task)} t ON {_col(Task, 'pk', 't')} = {_col(Lease, 'task', 'l')} "
            f"WHERE {_col(Lease, 'task', 'l')} = %s AND {_col(Task, 'tenant', 't')} = %s"
            f"{sql.for_update(connection, of='l')}")


# The task's fields a proposal reads: all but the contract's free-form documents, which an
# agent may make large and no proposal reads (its gate reads `constraints`). Loaded deferred, as
# `.only()` leaves them: read, they would be selected and parsed on every call.
CONTRACT_DOCUMENTS = ("inputs", "success_criteria", "versions", "verdicts")
PROPOSAL_TASK_FIELDS = tuple(field.name for field in Task._meta.concrete_fields if field.name not in CONTRACT_DOCUMENTS)


@cache
def task_sql(vendor: str) -> str:
    """The proposal's second lock: the task (its `PROPOSAL_TASK_FIELDS`) with its tenant, whether
    the call and the operation are in the ledger already (their ids or NULL), and the
    configuration generation's token. Parameters: the call id, the operation id, the task id,
    the tenant id."""
    connection = sql.connection_for(Task)
    return (f"SELECT {sql.columns(Task, 't', only=PROPOSAL_TASK_FIELDS)}, {sql.columns(Tenant, 'n')}, "
            f"{_KNOWN_CALL_AND_OPERATION}, "
            f"{approval_queries.TOKEN_SUBQUERY} "
            f"FROM {sql.table(Task)} t "
            f"JOIN {sql.table(Tenant)} n ON {_col(Tenant, 'pk', 'n')} = {_col(Task, 'tenant', 't')} "
            f"WHERE {_col(Task, 'pk', 't')} = %s AND {_col(Task, 'tenant', 't')} = %s"
            f"{sql.for_update(connection, of='t')}")


@cache
def task_for_claim_sql(vendor: str) -> str:
    """`task_sql` for a proposal whose request will dispatch the call (ledger/request_dispatch.py),
    with what the claim reads beside it, so that the claim, in the same transaction, needs no
    statement of its own: the agent, the tool's circuit breaker verdict (or NULLs), the count of
    the tenant's operations in a status (dispatched), the agent's row version and the
    configuration generation's token. Only the task's row is locked here: the agent's row and
    the generation are share-locked by the proposal's write, if they are still as read
    (`AUTHORITY_MOVED_SQL`). Scalars, in order: the call's id, the operation's, the count, the
    agent's row version (PostgreSQL's `xmin`; NULL on SQLite, whose writers take turns), the
    token. Parameters: the call id, the operation id, that status, the agent's id, the tool's
    name, the task id, the tenant id."""
    connection = sql.connection_for(Task)
    agent_version = "a.xmin::text" if vendor == "postgresql" else "NULL"
    return (f"SELECT {sql.columns(Task, 't', only=PROPOSAL_TASK_FIELDS)}, {sql.columns(Tenant, 'n')}, "
            f"{sql.columns(AgentPrincipal, 'a')}, "
            f"{sql.columns(ToolCircuit, 'r')}, {_KNOWN_CALL_AND_OPERATION}, "
            f"{_in_flight(_col(Task, 'tenant', 't'))}, {agent_version}, {approval_queries.TOKEN_SUBQUERY} "
            f"FROM {sql.table(Task)} t "
            f"JOIN {sql.table(Tenant)} n ON {_col(Tenant, 'pk', 'n')} = {_col(Task, 'tenant', 't')} "
            f"JOIN {sql.table(AgentPrincipal)} a ON {_col(AgentPrincipal, 'pk', 'a')} = %s "
            f"AND {_col(AgentPrincipal, 'tenant', 'a')} = {_col(Task, 'tenant', 't')} "
            f"LEFT JOIN {sql.table(ToolCircuit)} r ON {_col(ToolCircuit, 'tool', 'r')} = "
            f"(SELECT {_col(Tool, 'pk', 'u')} FROM {sql.table(Tool)} u WHERE {_col(Tool, 'name', 'u')} = %s) "
            f"WHERE {_col(Task, 'pk', 't')} = %s AND {_col(Task, 'tenant', 't')} = %s"
            f"{sql.for_update(connection, of='t')}")


# A dispatching proposal's write goes ahead only if the agent's row and the configuration are
# as its task statement read them (`task_for_claim_sql`), and share-locks both until its commit:
# a change committed since is seen (a row here: nothing is written, the proposal reads again),
# one that comes later waits for the commit. Held from the write, not from the task statement:
# every dispatching proposal of an agent, and of the whole system for the generation, shares
# these two rows, so each holds them for its write and commit only, not through its gate.
# PostgreSQL only (SQLite's writers take turns: what the proposal read stays as it is).
# Parameters: the agent's id, its row version as read, the token as read.
AUTHORITY_MOVED_SQL = (
    f"SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM {sql.table(AgentPrincipal)} a "
    f"WHERE {_col(AgentPrincipal, 'pk', 'a')} = %s AND %s::text = a.xmin::text FOR SHARE) "
    f"OR NOT EXISTS (SELECT 1 FROM {sql.table(PolicyGeneration)} g "
    f"WHERE {_col(PolicyGeneration, 'pk', 'g')} = 1 AND {_col(PolicyGeneration, 'token', 'g')} = %s FOR SHARE)")


# What a call's answer reads of its operation and of each attempt (ledger.selectors.call_detail),
# in the models' order, as `sql.columns(..., only=)` selects and `sql.load(..., only=)` reads them.
ANSWER_OPERATION_FIELDS = ("operation_id", "task", "arguments_hash", "idempotency_key", "risk_tier", "needs_approval",
                           "status", "attempt_count", "receipt", "result", "last_error", "created_at", "updated_at")
ANSWER_ATTEMPT_FIELDS = ("id", "number", "started_at", "finished_at", "fact", "error_class", "error_code",
                         "latency_ms", "stale")


def _then_call_ids(before: int, number: int) -> str:
    """After a SELECT of `before` values (an attempt's among them, its number the `number`th):
    the operation's call IDs, one row each, in `before` NULLs and (call_id, created_at, id), the
    rows above having NULL there; attempts in their order, calls in theirs. Two branches only,
    so PostgreSQL types each NULL column by the other branch."""
    nulls = "NULL, " * before
    return (f" UNION ALL SELECT {nulls}{_col(Call, 'call_id', 'c')}, {_col(Call, 'created_at', 'c')}, "
            f"{_col(Call, 'pk', 'c')} FROM {sql.table(Call)} c WHERE {_col(Call, 'operation', 'c')} = %s "
            f"ORDER BY {number}, {before + 2}, {before + 3}")


_OPERATION_WIDTH = sql.width(Operation, only=ANSWER_OPERATION_FIELDS)
_ATTEMPT_WIDTH = sql.width(Attempt, only=ANSWER_ATTEMPT_FIELDS)
_ATTEMPT_NUMBER = ANSWER_ATTEMPT_FIELDS.index("number") + 1

# A call's answer, in one statement: the operation's columns the answer reads, its tool's name,
# its step's ID and its task's version, once per attempt (once with NULLs without one), then its
# call IDs (`_then_call_ids`). Parameters: the operation id, twice.
ANSWER_SQL = (
    f"SELECT {sql.columns(Operation, 'o', only=ANSWER_OPERATION_FIELDS)}, {_col(Tool, 'name', 't')}, "
    f"{_col(Step, 'step_id', 's')}, {_col(Task, 'version', 'k')}, "
    f"{sql.columns(Attempt, 'a', only=ANSWER_ATTEMPT_FIELDS)}, NULL, NULL, NULL "
    f"FROM {sql.table(Operation)} o "
    f"JOIN {sql.table(Tool)} t ON {_col(Tool, 'pk', 't')} = {_col(Operation, 'tool', 'o')} "
    f"JOIN {sql.table(Step)} s ON {_col(Step, 'pk', 's')} = {_col(Operation, 'step', 'o')} "
    f"JOIN {sql.table(Task)} k ON {_col(Task, 'pk', 'k')} = {_col(Operation, 'task', 'o')} "
    f"LEFT JOIN {sql.table(Attempt)} a ON {_col(Attempt, 'operation', 'a')} = {_col(Operation, 'pk', 'o')} "
    f"WHERE {_col(Operation, 'pk', 'o')} = %s"
    + _then_call_ids(_OPERATION_WIDTH + 3 + _ATTEMPT_WIDTH, _OPERATION_WIDTH + 3 + _ATTEMPT_NUMBER)
)

# An operation read already (with its tool, step and task): its attempts, then its call IDs
# (`_then_call_ids`). Parameters: the operation id, twice.
HISTORY_SQL = (
    f"SELECT {sql.columns(Attempt, 'a', only=ANSWER_ATTEMPT_FIELDS)}, NULL, NULL, NULL "
    f"FROM {sql.table(Attempt)} a WHERE {_col(Attempt, 'operation', 'a')} = %s"
    + _then_call_ids(_ATTEMPT_WIDTH, _ATTEMPT_NUMBER)
)

# What a proposal that waited answers (ledger.api._as_now): its operation's status and result as
# they are now, read as `sql.load(..., only=NOW_FIELDS)` reads them. Parameter: the operation id.
NOW_FIELDS = ("operation_id", "status", "result")
NOW_SQL = (f"SELECT {sql.columns(Operation, 'o', only=NOW_FIELDS)} FROM {sql.table(Operation)} o "
           f"WHERE {_col(Operation, 'pk', 'o')} = %s")


SHAPES = {
    "claim_sql": sql.Shape(
        tables={"o": Operation, "f": Operation, "t": Tool, "k": Task, "a": AgentPrincipal, "n": Tenant,
                "c": ToolCircuit, "g": PolicyGeneration},
        params=((Operation, "status"), (Operation, "operation_id")),
        loads=(Operation, Tool, Task, AgentPrincipal, Tenant, ToolCircuit), scalars=3),
    "BUSINESS_KEY_BUSY_SQL": sql.Shape(
        tables={"": Operation},
        params=((Operation, "tool"), (Operation, "business_key"), (Operation, "status"), (Operation, "status"),
                (Operation, "operation_id")), scalars=1),
    "STILL_MINE_SQL": sql.Shape(
        tables={"": Operation},
        params=((Operation, "operation_id"), (Operation, "status"), (Operation, "fencing_token")), scalars=1),
    "RECEIVES_WEBHOOKS_SQL": sql.Shape(
        tables={"": AgentPrincipal}, params=((AgentPrincipal, "pk"),), scalars=1),
    "lease_sql": sql.Shape(
        tables={"l": Lease, "t": Task}, params=((Lease, "task"), (Task, "tenant")), loads=(Lease,)),
    "task_sql": sql.Shape(
        tables={"t": Task, "n": Tenant, "c": Call, "o": Operation, "g": PolicyGeneration},
        params=((Call, "call_id"), (Operation, "operation_id"), (Task, "task_id"), (Task, "tenant")),
        loads=(Task, Tenant), scalars=3, only={Task: PROPOSAL_TASK_FIELDS}),
    "task_for_claim_sql": sql.Shape(
        tables={"t": Task, "n": Tenant, "a": AgentPrincipal, "r": ToolCircuit, "c": Call, "o": Operation,
                "f": Operation, "u": Tool, "g": PolicyGeneration},
        params=((Call, "call_id"), (Operation, "operation_id"), (Operation, "status"), (AgentPrincipal, "pk"),
                (Tool, "name"), (Task, "task_id"), (Task, "tenant")),
        loads=(Task, Tenant, AgentPrincipal, ToolCircuit), scalars=5, only={Task: PROPOSAL_TASK_FIELDS}),
    "AUTHORITY_MOVED_SQL": sql.Shape(
        tables={"a": AgentPrincipal, "g": PolicyGeneration},
        params=((AgentPrincipal, "pk"), None, (PolicyGeneration, "token")), scalars=1,
        vendors=frozenset({"postgresql"})),
    "ANSWER_SQL": sql.Shape(
        tables={"o": Operation, "t": Tool, "s": Step, "k": Task, "a": Attempt, "c": Call},
        params=((Operation, "operation_id"), (Call, "operation")), scalars=_OPERATION_WIDTH + 3 + _ATTEMPT_WIDTH + 3),
    "NOW_SQL": sql.Shape(
        tables={"o": Operation}, params=((Operation, "operation_id"),), scalars=sql.width(Operation, only=NOW_FIELDS)),
    "HISTORY_SQL": sql.Shape(
        tables={"a": Attempt, "c": Call}, params=((Attempt, "operation"), (Call, "operation")),
        scalars=_ATTEMPT_WIDTH + 3),
}
