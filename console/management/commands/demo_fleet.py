"""The demo agent fleet: a process that uses the agent API like any agent would (HTTP, bearer
token), so a newcomer sees every path — auto-dispatched calls, one and two approvals,
injected faults that end unknown and get reconciled or handed to support."""

from __future__ import annotations

import random
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
from django.conf import settings
from django.core.management.base import BaseCommand
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

TERMINAL_CALL = {"confirmed", "failed", "rejected", "expired", "cancelled", "manual", "compensation_required", "compensated"}

# (weight, scenario). Amounts pick the tier: ≤ 50 → L1, ≤ 200 → L3, > 200 → L4.
SCENARIOS = [
    (5, "refund_small"),
    (3, "refund_reviewed"),
    (1, "refund_two_approvals"),
    (3, "contract_email"),
    (1, "refund_fault_timeout"),
    (1, "refund_fault_429"),
    (1, "refund_fault_5xx_after_commit"),
    (1, "email_fault_lost_reply"),
]
RARE = [(1, "refund_fault_opaque")]


def make_tracer(url: str, token: str):
    """The fleet traces itself like any agent would: an OpenTelemetry SDK exporting OTLP/HTTP to
    Countersign's /v1/traces with its bearer token, spans linked by countersign.* attributes."""
    provider = TracerProvider(resource=Resource.create({"service.name": "demo-agent-fleet"}))
    exporter = OTLPSpanExporter(endpoint=f"{url.rstrip('/')}/v1/traces",
                                headers={"Authorization": f"Bearer {token}"}, compression=Compression.Gzip)
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=1000))
    return provider, provider.get_tracer("countersign.demo_fleet")


class FleetAgent:
    def __init__(self, client: httpx.Client, name: str, log, tracer=None, waiting_for_person=None) -> None:
        self.client = client
        self.name = name
        self.log = log
        self.tracer = tracer
        # Called when a call waits for a reviewer: the fleet lets another task start meanwhile.
        self.waiting_for_person = waiting_for_person or (lambda: None)

    def think(self, task_id: str, step_id: str, prompt_tokens: int) -> None:
        """A stand-in for the model call that decides the next step."""
        if self.tracer is None:
            return
        with self.tracer.start_as_current_span("chat demo-model") as span:
            span.set_attributes({
                "gen_ai.operation.name": "chat", "gen_ai.request.model": "demo-model",
                "gen_ai.usage.input_tokens": prompt_tokens, "gen_ai.usage.output_tokens": random.randint(20, 120),
                "countersign.task_id": task_id, "countersign.step_id": step_id,
            })
            time.sleep(random.uniform(0.05, 0.3))

    def propose(self, task_id: str, call: dict) -> dict:
        if self.tracer is None:
            return self.post(f"/api/v1/tasks/{task_id}/calls", call)
        with self.tracer.start_as_current_span(f"execute_tool {call['tool']}") as span:
            span.set_attributes({
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call["tool"],
                "gen_ai.tool.call.id": call["call_id"], "countersign.task_id": task_id,
                "countersign.step_id": call["step_id"],
            })
            answer = self.post(f"/api/v1/tasks/{task_id}/calls", call)
            if answer.get("operation_id"):
                span.set_attribute("countersign.operation_id", answer["operation_id"])
            return answer

    def post(self, path: str, payload: dict) -> dict:
        response = self.client.post(path, json=payload)
        if response.status_code >= 400:
            raise RuntimeError(f"{path}: {response.status_code} {response.text[:300]}")
        return response.json()

    def run(self, scenario: str) -> str:
        if self.tracer is None:
            return self._run(scenario, None)
        with self.tracer.start_as_current_span("invoke_agent demo") as root:
            root.set_attributes({"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": self.name})
            return self._run(scenario, root)

    def _run(self, scenario: str, root) -> str:
        tag = uuid.uuid4().hex[:8]
        order = f"ord-{tag}"
        amount = 30
        recipient = f"customer-{tag}@example.com"
        if scenario == "refund_reviewed":
            amount = random.choice([75, 120, 180])
        elif scenario == "refund_two_approvals":
            amount = random.choice([250, 400])
        elif scenario.startswith("refund_fault_"):
            fault = scenario.removeprefix("refund_").replace("_", "-")
            order = f"{fault}-{tag}"
            amount = 25
        elif scenario == "email_fault_lost_reply":
            recipient = f"fault-lost-reply-{tag}@example.com"
        is_mail = "email" in scenario
        task = self.post("/api/v1/tasks", {
            "task_type": "contract_email" if is_mail else "refund",
            "goal": f"Send the signed contract to {recipient}" if is_mail else f"Refund {amount} EUR on {order}",
            "inputs": {"order_id": order, "amount": amount, "recipient": recipient},
            "success_criteria": [{"kind": "mail_delivered", "to": [recipient]}] if is_mail
            else [{"kind": "refund_confirmed", "order_id": order, "amount": amount},
                  {"kind": "operation_confirmed", "tool": "orders.lookup", "arguments": {"order_id": order}},
                  # A reviewed refund also needs a person to confirm what no ledger holds.
                  *(["The customer was told about the refund"] if scenario == "refund_reviewed" else [])],
            "constraints": {"max_tool_calls": 5, "max_amount": 500},
            "versions": {"workflow": "demo-1", "model": "demo-model", "prompt": "v1"},
        })
        task_id = task["task_id"]
        if root is not None:
            root.set_attribute("countersign.task_id", task_id)
        lease = self.post(f"/api/v1/tasks/{task_id}/lease", {"owner": self.name, "ttl_seconds": 300})
        token = lease["fencing_token"]
        version = task["version"]
        for to in ("planning", "running"):
            version = self.post(f"/api/v1/tasks/{task_id}/transition",
                                {"to": to, "expected_version": version, "fencing_token": token})["version"]
        self.think(task_id, "plan", prompt_tokens=random.randint(400, 900))
        if not is_mail:
            lookup = self.propose(task_id, {
                "call_id": f"call-lookup-{tag}", "step_id": "lookup", "tool": "orders.lookup",
                "arguments": {"order_id": order}, "expected_version": version, "fencing_token": token})
            self.wait(lookup["call_id"], task_id)
            call = {"call_id": f"call-refund-{tag}", "step_id": "refund", "tool": "payments.refund",
                    "arguments": {"order_id": order, "amount": amount, "currency": "EUR",
                                  "reason": "Customer returned the goods"}}
        else:
            call = {"call_id": f"call-mail-{tag}", "step_id": "send-contract", "tool": "mail.send",
                    "arguments": {"to": [recipient], "subject": "Your signed contract",
                                  "body": "Hello,\n\nplease find your countersigned contract attached.\n\nAcme"}}
        self.think(task_id, call["step_id"], prompt_tokens=random.randint(600, 1400))
        answer = self.propose(task_id, {**call, "expected_version": version, "fencing_token": token})
        outcome = answer["decision"]["outcome"]
        if outcome == "refused":
            return f"{scenario}: refused"
        if outcome == "awaiting_approval":
            self.waiting_for_person()
        final = self.wait(answer["call_id"], task_id)
        current = self.client.get(f"/api/v1/tasks/{task_id}").json()
        version = current["version"]
        if current["status"] == "waiting_approval":
            version = self.post(f"/api/v1/tasks/{task_id}/transition",
                                {"to": "running", "expected_version": version, "fencing_token": token})["version"]
        if final == "confirmed":
            self.post(f"/api/v1/tasks/{task_id}/transition", {
                "to": "verifying", "expected_version": version, "fencing_token": token,
                "evidence": {"operation_id": answer["operation_id"]}})
        elif final in {"failed", "rejected", "expired", "cancelled"}:
            self.post(f"/api/v1/tasks/{task_id}/transition",
                      {"to": "failed", "expected_version": version, "fencing_token": token,
                       "evidence": {"operation_id": answer["operation_id"], "status": final}})
        return f"{scenario}: {final}"

    def wait(self, call_id: str, task_id: str, *, budget: float = 600) -> str:
        deadline = time.monotonic() + budget
        status = ""
        while time.monotonic() < deadline:
            response = self.client.get(f"/api/v1/calls/{call_id}", params={"wait": 20, "task_id": task_id},
                                       timeout=30)
            status = response.json().get("status", "")
            if status in TERMINAL_CALL:
                return status
        return status or "timeout"


class Command(BaseCommand):
    help = "Run demo agents against the agent API at a gentle rate."

    def add_arguments(self, parser):
        parser.add_argument("--url", default=f"http://127.0.0.1:{settings.PORT}")
        parser.add_argument("--token", default=settings.DEMO_AGENT_TOKEN)
        parser.add_argument("--interval", type=float, default=4.0, help="Seconds between new tasks.")
        parser.add_argument("--agents", type=int, default=6, help="Tasks at work at most.")
        parser.add_argument("--waiting", type=int, default=30,
                            help="Tasks waiting for a reviewer at most (they do not hold an agent's place).")
        parser.add_argument("--count", type=int, default=0, help="Stop after this many tasks (0: run forever).")

    def handle(self, *args, url: str, token: str, interval: float, agents: int, waiting: int, count: int,
               **options):
        client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        provider, tracer = make_tracer(url, token)
        # A task waiting for a reviewer gives its place to a new one (up to --waiting of them):
        # nobody approving in a fresh `make run` must not stop the fleet after a few tasks.
        slots = threading.BoundedSemaphore(agents)
        waiting_places = threading.BoundedSemaphore(waiting)
        started = 0

        def one(n: int, scenario: str) -> None:
            place = [slots]

            def waiting_for_person() -> None:
                if place[0] is slots and waiting_places.acquire(blocking=False):
                    place[0] = waiting_places
                    slots.release()

            try:
                agent = FleetAgent(client, f"fleet-{n}", self.stdout.write, tracer, waiting_for_person)
                self.stdout.write(f"[fleet] task {n} {agent.run(scenario)}")
            except Exception as exc:  # keep the fleet going; the error is printed, not swallowed
                self.stderr.write(f"[fleet] task {n} {scenario} stopped: {exc}")
            finally:
                place[0].release()

        weighted = [s for w, s in SCENARIOS for _ in range(w)]
        try:
            with ThreadPoolExecutor(max_workers=agents + waiting) as pool:
                while not count or started < count:
                    slots.acquire()
                    started += 1
                    scenario = random.choice(RARE)[1] if random.random() < 0.03 else random.choice(weighted)
                    pool.submit(one, started, scenario)
                    time.sleep(interval * random.uniform(0.5, 1.5))
        finally:
            provider.shutdown()  # flush the spans still queued
