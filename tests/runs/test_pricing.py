"""Model prices: list price, a tenant's own price, price changes over time, exact model names."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from runs.models import ModelPrice
from runs.pricing import PriceBook, Usage, format_money

pytestmark = pytest.mark.django_db

JAN = datetime(2026, 1, 1, tzinfo=UTC)


def price(model: str, inp: str, out: str, *, tenant=None, currency: str = "USD", valid_from=JAN) -> ModelPrice:
    return ModelPrice.objects.create(tenant=tenant, model=model, input_per_million=Decimal(inp),
                                     output_per_million=Decimal(out), currency=currency, valid_from=valid_from)


def cost(book: PriceBook, tenant, model: str, *, response: str = "", at=JAN + timedelta(days=10),
         inp: int | None = 1000, out: int | None = 500):
    return book.cost(tenant_id=tenant.id, request_model=model, response_model=response, at=at,
                     input_tokens=inp, output_tokens=out)


def test_the_list_price_applies_to_every_tenant(tenant, other_tenant):
    price("gpt-x", "3", "15")
    book = PriceBook.for_tenants([tenant.id, other_tenant.id])
    # 1,000 × 3/1M + 500 × 15/1M = 0.003 + 0.0075
    assert cost(book, tenant, "gpt-x") == ("USD", Decimal("0.0105"))
    assert cost(book, other_tenant, "gpt-x") == ("USD", Decimal("0.0105"))


def test_a_tenants_own_price_wins_for_that_tenant_only(tenant, other_tenant):
    price("gpt-x", "3", "15")
    price("gpt-x", "1", "5", tenant=tenant, currency="EUR")
    book = PriceBook.for_tenants([tenant.id, other_tenant.id])
    assert cost(book, tenant, "gpt-x") == ("EUR", Decimal("0.0035"))
    assert cost(book, other_tenant, "gpt-x") == ("USD", Decimal("0.0105"))


def test_a_new_price_does_not_reprice_earlier_spans(tenant):
    price("gpt-x", "3", "15")
    price("gpt-x", "6", "30", valid_from=JAN + timedelta(days=20))
    book = PriceBook.for_tenants([tenant.id])
    assert cost(book, tenant, "gpt-x", at=JAN + timedelta(days=19))[1] == Decimal("0.0105")
    assert cost(book, tenant, "gpt-x", at=JAN + timedelta(days=21))[1] == Decimal("0.0210")
    assert cost(book, tenant, "gpt-x", at=JAN - timedelta(days=1)) is None  # before any price


def test_the_model_that_answered_is_priced_before_the_one_requested(tenant):
    price("gpt-x", "3", "15")
    price("gpt-x-2026-01-05", "2", "10")
    book = PriceBook.for_tenants([tenant.id])
    assert cost(book, tenant, "gpt-x", response="gpt-x-2026-01-05")[1] == Decimal("0.0070")
    assert cost(book, tenant, "gpt-x", response="gpt-x-2099-01-01")[1] == Decimal("0.0105")  # unpriced snapshot


def test_model_names_match_exactly_never_by_prefix(tenant):
    price("gpt-x", "3", "15")
    book = PriceBook.for_tenants([tenant.id])
    assert cost(book, tenant, "gpt-x-mini") is None
    assert cost(book, tenant, "GPT-X") is None


def test_a_span_without_usage_has_no_cost(tenant):
    price("gpt-x", "3", "15")
    book = PriceBook.for_tenants([tenant.id])
    assert cost(book, tenant, "gpt-x", inp=None, out=None) is None
    assert cost(book, tenant, "gpt-x", inp=None, out=1000) == ("USD", Decimal("0.015"))


def test_usage_adds_costs_per_currency_and_counts_unpriced_tokens():
    usage = Usage()
    kw = dict(start=1000.0, end=1040.0, error=False)
    usage.add(**kw, input_tokens=10, output_tokens=5, cost=("USD", Decimal("0.5")))
    usage.add(**kw, input_tokens=10, output_tokens=None, cost=("USD", Decimal("0.25")))
    usage.add(**kw, input_tokens=7, output_tokens=3, cost=None)
    usage.add(start=1100.0, end=1150.0, error=True,
              input_tokens=None, output_tokens=None, cost=("EUR", Decimal("0.00001")))
    assert (usage.spans, usage.errors, usage.input_tokens, usage.output_tokens) == (4, 1, 27, 8)
    assert usage.unpriced_tokens == 10
    assert usage.latency_ms == 150  # wall clock, not the sum of the durations (40+40+40+50)
    assert usage.cost_display == "EUR <0.0001 + USD 0.7500"
    assert format_money({}) == "—" and Usage().latency_ms is None


def test_the_demo_price_is_installed_once():
    from runs.defaults import ensure_demo_prices

    ensure_demo_prices()
    ensure_demo_prices()
    assert ModelPrice.objects.filter(model="demo-model", tenant=None).count() == 1
