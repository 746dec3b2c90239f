"""What a run's model calls cost: the spans' GenAI usage (`gen_ai.usage.input_tokens`/
`output_tokens`) times the `ModelPrice` in force for that model, tenant and moment. Computed
when read, so a corrected price corrects every page at once; nothing is stored on spans."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from django.db.models import Q, Sum
from django.db.models.functions import TruncHour

from runs.models import ModelPrice

MILLION = Decimal(1_000_000)


class PriceBook:
    """The prices that may apply to some tenants, loaded once per page."""

    def __init__(self, prices: Iterable[ModelPrice]) -> None:
        self._rows: dict[tuple[int | None, str], list[ModelPrice]] = defaultdict(list)
        for price in prices:
            self._rows[(price.tenant_id, price.model)].append(price)
        for rows in self._rows.values():
            rows.sort(key=lambda p: p.valid_from, reverse=True)

    @classmethod
    def for_tenants(cls, tenant_ids: Iterable[int]) -> PriceBook:
        return cls(ModelPrice.objects.filter(Q(tenant__isnull=True) | Q(tenant_id__in=list(tenant_ids))))

    def price(self, *, tenant_id: int | None, model: str, at: datetime) -> ModelPrice | None:
        """The tenant's own price if one is in force, else the list price in force."""
        for scope in (tenant_id, None):
            for price in self._rows.get((scope, model), ()):
                if price.valid_from <= at:
                    return price
        return None

    def cost(self, *, tenant_id: int | None, request_model: str, response_model: str, at: datetime,
             input_tokens: int | None, output_tokens: int | None) -> tuple[str, Decimal] | None:
        """(currency, amount) for one span's usage, or None when it has no usage or no price.
        The response model (the one that answered) is priced first, then the requested one."""
        if input_tokens is None and output_tokens is None:
            return None
        for model in (response_model, request_model):
            price = self.price(tenant_id=tenant_id, model=model, at=at) if model else None
            if price is not None:
                amount = ((input_tokens or 0) * price.input_per_million
                          + (output_tokens or 0) * price.output_per_million) / MILLION
                return price.currency, amount
        return None


def spans_cost(spans, tenant_ids: Iterable[int]) -> dict[str, Decimal]:
    """What these spans' model calls cost, per currency. Usage is summed per model and hour in
    SQL and priced at the hour's start (the run page prices each span at its own start)."""
    book = PriceBook.for_tenants(tenant_ids)
    usage = (spans.exclude(input_tokens=None, output_tokens=None)
             .values("tenant_id", "gen_ai_model", "gen_ai_response_model", hour=TruncHour("start_time"))
             .annotate(i=Sum("input_tokens"), o=Sum("output_tokens")).order_by())
    totals: dict[str, Decimal] = {}
    for row in usage:
        cost = book.cost(tenant_id=row["tenant_id"], request_model=row["gen_ai_model"],
                         response_model=row["gen_ai_response_model"], at=row["hour"],
                         input_tokens=row["i"], output_tokens=row["o"])
        if cost is not None:
            totals[cost[0]] = totals.get(cost[0], Decimal(0)) + cost[1]
    return totals


def format_money(amounts: dict[str, Decimal]) -> str:
    """'USD 0.0123', several currencies side by side; '—' for none."""
    if not amounts:
        return "—"
    parts = []
    for currency, amount in sorted(amounts.items()):
        shown = f"{amount:.4f}" if amount >= Decimal("0.0001") or amount == 0 else "<0.0001"
        parts.append(f"{currency} {shown}")
    return " + ".join(parts)


@dataclass
class Usage:
    """Spans, errors, tokens, cost and wall-clock latency of a set of spans (a step, a run)."""

    spans: int = 0
    errors: int = 0
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost: dict[str, Decimal] = field(default_factory=dict)
    unpriced_tokens: int = 0  # tokens of spans whose model has no price: the cost is a lower bound
    start: float | None = None  # ms since 1970
    end: float | None = None

    def add(self, *, start: float, end: float, error: bool, input_tokens: int | None,
            output_tokens: int | None, cost: tuple[str, Decimal] | None) -> None:
        self.spans += 1
        self.errors += int(error)
        self.start = start if self.start is None else min(self.start, start)
        self.end = end if self.end is None else max(self.end, end)
        if input_tokens is not None:
            self.input_tokens = (self.input_tokens or 0) + input_tokens
        if output_tokens is not None:
            self.output_tokens = (self.output_tokens or 0) + output_tokens
        if cost is not None:
            currency, amount = cost
            self.cost[currency] = self.cost.get(currency, Decimal(0)) + amount
        elif input_tokens is not None or output_tokens is not None:
            self.unpriced_tokens += (input_tokens or 0) + (output_tokens or 0)

    @property
    def latency_ms(self) -> float | None:
        """From the first span's start to the last span's end: nested spans overlap, so the sum
        of their durations would count the same time more than once."""
        if self.start is None or self.end is None:
            return None
        return self.end - self.start

    @property
    def cost_display(self) -> str:
        return format_money(self.cost)
